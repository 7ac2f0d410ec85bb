"""Six of session 44's frontier runs (copied to ./runs, their frontier_test.json removed) scored in one pass
by the new code; each result compared with the whole document session 44's study wrote for it."""

import json
import time
from pathlib import Path

from opengem.bench.frontier_scoring import frontier_tests

runs = sorted(Path("runs").iterdir())
t = time.perf_counter()
got = frontier_tests(runs, "day=007", 0, 1, 0)
print(f"{len(runs)} runs scored together in {time.perf_counter() - t:.1f}s")
for r in runs:
    old = json.loads((Path("/work/s44/study/runs") / r.name / "frontier_test.json").read_text())
    new = got[r.name]
    print(r.name, "identical" if old == new else "DIFFERENT", new["rows_scored"], new["calibration_fit_rows"])
