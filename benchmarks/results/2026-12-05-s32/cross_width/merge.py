"""One study's isoflop.json from a GEM-only rerun and the full study it extends: GEM's frontier from NEW,
every other family's from OLD (their ladders, stream and code unchanged, so their runs would be identical),
and the laws, efficiency ratios, gap shares and Welch differences recomputed over the merged frontier with the
study's own functions (``opengem.bench.isoflop_report``).

    python merge.py OLD/isoflop.json NEW/isoflop.json OUT/isoflop.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from opengem.bench.isoflop_report import (
    _gap_closed,
    efficiency_table,
    fit_frontier,
    json_safe,
    welch_difference,
)


def main(old_path: str, new_path: str, out_path: str) -> None:
    old, new = json.loads(Path(old_path).read_text()), json.loads(Path(new_path).read_text())
    if old["splits"] != new["splits"] or old["budgets"] != new["budgets"]:
        raise SystemExit("the two studies have different splits or budgets")
    ref = old["efficiency_reference"]
    frontier = {fam: (new["frontier"][fam] if fam in new["frontier"] else fr)
                for fam, fr in old["frontier"].items()}
    floor = old["oracle_ne"]
    seeds_ne = {fam: [p["ne_seeds"] for p in fr] for fam, fr in frontier.items()}
    fits = {fam: fit_frontier([p["train_flops"] for p in fr], [p["ne"] for p in fr], floor)
            for fam, fr in frontier.items()}
    merged = dict(old)
    merged.update({
        "frontier": frontier,
        "fits": {k: (v.to_dict() if v else None) for k, v in fits.items()},
        "efficiency": efficiency_table(frontier, seeds_ne, fits, floor, ref, 1000),
        "gap_closed_vs_dlrm": _gap_closed(frontier, old["oracle_per_key"], sorted(old["oracle_per_key"])),
        "difference_vs_reference": {fam: [welch_difference(p_ref["ne_seeds"], p["ne_seeds"])
                                          for p_ref, p in zip(frontier[ref], fr)]
                                    for fam, fr in frontier.items() if fam != ref},
        "compute_optimal": {fam: (new["compute_optimal"][fam] if fam in new["frontier"] else v)
                            for fam, v in old["compute_optimal"].items()},
        "isoflop_curves": {fam: (new["isoflop_curves"][fam] if fam in new["frontier"] else v)
                           for fam, v in old["isoflop_curves"].items()},
        "size": {"rule": old["size"]["rule"],
                 "scores": {fam: (new["size"]["scores"].get(fam, v) if fam in new["frontier"] else v)
                            for fam, v in old["size"]["scores"].items()}},
        # what was run for this file: NEW's runs only (the other families' are OLD's, not rerun)
        "runs": new["runs"], "runs_trained_now": new.get("runs_trained_now"),
        "elapsed_s": new.get("elapsed_s"),
        "merged_from": {"families_from_new": sorted(new["frontier"]), "old": old_path, "new": new_path},
    })
    Path(out_path).write_text(json.dumps(json_safe(merged), indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:4])
