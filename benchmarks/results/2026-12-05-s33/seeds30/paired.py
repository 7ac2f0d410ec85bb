"""GEM minus a baseline at the default study's frontier cells over 30 paired seeds (session 33).

    python paired.py PROBE_OUT WHOLEDAY_TXT [GEM_CELL BASELINE_CELL]   (default: GEM and DCNv2 at 1.58e10)

PROBE_OUT: ``probe.py run ... base gem:0:1:0.01 dcnv2:0:1:0.01 --seeds 30``'s folder; WHOLEDAY_TXT: the lines
``../../2026-12-05-s32/cross_width/wholeday.py`` printed for its runs (whole test day, Platt on the whole
validation day). NE = the study's own "tasks" metric (mean of all/click and all/conversion).
"""

import json
import statistics
import sys
from pathlib import Path

from opengem.bench.fit import mean_ci
from opengem.bench.isoflop import selection_ne

CELLS = {"gem": "gem-s0-b1-lr0.01", "dcnv2": "dcnv2-s0-b1-lr0.01"}
SEEDS = range(30)


def main() -> None:
    runs = Path(sys.argv[1]) / "base" / "runs"
    if len(sys.argv) == 5:
        CELLS.update(gem=sys.argv[3], dcnv2=sys.argv[4])
    base = {"dcnv2": "DCNv2", "dlrm": "DLRM", "din": "DIN"}.get(CELLS["dcnv2"].split("-")[0], CELLS["dcnv2"])
    whole = {Path(line.split("\t")[0]).name: float(line.split("\t")[1])
             for line in Path(sys.argv[2]).read_text().splitlines() if "\t" in line}
    cols: dict[str, dict[str, list[float]]] = {"valid": {}, "test slice": {}, "test whole day": {}}
    for fam, cell in CELLS.items():
        for s in SEEDS:
            name = f"{cell}-seed{s}"
            rec = json.loads((runs / name / "result.json").read_text())
            cols["valid"].setdefault(fam, []).append(selection_ne(rec["valid"], "tasks"))
            cols["test slice"].setdefault(fam, []).append(selection_ne(rec["test"], "tasks"))
            cols["test whole day"].setdefault(fam, []).append(whole[name])
    print(f"| NE | GEM mean (sd) | {base} mean (sd) | GEM median | {base} median "
          f"| GEM - {base}, paired [95 % t] | seeds GEM lower |")
    print("|---|---|---|---|---|---|---|")
    for split, v in cols.items():
        g, d = v["gem"], v["dcnv2"]
        diff = [a - b for a, b in zip(g, d)]
        m, h = mean_ci(diff)
        print(f"| {split} | {statistics.mean(g):.4f} ({statistics.stdev(g):.4f}) | {statistics.mean(d):.4f} "
              f"({statistics.stdev(d):.4f}) | {statistics.median(g):.4f} | {statistics.median(d):.4f} "
              f"| {m:+.4f} [{m - h:+.4f}, {m + h:+.4f}] | {sum(x < 0 for x in diff)} of {len(diff)} |")


if __name__ == "__main__":
    main()
