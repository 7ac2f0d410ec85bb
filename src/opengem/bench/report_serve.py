"""The "Serving latency" section of ``opengem report``: a run folder's ``serve_bench.json`` as a table.

``opengem bench serve --model RUN`` writes ``RUN/serve_bench.json``; a report of that run shows it beside
training and evaluation, so a model's quality and its serving cost are read on one page. A file that is
missing is no section; one that cannot be read is a note, never a failed report.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from opengem.bench import report_html as H

SERVE_BENCH = "serve_bench.json"
COLUMNS = ["backend", "phase", "candidates", "clients", "requests", "errors", "requests_per_s", "p50_ms",
           "p95_ms", "p99_ms"]


def serve_section(run_paths: list[tuple[str, Path]]) -> str | None:
    """HTML for every (name, folder) with a serve_bench.json; None when no run has one."""
    parts = []
    for name, path in run_paths:
        f = Path(path) / SERVE_BENCH
        if not f.is_file():
            continue
        try:
            result = json.loads(f.read_text())
            parts.append(_one(name, result))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            parts.append(H.note(f"{name}: {SERVE_BENCH} unreadable ({type(e).__name__}: {e}); skipped"))
    return "\n".join(parts) if parts else None


def _one(name: str, r: dict[str, Any]) -> str:
    pin = r.get("pinning")
    pins = (f"server on CPU {','.join(map(str, pin['server_cpus']))}, clients on "
            f"{','.join(map(str, pin['client_cpus']))}" if pin else "server and clients not pinned")
    out = [f"<h3>{H.esc(name)}</h3>",
           f'<p class="muted">loopback, {H.esc(r.get("body_format", "json"))} bodies, model '
           f'{H.esc(r.get("model"))} ({H.esc(r.get("served_version"))}), {H.esc(pins)}, '
           f"server threads {H.esc(r.get('server_threads'))}, at most {H.esc(r.get('max_requests'))} "
           f"requests or {H.esc(r.get('duration_s'))} s per cell; load average "
           f"{H.esc(r.get('load_average_before'))} -> {H.esc(r.get('load_average_after'))}</p>"]
    header = ["backend", "phase", "candidates", "clients", "requests", "errors", "req/s", "p50 ms", "p95 ms",
              "p99 ms"]
    out.append(H.table(header, [[c.get(k) for k in COLUMNS] for c in r["cells"]], left_cols=2, digits=3))
    for s in r.get("swaps", []):
        swapped = len([v for v in s["swapped_to"] if not str(v).startswith("refused")])
        out.append(f"<p>swap ({H.esc(s['backend'])}): {s['versions_published']} versions published, "
                   f"{swapped} swapped in, {s['requests']} requests, {s['errors']} errors</p>")
    if r.get("command"):
        out.append(f'<p class="muted">command: {H.esc(r["command"])}</p>')
    return "\n".join(out)
