"""``opengem report RUN [RUN ...] [--out FILE.html]``: one self-contained HTML page of runs and sweeps.

One run gives its own page; several give a comparison page (curves overlaid, metrics side by side,
config differences). A study folder of ``opengem scale`` (a sweep's scaling.csv / fits.json / scaling.png,
an iso-FLOP study's isoflop_runs.csv / isoflop.json, an ablation's ablation_runs.csv / ablation.json) adds a
scaling section. Plots are matplotlib PNGs inlined as base64, there are no scripts and no external assets, so
the page opens from disk, in CI artefacts or mail, with no server.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
from pathlib import Path
from typing import Any

from opengem.bench import report_html as H
from opengem.bench import report_plots as P
from opengem.bench.report_data import (
    ReportError,
    RunData,
    SweepData,
    load_inputs,
    metric_keys,
)
from opengem.bench.report_serve import serve_section
from opengem.config import flatten_dict
from opengem.data.commit import atomic_write_text
from opengem.errors import UsageError

MADE_BY = "by opengem report from"  # every page's subtitle: tells an earlier report from a user's file
SECTIONS = ("overview", "curves", "metrics", "calibration", "throughput", "config", "scaling")
MEMORY_HINTS = ("mem", "rss")
SUMMARY_GROUPS = ("startup", "compile", "parallel", "memory")
MAX_CSV_ROWS = 1000


# --------------------------------------------------------------------------- sections
def _overview(runs: list[RunData], sweeps: list[SweepData]) -> str:
    rows = []
    for r in runs:
        s = r.summary or {}
        rows.append([r.name, "run", r.model, s.get("steps"), "yes" if r.eval else "no", str(r.path)])
    for sw in sweeps:
        rows.append([sw.name, "scaling sweep", "-", len(sw.csv_rows), "-", str(sw.path)])
    out = H.table(["name", "kind", "model", "steps / points", "eval.json", "folder"], rows, left_cols=3)
    for r in runs + sweeps:  # type: ignore[operator]
        for n in r.notes:
            out += H.note(f"{r.name}: {n}")
    return out


def _curves(runs: list[RunData]) -> str:
    out = []
    loss: dict[str, tuple[list[float], list[float]]] = {}
    for r in runs:
        tr = [x for x in r.kind("train") if isinstance(x.get("loss"), (int, float))]
        if tr:
            loss[f"{r.name} train" if len(runs) > 1 else "train"] = (
                [x["step"] for x in tr], [x["loss"] for x in tr])
        ev = [x for x in r.kind("eval") if isinstance(x.get("loss"), (int, float))]
        if ev:
            loss[f"{r.name} eval" if len(runs) > 1 else "eval"] = (
                [x["step"] for x in ev], [x["loss"] for x in ev])
    if loss:
        out.append(H.img(P.line_plot(loss, "loss (masked BCE, task-weighted)", "step", "loss"), "loss curve"))
    else:
        out.append(H.note("no training loss recorded (metrics.jsonl missing or empty)"))

    per_run = {r.name: _ne_series(r.kind("eval"), metric_keys([x.get("metrics", {}) for x in r.kind("eval")]))
               for r in runs}
    keys = metric_keys(list(per_run.values()))
    if not keys:
        out.append(H.note("no evaluation records in metrics.jsonl: no NE curve"))
    elif max(len(x) for s in per_run.values() for x, _ in s.values()) < 2:
        # one evaluation per run (the final one): a curve of single points says little, bars compare better
        bars = {n: [s[k][1][-1] if k in s else None for k in keys] for n, s in per_run.items()}
        oracle = next((r.oracle() for r in runs if r.oracle()), {})
        if oracle:
            bars["oracle NE"] = [oracle.get(k) for k in keys]
        title = "NE at the last evaluation (set train.eval_every for curves)"
        out.append(H.img(P.grouped_bars(keys, bars, title, "NE (lower is better)", hline=1.0),
                         "NE per surface/task"))
    elif len(runs) == 1:
        out.append(H.img(P.line_plot(next(iter(per_run.values())), "NE per surface/task", "step",
                                     "NE (lower is better)", hline=1.0), "NE curve"))
    else:
        for k in [k for k in keys if k.startswith("all/")] or keys:
            series = {n: s[k] for n, s in per_run.items() if k in s}
            out.append(H.img(P.line_plot(series, f"NE {k}", "step", "NE (lower is better)", hline=1.0),
                             f"NE curve {k}"))
    return "\n".join(out)


def _ne_series(evals: list[dict[str, Any]], keys: list[str]) -> dict[str, tuple[list[float], list[float]]]:
    series = {}
    for k in keys:
        pts = [(e["step"], e["metrics"][k].get("ne")) for e in evals
               if isinstance(e.get("metrics"), dict) and isinstance(e["metrics"].get(k), dict)]
        pts = [(s, v) for s, v in pts if isinstance(v, (int, float))]
        if pts:
            series[k] = ([p[0] for p in pts], [p[1] for p in pts])
    return series


def _metrics(runs: list[RunData]) -> str:
    out = []
    finals = {r.name: r.final_metrics() for r in runs}
    have = {n: m for n, (m, _) in finals.items() if m}
    for r in runs:
        m, src = finals[r.name]
        if not m:
            out.append(H.note(f"{r.name}: no evaluation (no eval.json and no final evaluation in "
                              f"train_summary.json); run `opengem evaluate --run {r.path}`"))
        elif src != "eval.json":
            out.append(H.note(f"{r.name}: no eval.json; metrics from {src}"))
    if not have:
        return "\n".join(out)
    keys = metric_keys(list(have.values()))
    oracle = next((r.oracle() for r in runs if r.oracle()), {})
    if len(runs) == 1:
        m = next(iter(have.values()))
        header = ["surface/task", "rows", "base rate", "NE", "AUC", "calibration"]
        rows = [[k, m[k].get("rows"), m[k].get("base_rate"), m[k].get("ne"), m[k].get("auc"),
                 m[k].get("calibration")] for k in keys if k in m]
        if oracle:
            header.append("oracle NE")
            for row in rows:
                row.append(oracle.get(row[0]))
        out.append(H.table(header, rows))
    else:
        for metric, label in (("ne", "NE (lower is better)"), ("auc", "AUC"), ("calibration", "calibration")):
            header = ["surface/task", *have]
            rows = [[k, *(have[n].get(k, {}).get(metric) for n in have)] for k in keys]
            if metric == "ne" and oracle:
                header.append("oracle NE")
                for row in rows:
                    row.append(oracle.get(row[0]))
            out.append(f"<h3>{H.esc(label)}</h3>" + H.table(header, rows))
    base = next((r.eval.get("ne_base_rate") for r in runs if r.eval and r.eval.get("ne_base_rate")), None)
    if base:
        out.append(f'<p class="muted">{H.esc(base)}. Calibration = mean prediction / observed rate '
                   "(1.0 is calibrated).</p>")
    return "\n".join(out)


def _calibration(runs: list[RunData]) -> str:
    out = []
    with_rel = [r for r in runs if r.reliability]
    for r in with_rel:
        out.append(H.img(P.reliability_plot(r.reliability, f"reliability: {r.name}"),
                         f"reliability curve {r.name}"))
    have = {r.name: m for r in runs if r not in with_rel for m in [r.final_metrics()[0]] if m}
    if have:
        keys = metric_keys(list(have.values()))
        bars = {n: [m.get(k, {}).get("calibration") for k in keys] for n, m in have.items()}
        out.append(H.img(P.grouped_bars(keys, bars, "calibration = mean prediction / observed rate",
                                        "calibration (1.0 ideal)", hline=1.0), "calibration ratio"))
        out.append('<p class="muted">No predictions.parquet in the run folder, so no reliability curve: '
                   "the ratio per surface/task is shown instead.</p>")
    if not out:
        out.append(H.note("no evaluation: nothing to show"))
    return "\n".join(out)


def _memory_items(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in flatten_dict(d).items() if any(h in k.lower() for h in MEMORY_HINTS)
            and isinstance(v, (int, float)) and not isinstance(v, bool)}


def _throughput(runs: list[RunData]) -> str:
    out = []
    rows = []
    mem_cols: list[str] = []
    for r in runs:
        for k in _memory_items(r.summary or {}):
            if k not in mem_cols:
                mem_cols.append(k)
    for r in runs:
        s = r.summary or {}
        setup = (r.kind("setup") or [{}])[0]
        flops = s.get("flops_per_example") or setup.get("flops_per_example")
        eps = s.get("examples_per_s")
        known = isinstance(flops, (int, float)) and isinstance(eps, (int, float))
        gflops = flops * eps * 3 / 1e9 if known else None
        mem = _memory_items(s)
        rows.append([r.name, r.model, s.get("device") or setup.get("device"), setup.get("world_size"),
                     s.get("steps"), s.get("examples"), s.get("train_seconds"), eps, flops, gflops,
                     setup.get("dense_params"), setup.get("embedding_params"),
                     *(mem.get(k) for k in mem_cols)])
    out.append(H.table(["run", "model", "device", "world", "steps", "examples", "train s", "examples/s",
                        "fwd FLOP/example", "≈train GFLOP/s (3×fwd)", "dense params", "embedding params",
                        *mem_cols], rows, left_cols=3, digits=2))
    series = {}
    mem_series: dict[str, tuple[list[float], list[float]]] = {}
    for r in runs:
        tr = [x for x in r.kind("train") if isinstance(x.get("examples_per_s"), (int, float))]
        if tr:
            series[r.name] = ([x["step"] for x in tr], [x["examples_per_s"] for x in tr])
        for x in r.kind("train"):
            for k, v in _memory_items(x).items():
                xs, ys = mem_series.setdefault(f"{r.name} {k}" if len(runs) > 1 else k, ([], []))
                xs.append(x["step"])
                ys.append(v)
    if series:
        out.append(H.img(P.line_plot(series, "training throughput (per log window)", "step", "examples/s"),
                         "throughput"))
    if mem_series:
        out.append(H.img(P.line_plot(mem_series, "memory", "step", "value as logged"), "memory"))
    if not mem_cols and not mem_series:
        out.append('<p class="muted">Memory: not recorded by these runs (no memory fields in '
                   "train_summary.json or metrics.jsonl); `opengem bench` measures it.</p>")
    if not any(r.summary for r in runs):
        out.append(H.note("no train_summary.json: throughput unknown"))
    # what the trainer reports beside throughput: start-up, compile, parallelism, memory savers
    extra = {r.name: {k: v for k, v in flatten_dict({g: (r.summary or {}).get(g) for g in SUMMARY_GROUPS
                                                if isinstance((r.summary or {}).get(g), dict)}).items()
                      if not isinstance(v, (list, dict))} for r in runs}
    keys = list(dict.fromkeys(k for e in extra.values() for k in e))
    if keys:
        out.append("<h3>start-up, compile, parallelism, memory settings</h3>")
        out.append(H.table(["setting", *extra], [[k, *(extra[n].get(k) for n in extra)] for k in keys],
                           digits=3))
    return "\n".join(out)


def _config(runs: list[RunData]) -> str:
    out = []
    if len(runs) > 1:
        flat = {r.name: flatten_dict(r.config) for r in runs}
        keys = sorted({k for f in flat.values() for k in f})
        diff = [[k, *(json.dumps(flat[n].get(k)) if k in flat[n] else "(absent)" for n in flat)]
                for k in keys if len({json.dumps(f.get(k)) for f in flat.values()}) > 1]
        out.append("<h3>differences</h3>")
        out.append(H.table(["key", *flat], diff, left_cols=len(flat) + 1) if diff
                   else '<p class="muted">identical configs</p>')
    for r in runs:
        body = H.pre(r.config_text) if r.config_text is not None else H.note("no config.toml")
        if len(runs) > 1:
            out.append(f"<details><summary>{H.esc(r.name)}: config.toml</summary>{body}</details>")
        else:
            out.append(body)
    return "\n".join(out)


def _scaling(sweeps: list[SweepData]) -> str:
    out = []
    for sw in sweeps:
        out.append(f"<h3>{H.esc(sw.name)}</h3><p class=\"muted\">{H.esc(sw.path)}</p>")
        for n in sw.notes:
            out.append(H.note(n))
        for fname, png in sw.pngs.items():
            try:
                out.append(H.img(png, f"{sw.name} {fname}"))
            except ValueError:
                out.append(H.note(f"{fname}: not a PNG file; skipped"))
        if sw.csv_header:
            rows = [[_num(v) for v in row] for row in sw.csv_rows[:MAX_CSV_ROWS]]
            out.append(H.table(sw.csv_header, rows, left_cols=0))
            if len(sw.csv_rows) > MAX_CSV_ROWS:
                out.append(H.note(f"{sw.files[0]}: first {MAX_CSV_ROWS} of {len(sw.csv_rows)} rows shown"))
        if sw.fits is not None:
            out.append(f"<h3>{H.esc(sw.files[1])}</h3>")
            if isinstance(sw.fits, dict) and sw.fits:
                flat = {k: v for k, v in flatten_dict(sw.fits).items() if not isinstance(v, (list, dict))}
                out.append(H.table(["fit", "value"], [[k, _num(v)] for k, v in flat.items()]))
            out.append(f"<details><summary>{H.esc(sw.files[1])} (all of it)</summary>"
                       f"{H.pre(json.dumps(sw.fits, indent=2))}</details>")
        if sw.sweep_toml:
            out.append(f"<details><summary>{H.esc(sw.files[2])}</summary>{H.pre(sw.sweep_toml)}</details>")
        if sw.runs:
            out.append('<p class="muted">runs of this sweep (pass them to `opengem report` to compare): '
                       + H.esc(", ".join(sw.runs)) + "</p>")
    return "\n".join(out)


def _num(v: Any) -> Any:
    """CSV cells and JSON values as numbers where they are, so tables format them uniformly."""
    if isinstance(v, str):
        try:
            return int(v)
        except ValueError:
            try:
                return float(v)
            except ValueError:
                return v
    return v if isinstance(v, (int, float, str)) or v is None else json.dumps(v)


# --------------------------------------------------------------------------- page
def build_report(paths: list[str | Path]) -> str:
    """The HTML page for these run and sweep folders."""
    if not paths:
        raise ReportError("report: give at least one run or sweep folder")
    runs, sweeps = load_inputs(paths)
    names = [r.name for r in runs] + [s.name for s in sweeps]
    if len(runs) > 1:
        title = "opengem comparison: " + " vs ".join(r.name for r in runs)
    elif runs:
        title = f"opengem run: {runs[0].name}"
    else:
        title = "opengem scaling: " + ", ".join(names)
    sections: list[tuple[str, str, str]] = [("overview", "Overview", _overview(runs, sweeps))]
    if runs:
        sections += [
            ("curves", "Loss and NE curves", _curves(runs)),
            ("metrics", "NE / AUC / calibration per surface x task", _metrics(runs)),
            ("calibration", "Calibration", _calibration(runs)),
            ("throughput", "Throughput and memory", _throughput(runs)),
            ("config", "Resolved config", _config(runs)),
        ]
        serving = serve_section([(r.name, r.path) for r in runs])
        if serving:  # a run measured with `opengem bench serve`: before the config
            sections.insert(-1, ("serving", "Serving latency (opengem bench serve)", serving))
    if sweeps:
        sections.append(("scaling", "Scaling", _scaling(sweeps)))
    stamp = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    return H.page(title, f"generated {stamp} {MADE_BY} {', '.join(names)}", sections)


def default_out(paths: list[str | Path]) -> Path:
    """One folder: FOLDER/report.html beside its data; several: report.html here."""
    return Path(paths[0]) / "report.html" if len(paths) == 1 else Path("report.html")


def write_report(paths: list[str | Path], out: str | Path | None = None) -> Path:
    """Build the page and write it to ``out``; an existing ``out`` is replaced only when it is an earlier
    report (``--out RUN/metrics.jsonl`` replaced the run's log with HTML)."""
    out = Path(out) if out else default_out(paths)
    if out.is_dir():
        raise ReportError(f"--out {out}: is a folder; give the HTML file to write (e.g. {out / 'r.html'})")
    if out.is_file():
        try:
            head = out.read_bytes()[:65536].decode("utf-8", errors="replace")
        except OSError:
            head = ""
        if MADE_BY not in head:
            raise ReportError(f"--out {out}: exists and is not an opengem report; choose another file")
    text = build_report(paths)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, text)
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="RUN",
                   help="run folders (opengem train --out) and/or study folders of opengem scale")
    p.add_argument("--out", default=None,
                   help="HTML file (default: RUN/report.html for one folder, ./report.html for several)")


def run(args: argparse.Namespace) -> int:
    try:
        out = write_report(args.paths, args.out)
    except ReportError as e:  # every one names a folder given on the command line: a usage error (exit 2)
        raise UsageError(str(e)) from e
    print(f"wrote {out}  ({out.stat().st_size / 1024:.0f} KiB, self-contained; open it in a browser)")
    return 0
