"""One run of an iso-FLOP study in a process of its own: what the study starts for each run when
``workers`` > 1 (a process per run, so that runs side by side share no threads, caches or allocator
state; forked from a server that imported this module once, bench/worker_process.py, or started as below).

    python -m opengem.bench.isoflop_worker OUT/isoflop.toml OUT DATA FAMILY SIZE BUDGET LR|recipe SEED \
        [OVERRIDE...]
"""

from __future__ import annotations

import sys

from opengem.bench.isoflop import load_isoflop_config, train_cell


def main(argv: list[str]) -> None:
    study, out, data, family, size, budget, lr, seed, *extra = argv
    cfg = load_isoflop_config(study)
    train_cell(cfg, out, data, family, int(size), int(budget), None if lr == "recipe" else float(lr),
               [int(seed)], extra, log=lambda m: print(m, flush=True))


if __name__ == "__main__":
    main(sys.argv[1:])
