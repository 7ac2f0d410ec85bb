"""The table of ``benchmarks/gpu_check.sh``: reads the JSON its parts left in OUT and prints one table.

    python benchmarks/gpu_check_table.py OUT
A part that failed or timed out is a row saying so (its log is named), never a missing line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def runs_of(obj: Any) -> dict[str, dict]:
    """model -> result, from ``bench train --json`` output (one object, or {"runs": [...]})."""
    if not isinstance(obj, dict):
        return {}
    runs = obj.get("runs", [obj])
    return {r["model"]: r for r in runs if isinstance(r, dict) and "model" in r}


def failures_of(obj: Any) -> dict[str, str]:
    """model -> the last line of its crash, from ``bench train --json`` (models that failed, the rest ran)."""
    if not isinstance(obj, dict):
        return {}
    failed = obj.get("failed", [])
    return {f["model"]: f.get("error", "?") for f in failed if isinstance(f, dict) and "model" in f}


def table(out: Path) -> str:
    cold_obj, warm_obj = read_json(out / "bench-cold.json"), read_json(out / "bench-warm.json")
    cold, warm = runs_of(cold_obj), runs_of(warm_obj)
    why = {**failures_of(cold_obj), **failures_of(warm_obj)}
    head = (f"{'model':<7}{'prec':>5}{'examples/s':>12}{'MFU':>8}{'MFU full':>9}{'peak TFLOP/s':>13}"
            f"{'peak mem GB':>12}{'1st step cold s':>16}{'1st step warm s':>16}")
    lines = [head, "-" * len(head)]
    for model in ("gem", "dcnv2"):
        r = warm.get(model) or cold.get(model)
        if r is None:
            reason = f" ({why[model][:160]})" if model in why else ""
            lines.append(f"{model:<7}failed{reason}: see {out}/bench-cold.log and bench-warm.log")
            continue
        c, w = cold.get(model, {}), warm.get(model, {})
        lines.append(_bench_row(model, r, c.get("time_to_first_step_s"), w.get("time_to_first_step_s")))
    eager = runs_of(read_json(out / "bench-eager.json")).get("gem")
    if eager is not None:  # written only when GEM failed compiled: the same bench with compile off
        lines.append(_bench_row("gem*", eager, eager.get("time_to_first_step_s"), None))
        lines.append("gem* = compile off (GEM failed compiled); its first step is without compilation")
    nccl = read_json(out / "nccl.json")
    if isinstance(nccl, dict) and nccl.get("ok"):
        lines.append(f"NCCL {nccl['nccl']}, 1 process, all-reduce of 1 Mi floats: ok in "
                     f"{nccl['seconds']:.2f} s ({nccl['device']}, torch {nccl['torch']})")
    else:
        lines.append(f"NCCL 1-process all-reduce: FAILED (see {out}/nccl.log)")
    tri = read_json(out / "triton.json")
    if isinstance(tri, dict) and tri.get("results"):
        for r in tri["results"]:
            lines.append(f"triton {r['op']} {r['dtype']}: max |diff| {r['max_abs_diff']:.1e} of "
                         f"{r['max_abs_value']:.1e}, {r['triton_ms']:.2f} ms vs reference "
                         f"{r['ref_ms']:.2f} ms (x{r['speedup']:.2f}; {r['shape']})")
    else:
        lines.append(f"Triton twins: FAILED (see {out}/triton.log)")
    pipe = read_json(out / "pipeline" / "pipeline_ab.json")
    if isinstance(pipe, dict) and pipe.get("rows"):
        for r in pipe["rows"]:
            lines.append(f"train.pipeline, {r['model']}, 1 process: plain loop {r['none']:,.0f} ex/s, "
                         f"sparse_dist {r['sparse_dist']:,.0f} ex/s (x{r['ratio_median']:.2f})")
    else:
        lines.append(f"train.pipeline A/B: FAILED (see {out}/pipeline.log)")
    r0 = next(iter({**cold, **warm}.values()), None)
    if r0 is not None:
        lines.append(f"batch {r0['batch_size']}, {r0['windows']} windows x {r0['steps']} steps, bf16 peak "
                     f"measured in each run; MFU on FLOPs at real history lengths, 'MFU full' at max_len")
    return "\n".join(lines)


def _bench_row(name: str, r: dict[str, Any], first_cold_s: float | None, first_warm_s: float | None) -> str:
    return (f"{name:<7}{r.get('precision', '?'):>5}{r['examples_per_s']:>12,.0f}{r['mfu']:>8.2%}"
            f"{r['mfu_full']:>9.2%}{r['peak_flops'] / 1e12:>13.1f}{r['peak_mem_mb'] / 1024:>12.2f}"
            f"{_s(first_cold_s):>16}{_s(first_warm_s):>16}")


def _s(x: float | None) -> str:
    return f"{x:.1f}" if isinstance(x, (int, float)) else "-"


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: gpu_check_table.py OUT")
    print(table(Path(sys.argv[1])))
