"""TorchRec's own DCNv2 on the shared CTR data, two ways; print one JSON result line.

Runs in opengem's venv (TorchRec is an opengem dependency there), on the same train.parquet / test.parquet /
spec.json the other peers read, through the same loop as ``peer_dcnv2.py`` (one epoch, fixed batch size,
BCE). The model is TorchRec's parts: ``EmbeddingBagCollection`` (one table per sparse column, sum pooling),
``torchrec.modules.crossnet.CrossNet`` (full-rank DCN-V2 cross layers) and ``torchrec.modules.mlp.MLP`` in
parallel on x0 = [pooled embeddings, dense], one linear logit.

- ``--lib torchrec``: the modules as they are, Adam on every parameter (embedding tables included, dense
  gradients): what a user gets from TorchRec's modules without its distributed stack.
- ``--lib torchrec-dmp``: the same model inside ``DistributedModelParallel`` (1 process, gloo, the
  default planner) with the tables' optimizer fused into the backward (FBGEMM row-wise Adagrad,
  ``apply_optimizer_in_backward``) and Adam on the dense part: TorchRec's production path, and the
  one opengem's trainer takes.

    .venv/bin/python peer_torchrec.py --lib torchrec-dmp --data DIR --out result.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
from torch import nn

LIBS = ("torchrec", "torchrec-dmp")
SPARSE_LR = 0.05  # row-wise Adagrad on the tables: opengem's train.sparse_lr default


def load(data: Path, split: str, spec: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    t = pq.read_table(data / f"{split}.parquet")
    xs = np.stack([t[c].to_numpy().astype(np.int64) for c in spec["sparse"]], axis=1)
    xd = np.stack([t[c].to_numpy().astype(np.float32) for c in spec["dense"]], axis=1)
    y = t[spec["label"]].to_numpy().astype(np.float32)
    return xs, xd, y


class TorchRecDCNv2(nn.Module):
    """EmbeddingBagCollection -> [pooled ++ dense] -> CrossNet || MLP -> logit (DCN-V2, parallel)."""

    def __init__(self, spec: dict) -> None:
        from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
        from torchrec.modules.crossnet import CrossNet
        from torchrec.modules.mlp import MLP

        super().__init__()
        d = spec["emb_dim"]
        self.keys = list(spec["sparse"])
        self.ebc = EmbeddingBagCollection(
            tables=[EmbeddingBagConfig(name=f"t_{c}", embedding_dim=d, num_embeddings=spec["vocab"][c],
                                       feature_names=[c]) for c in self.keys])
        x0 = d * len(self.keys) + len(spec["dense"])
        self.cross = CrossNet(x0, spec["cross_layers"])
        self.deep = MLP(x0, list(spec["mlp"]))
        self.logit = nn.Linear(x0 + spec["mlp"][-1], 1)

    def forward(self, kjt, dense: torch.Tensor) -> torch.Tensor:
        pooled = self.ebc(kjt)
        x0 = torch.cat([*(pooled[k] for k in self.keys), dense], dim=1)  # by key: sharding reorders values
        return self.logit(torch.cat([self.cross(x0), self.deep(x0)], dim=1)).squeeze(1)


def kjt_of(keys: list[str], xs: torch.Tensor):
    """One id per row and column, as a KeyedJaggedTensor (column-major values, lengths all 1)."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    B = xs.shape[0]
    return KeyedJaggedTensor.from_lengths_sync(keys=keys, values=xs.t().reshape(-1),
                                               lengths=torch.ones(B * len(keys), dtype=torch.int32))


def build(lib: str, spec: dict) -> tuple[nn.Module, torch.optim.Optimizer, str]:
    torch.manual_seed(spec["seed"])
    if lib == "torchrec":
        model = TorchRecDCNv2(spec)
        opt = torch.optim.Adam(model.parameters(), lr=spec["lr"])
        return model, opt, "torchrec modules (EBC + CrossNet + MLP), Adam on all parameters"
    import torch.distributed as dist
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.optim import RowWiseAdagrad, apply_optimizer_in_backward

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 2000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    model = TorchRecDCNv2(spec)
    apply_optimizer_in_backward(RowWiseAdagrad, model.ebc.parameters(), {"lr": SPARSE_LR})
    dmp = DistributedModelParallel(model, device=torch.device("cpu"))
    dense = [p for n, p in dmp.named_parameters() if "ebc." not in n]
    opt = torch.optim.Adam(dense, lr=spec["lr"])
    return dmp, opt, "torchrec DistributedModelParallel, fused row-wise Adagrad tables + Adam dense"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True, choices=LIBS)
    ap.add_argument("--data", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    spec = json.loads((args.data / "spec.json").read_text())
    torch.set_num_threads(spec["threads"])
    xs, xd, y = load(args.data, "train", spec)
    ts, td, ty = load(args.data, "test", spec)
    model, opt, what = build(args.lib, spec)
    keys = list(spec["sparse"])
    loss_fn = nn.BCEWithLogitsLoss()
    B = spec["batch_size"]
    xs_t, xd_t, y_t = torch.from_numpy(xs), torch.from_numpy(xd), torch.from_numpy(y)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(spec["seed"]))
    n_batches = len(y) // B  # drop_last, as opengem's trainer
    model.train()
    t0 = time.perf_counter()
    for b in range(n_batches):
        idx = perm[b * B:(b + 1) * B]
        loss = loss_fn(model(kjt_of(keys, xs_t[idx]), xd_t[idx]), y_t[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    train_s = time.perf_counter() - t0
    model.eval()
    with torch.no_grad():
        pt, pd = torch.from_numpy(ts), torch.from_numpy(td)
        preds = torch.cat([torch.sigmoid(model(kjt_of(keys, pt[i:i + 8192]), pd[i:i + 8192]))
                           for i in range(0, len(ty), 8192)]).numpy().astype(np.float64)
    from opengem.metrics import auc, log_loss  # the metrics opengem's own rows are scored with

    res = {
        "lib": args.lib, "model": what, "train_rows": n_batches * B, "train_seconds": train_s,
        "examples_per_s": n_batches * B / train_s, "test_rows": int(len(ty)),
        "test_auc": float(auc(preds, ty)), "test_logloss": float(log_loss(preds, ty)),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "params": sum(p.numel() for p in model.parameters()), "torch": torch.__version__,
        "last_loss": float(loss),
    }
    args.out.write_text(json.dumps(res))
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
