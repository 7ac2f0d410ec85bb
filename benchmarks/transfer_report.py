"""Print the transfer experiment's tables from OUT/transfer.json (arms, staleness, FLOPs, generation).

Usage: python benchmarks/transfer_report.py OUT [OUT2 ...]
Run the experiment first: opengem transfer --config configs/transfer.toml --out OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from opengem.transfer.results import arms_table, fmt, staleness_table


def report(out: Path) -> str:
    r = json.loads((out / "transfer.json").read_text())
    arms = list(r["arms"])
    lines = [f"== {out} (tuned KD: {r['kd_tuned']}, eval windows {r['windows']['eval']}, "
             f"seeds {r['config']['seeds']}, lag {r['config']['lag']})", arms_table(r, arms)]
    if r.get("staleness"):
        lines += ["", "staleness sweep (TR)", staleness_table(r["staleness"])]
    lines += ["", f"{'arm':<18}{'serving FLOPs/ex':>18}{'shared FM params':>18}"]
    for a, f in r["serving_flops"].items():
        lines.append(f"{a:<18}{f['serving_flops_per_example']:>18,}{f['shared_fm_params']:>18,}")
    for k, h in r.get("hierarchical", {}).items():
        lines.append(f"hierarchical {k}: FM NE {fmt(h['fm_ne'])}, domain FM NE {fmt(h['domain_fm_ne'])}, "
                     f"VM NE {fmt(h['vm_ne'])} (baseline {fmt(h['baseline_vm_ne'])}); hop2 TR "
                     f"{fmt(h['hop2_domain_to_vm_tr'], 2)}, end-to-end TR {fmt(h['end_to_end_tr'], 2)}")
    g = r["generation"]
    lines.append(f"knowledge generation: {fmt(g['examples_per_s'], 0)} examples/s end to end, "
                 f"{fmt(g['forward_examples_per_s'], 0)} in the FM forward ({g['rows']:,} rows)")
    return "\n".join(lines)


if __name__ == "__main__":
    for arg in sys.argv[1:] or ["runs/transfer"]:
        print(report(Path(arg)))
