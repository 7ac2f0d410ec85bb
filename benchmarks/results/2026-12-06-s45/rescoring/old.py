"""Old code (a worktree of 6c4ab8f on PYTHONPATH): the runs in a folder scored one at a time, as session 44's
study did."""

import sys
import time
from pathlib import Path

from opengem.bench.isoflop import frontier_test

runs = sorted(Path(sys.argv[1]).iterdir())
t = time.perf_counter()
for r in runs:
    frontier_test(r, "day=007", 0, 1, 0)
print(f"old: {len(runs)} runs one at a time in {time.perf_counter() - t:.1f}s")
