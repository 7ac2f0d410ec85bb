"""One trained checkpoint, evaluated with both kernels (issue 13): does the eval path differ?

Why: the demo evaluates each run with the kernel it trained with, so a difference only the eval path
takes (eval mode, no grad, batch 2048) would show as a training gap. Same weights, same rows: an equal
NE under both kernels rules the eval path out. Uses the project's own ``open_run`` and ``evaluate_model``.

Usage: python evalswap.py RUN_DIR [DATA_DIR] [PARTITIONS]
"""

from __future__ import annotations

import sys
import warnings

from opengem.model.sequence import use_kernel
from opengem.train.data import make_loader
from opengem.train.evaluate import evaluate_model, open_run


def main(run_dir: str, data_dir: str | None, spec: str | None) -> None:
    warnings.filterwarnings("ignore", category=FutureWarning)
    with open_run(run_dir, data_dir) as r:
        spec = spec or r.cfg.data.eval
        print(f"{run_dir}: step {r.step}, trained with kernel {r.cfg.model.gem.kernel!r}, eval on {spec}")
        for kernel in ("fused", "pytorch"):
            use_kernel(r.model, kernel)
            res = evaluate_model(r.model, make_loader(r.ds, spec, r.cfg.data, train=False), r.ds.schema,
                                 r.device)
            ne = {k: round(v["ne"], 5) for k, v in res["metrics"].items() if k.startswith("all/")}
            print(f"  eval kernel {kernel:8s}: loss {res['loss']:.6f} {ne}", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:] + [None] * (3 - len(sys.argv[1:]))
    main(args[0], args[1], args[2])
