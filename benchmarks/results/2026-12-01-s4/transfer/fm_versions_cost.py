"""CPU cost of one seed's FM versions, warm vs scratch (issue 15, item 1).

Usage: python fm_versions_cost.py CONFIG OUT MODE [SEED]  (run under `/usr/bin/time -v nice -n 10`).
Simulates the seed's stream into OUT/seed<SEED>/data first (reused when present, not timed), then trains
the published FM versions of CONFIG with fm_versions = MODE into OUT/seed<SEED>/fm_<MODE> and prints the
process CPU seconds and wall seconds of that part alone as one JSON line.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path

from opengem.data.dataset import Dataset
from opengem.train.env import cpu_threads
from opengem.transfer.experiment_config import load_experiment_config
from opengem.transfer.windows import prepare_data, train_published_versions


def main() -> None:
    config, out, mode = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    cfg = load_experiment_config(config, [f"fm_versions={mode}"])
    seed = int(sys.argv[4]) if len(sys.argv) > 4 else cfg.seeds[0]
    root = out / f"seed{seed}"
    root.mkdir(parents=True, exist_ok=True)
    data = prepare_data(cfg, seed, root)
    parts = Dataset(data).partitions()
    fm_cfg = copy.deepcopy(cfg.fm)
    fm_cfg.train.seed = seed
    with cpu_threads(cfg.threads):
        c0, w0 = time.process_time(), time.perf_counter()
        vers = train_published_versions(fm_cfg, data, root / f"fm_{mode}", parts, cfg.publish_every, mode)
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    print(json.dumps({"config": config, "mode": mode, "seed": seed, "versions": [v.version for v in vers],
                      "fm_cpu_s": round(cpu, 1), "fm_wall_s": round(wall, 1)}))


if __name__ == "__main__":
    main()
