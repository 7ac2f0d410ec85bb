"""One run of an ablation study in a process of its own: what the study starts for each run when
``workers`` > 1 (a process per run, so that runs side by side share no threads, caches or allocator
state; forked from a server that imported this module once, bench/worker_process.py, or started as below).

    python -m opengem.bench.ablation_worker OUT/ablation.toml OUT DATA CONFIG LR|recipe SEED PROXY|- \
        [OVERRIDE...]
"""

from __future__ import annotations

import sys

from opengem.bench.ablation import load_ablation_config, train_job


def main(argv: list[str]) -> None:
    study, out, data, name, lr, seed, proxy, *extra = argv
    cfg = load_ablation_config(study)
    train_job(cfg, out, data, name, None if lr == "recipe" else float(lr), int(seed),
              None if proxy == "-" else proxy, extra, log=lambda m: print(m, flush=True))


if __name__ == "__main__":
    main(sys.argv[1:])
