"""What the cross branch's attribute tables cost per step (session 33): CrossAttributes forward and
backward on one 256-row batch of the study's schema, one thread, and KeyedJaggedTensor.to_dict (cached
and fresh).

    .venv/bin/python benchmarks/results/2026-12-05-s33/cross_gate/attr_cost.py
"""

import time
from pathlib import Path

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from opengem.data.random_batch import random_batch
from opengem.data.sim_config import SimConfig, sim_schema
from opengem.model.cross_attributes import CrossAttributes
from opengem.train.config import load_run_config


def ms(f, n: int = 200) -> float:
    f()
    t = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t) / n * 1e3


def main() -> None:
    torch.set_num_threads(1)
    cfg = load_run_config(Path("configs/small-d32.toml"))
    schema = sim_schema(SimConfig.from_dict(cfg.data.sim))
    batch = random_batch(schema, 256, seed=0)
    attrs = CrossAttributes(schema, 8, 1000)
    kjt = batch.sparse

    def fwd_bwd() -> None:
        attrs.zero_grad()
        attrs(batch).sum().backward()

    def fresh() -> None:
        KeyedJaggedTensor(keys=kjt.keys(), values=kjt.values(), lengths=kjt.lengths()).to_dict()

    print(f"to_dict (cached) {ms(kjt.to_dict):.3f} ms, to_dict (fresh KJT) {ms(fresh):.3f} ms")
    fwd = ms(lambda: attrs(batch))
    print(f"CrossAttributes forward {fwd:.3f} ms, forward + backward {ms(fwd_bwd):.3f} ms")


if __name__ == "__main__":
    main()
