"""Whole-test-day NE of finished probe runs, as the study scores its frontier (Platt refit on the whole
validation day): python wholeday.py RUN_DIR ... (cached in RUN/frontier_test.json)."""
import sys
from pathlib import Path

from opengem.bench.isoflop import frontier_test, selection_ne

for run in sys.argv[1:]:
    r = frontier_test(Path(run), "day=007", 0, 1, 0)
    m = r["metrics"]
    ne = selection_ne(m, "tasks")
    click, conv = m["all/click"]["ne"], m["all/conversion"]["ne"]
    print(f"{run}\t{ne:.4f}\tclick {click:.4f}\tconv {conv:.4f}", flush=True)
