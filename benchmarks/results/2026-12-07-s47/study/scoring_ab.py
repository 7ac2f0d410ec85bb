"""Seconds to score finished study runs as the study does after training (validation, the Platt fit, test raw
and calibrated, on 65,536 spread rows of each day), under whichever opengem is on PYTHONPATH; each run is
copied first so that its calibration.json is not touched. Prints one line per run: name, seconds, test NE.

    PYTHONPATH=WORKTREE/src python scoring_ab.py OUT.jsonl RUN...   # one code version; alternate two
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from opengem.bench.isoflop import _score_run
from opengem.train.evaluate import open_run


def main() -> None:
    torch.set_num_threads(1)
    out = Path(sys.argv[1])
    for run in map(Path, sys.argv[2:]):
        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp) / run.name
            shutil.copytree(run, copy, ignore=shutil.ignore_patterns("predictions*", "eval*.json"))
            with open_run(copy, calibrated=False) as r:
                t0 = time.perf_counter()
                valid, test, raw = _score_run(r, copy, "day=007", 65536, "platt", "spread")
                seconds = time.perf_counter() - t0
        rec = {"run": run.name, "seconds": seconds, "valid_ne": valid["all/click"]["ne"],
               "test_ne": test["all/click"]["ne"], "raw_ne": raw["all/click"]["ne"]}
        with out.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        print(f"{run.name} {seconds:.2f}s valid {rec['valid_ne']:.6f} test {rec['test_ne']:.6f}", flush=True)


if __name__ == "__main__":
    main()
