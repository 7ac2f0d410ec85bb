"""GEM's fused training step with the attention core of masked_attention_twin.py vs SDPA, in-process.

Same Trainer, weights and batches; both arms run every block's fused twin, only the attention core differs
(swapped in where ``opengem.model.sequence`` calls it). Arms alternate window by window, so machine load
hits both alike; process-CPU ms per step.

    .venv/bin/python benchmarks/results/2026-12-05-s31/attention/step_ab.py CONFIG [section.key=value ...]
"""

from __future__ import annotations

import os
import pathlib
import statistics
import sys
import time
from collections.abc import Callable

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from masked_attention_twin import masked_attention as twin_core  # noqa: E402

from opengem.model import sequence  # noqa: E402
from opengem.model.sequence import use_kernel  # noqa: E402
from opengem.ops.pytorch import pt_attention  # noqa: E402
from opengem.train.config import load_run_config  # noqa: E402
from opengem.train.data import prepare_data  # noqa: E402
from opengem.train.trainer import Trainer  # noqa: E402

Core = Callable[..., torch.Tensor]


def use_core(core: Core) -> None:
    def masked(q, k, v, key_mask=None, **_):  # noqa: ANN001, ANN202
        return core(q, k, v, key_mask)

    def pooled(q, k, v, key_mask=None, **_):  # noqa: ANN001, ANN202
        B, _, M, _ = q.shape
        valid = (torch.ones(B, M, dtype=torch.bool) if key_mask is None
                 else (key_mask.sum(1) > 0)[:, None].expand(B, M))
        return core(q, k, v, key_mask), valid

    sequence.masked_attention, sequence.pooled_attention = masked, pooled


def main() -> None:
    cfg = load_run_config(sys.argv[1], ["train.threads=1", *sys.argv[2:]])
    data = prepare_data(cfg.data, "runs/bench/attention_ab", None)
    arms = {"sdpa core": pt_attention.masked_attention, "twin core": twin_core}
    times: dict[str, list[float]] = {a: [] for a in arms}
    with Trainer(cfg, None, data) as trainer:
        loader = iter(trainer.train_loader())
        batches = [next(loader).to(trainer.device) for _ in range(8)]
        use_kernel(trainer.parallel.plain, "fused")
        k = 0

        def window(core: Core, n: int = 8) -> float:
            nonlocal k
            use_core(core)
            cpu = time.process_time()
            for _ in range(n):
                trainer.train_step(batches[k % len(batches)])
                k += 1
            return (time.process_time() - cpu) / n * 1e3

        for core in arms.values():
            window(core, 4)
        for _ in range(6):
            for name, core in arms.items():
                times[name].append(window(core))
    print(f"{sys.argv[1]} {' '.join(sys.argv[2:])}  load average {os.getloadavg()}")
    for name, ts in times.items():
        rounded = [round(t, 1) for t in ts]
        print(f"{name:10s} median {statistics.median(ts):6.1f} ms/step CPU, windows {rounded}")
    ratio = statistics.median(times["sdpa core"]) / statistics.median(times["twin core"])
    print(f"step speed-up (twin core / sdpa core): {ratio:.3f}x")


if __name__ == "__main__":
    main()
