"""GEM minus a baseline at the default study's frontier cells over 30 paired seeds (session 33).

    python paired.py PROBE_OUT WHOLEDAY_TXT [GEM_CELL BASELINE_CELL]   (default: GEM and DCNv2 at 1.58e10)

PROBE_OUT: ``probe.py run ... base gem:0:1:0.01 dcnv2:0:1:0.01 --seeds 30``'s folder; WHOLEDAY_TXT: the lines
``../../2026-12-05-s32/cross_width/wholeday.py`` printed for its runs (whole test day, Platt on the whole
validation day). NE = the study's own "tasks" metric (mean of all/click and all/conversion). A cell may name
its probe variant, ``VARIANT/CELL`` (default ``base``; session 34 pairs ``nonorm/gem-...`` with ``base/...``),
and the seeds are those both cells ran (session 33: 0-29; session 34: 30-59).
"""

import json
import statistics
import sys
from pathlib import Path

from opengem.bench.fit import mean_ci
from opengem.bench.isoflop import selection_ne

CELLS = {"gem": "gem-s0-b1-lr0.01", "dcnv2": "dcnv2-s0-b1-lr0.01"}
NAMES = {"gem": "GEM", "dcnv2": "DCNv2", "dlrm": "DLRM", "din": "DIN"}


def split_cell(cell: str) -> tuple[str, str]:
    """``VARIANT/CELL`` or ``CELL`` -> (variant, cell); the variant defaults to the probe's "base"."""
    variant, _, name = cell.rpartition("/")
    return variant or "base", name


def label(cell: str) -> str:
    variant, name = split_cell(cell)
    family = name.split("-")[0]
    text = NAMES.get(family, name)
    return text if variant == "base" else f"{text} ({variant})"


def seeds_of(out: Path, cell: str) -> set[int]:
    variant, name = split_cell(cell)
    done = (out / variant / "runs").glob(f"{name}-seed*/result.json")
    return {int(p.parent.name.rsplit("-seed", 1)[1]) for p in done}


def main() -> None:
    out = Path(sys.argv[1])
    if len(sys.argv) == 5:
        CELLS.update(gem=sys.argv[3], dcnv2=sys.argv[4])
    gem, base = label(CELLS["gem"]), label(CELLS["dcnv2"])
    # keyed by VARIANT/RUN: two variants' runs of one cell share a run name
    whole = {f"{Path(run).parents[1].name}/{Path(run).name}": float(value)
             for run, value, *_ in (line.split("\t") for line in Path(sys.argv[2]).read_text().splitlines()
                                    if "\t" in line)}
    seeds = sorted(seeds_of(out, CELLS["gem"]) & seeds_of(out, CELLS["dcnv2"]))
    cols: dict[str, dict[str, list[float]]] = {"valid": {}, "test slice": {}, "test whole day": {}}
    for fam, cell in CELLS.items():
        variant, cell_name = split_cell(cell)
        for s in seeds:
            name = f"{cell_name}-seed{s}"
            rec = json.loads((out / variant / "runs" / name / "result.json").read_text())
            cols["valid"].setdefault(fam, []).append(selection_ne(rec["valid"], "tasks"))
            cols["test slice"].setdefault(fam, []).append(selection_ne(rec["test"], "tasks"))
            cols["test whole day"].setdefault(fam, []).append(whole[f"{variant}/{name}"])
    print(f"| NE | {gem} mean (sd) | {base} mean (sd) | {gem} median | {base} median "
          f"| {gem} - {base}, paired [95 % t] | seeds {gem} lower |")
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
