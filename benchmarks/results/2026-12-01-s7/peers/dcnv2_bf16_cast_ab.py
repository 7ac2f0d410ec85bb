"""In-process interleaved A/B of DCNv2's bf16 forward+backward at the peer settings (embedding 16, batch
4096, 3 full-rank cross layers, deep [400, 400, 400], parallel, no head MLP): the interaction input cast
once to bf16 (new) vs cast at every use (old: the cast helper made the identity). Thread CPU time per
step, one thread. usage: dcnv2_bf16_cast_ab.py [rounds] (needs /tmp/opengem-peers/flat from peers/run.py)"""

import sys
import time
import warnings

import numpy as np
import torch

import opengem.model.baselines as baselines
from opengem.data.dataset import Dataset
from opengem.data.random_batch import random_batch
from opengem.model.registry import build_model
from opengem.train.config import load_run_config
from opengem.train.step import forward_loss, task_weights

warnings.filterwarnings("ignore")
torch.set_num_threads(1)
OVERRIDES = [
    "model.name=dcnv2",
    "model.embedding.d=16",
    "data.batch_size=4096",
    "model.head.hidden=[]",
    "model.head.adapter_dim=0",
    "model.dcnv2.num_cross_layers=3",
    "model.dcnv2.deep_mlp=[400,400,400]",
    "model.dcnv2.structure='parallel'",
    "model.dcnv2.low_rank=0",
    "train.precision=bf16",
]
cfg = load_run_config(None, OVERRIDES)
schema = Dataset("/tmp/opengem-peers/flat").schema
model = build_model(schema, cfg.model)
batch = random_batch(schema, 4096, seed=0)
weights = task_weights(schema, torch.device("cpu"))
opt = torch.optim.SGD(model.parameters(), lr=1e-9)
cast_once = baselines.to_cpu_autocast_dtype


def step() -> None:
    loss = forward_loss(model, batch, weights, cfg.train, torch.device("cpu"))
    opt.zero_grad(set_to_none=True)
    loss.backward()


res: dict[str, list[float]] = {"old": [], "new": []}
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 12):
    for arm in ("old", "new"):
        baselines.to_cpu_autocast_dtype = (lambda x: x) if arm == "old" else cast_once
        step()
        c = time.thread_time()
        step()
        step()
        res[arm].append((time.thread_time() - c) / 2)
for arm, v in res.items():
    print(arm, f"{np.median(v[2:]) * 1e3:.1f} ms CPU per fwd+bwd step (median of {len(v) - 2})")
print("new/old", np.median(res["new"][2:]) / np.median(res["old"][2:]))
