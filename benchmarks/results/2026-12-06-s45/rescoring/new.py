"""New code: the runs in a folder scored together (one pass over each day)."""

import sys
import time
from pathlib import Path

from opengem.bench.frontier_scoring import frontier_tests

runs = sorted(Path(sys.argv[1]).iterdir())
t = time.perf_counter()
frontier_tests(runs, "day=007", 0, 1, 0)
print(f"new: {len(runs)} runs together in {time.perf_counter() - t:.1f}s")
