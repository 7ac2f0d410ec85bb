"""Uncalibrated logits of finished iso-FLOP runs on every row of one day, saved for sample_error.py.

    python collect_logits.py day=006 OUT.npz RUN_DIR...
"""

import contextlib
import sys
from pathlib import Path

import numpy as np
import torch

from opengem.train.calibrate import collect_logits_of
from opengem.train.data import make_loader
from opengem.train.evaluate import open_run


def main(day: str, out: str, runs: list[Path]) -> None:
    torch.set_num_threads(1)
    with contextlib.ExitStack() as stack:
        opened = {r.name: stack.enter_context(open_run(r, calibrated=False)) for r in runs}
        first = next(iter(opened.values()))
        batches = make_loader(first.ds, day, first.cfg.data, train=False)
        zs, y, m, s = collect_logits_of({n: r.model for n, r in opened.items()}, batches, first.device)
    np.savez(out, y=y, m=m, s=s, **zs)
    print(f"{out}: {len(y)} rows, {len(zs)} runs")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], [Path(p) for p in sys.argv[3:]])
