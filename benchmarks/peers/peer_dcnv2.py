"""Train one peer library's DCNv2 for one epoch on the shared CTR data; print one JSON result line.

Runs inside the peer's own venv (.peers/<lib>/bin/python), so it imports only torch, numpy, pyarrow,
scikit-learn and the peer. The model is the peer's (its classes and layers); the loop around it is the
same small loop for every peer (Adam, BCE, one epoch, fixed batch size, no per-epoch validation), so the
numbers compare model implementations rather than each library's trainer extras.

    python peer_dcnv2.py --lib torch-rechub --data DIR --out result.json
DIR holds train.parquet, test.parquet and spec.json (written by run.py).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
from torch import nn


def load(data: Path, split: str, spec: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    t = pq.read_table(data / f"{split}.parquet")
    xs = np.stack([t[c].to_numpy().astype(np.int64) for c in spec["sparse"]], axis=1)
    xd = np.stack([t[c].to_numpy().astype(np.float32) for c in spec["dense"]], axis=1)
    y = t[spec["label"]].to_numpy().astype(np.float32)
    return xs, xd, y


# --------------------------------------------------------------------------- one builder per peer
def build_rechub(spec: dict):
    from torch_rechub.basic.features import DenseFeature, SparseFeature
    from torch_rechub.models.ranking import DCNv2

    d = spec["emb_dim"]
    feats = [SparseFeature(c, vocab_size=spec["vocab"][c], embed_dim=d) for c in spec["sparse"]]
    feats += [DenseFeature(c) for c in spec["dense"]]
    model = DCNv2(feats, n_cross_layers=spec["cross_layers"], use_low_rank_mixture=False,
                  mlp_params={"dims": spec["mlp"], "activation": "relu", "dropout": 0.0},
                  model_structure="parallel")

    def forward(xs: torch.Tensor, xd: torch.Tensor) -> torch.Tensor:
        x = {c: xs[:, i] for i, c in enumerate(spec["sparse"])}
        x.update({c: xd[:, i] for i, c in enumerate(spec["dense"])})
        return model(x)  # probabilities

    return model, forward, "torch_rechub.models.ranking.DCNv2 (parallel, full-rank CrossNetV2)"


def build_fuxictr(spec: dict):
    """FuxiCTR's pip wheel ships only model_zoo/LongCTR/DCNv2 (needs behaviour sequences); the classic
    model_zoo DCNv2 is FeatureEmbedding -> CrossNetV2 || MLP_Block -> Linear, built here from the
    wheel's own layers exactly that way."""
    from collections import OrderedDict

    from fuxictr.features import FeatureMap
    from fuxictr.pytorch.layers import CrossNetV2, FeatureEmbedding, MLP_Block

    fm = FeatureMap("peers", "/tmp")
    fm.features = OrderedDict()
    for c in spec["sparse"]:
        fm.features[c] = {"type": "categorical", "vocab_size": spec["vocab"][c], "source": ""}
    for c in spec["dense"]:
        fm.features[c] = {"type": "numeric", "source": ""}
    fm.labels = [spec["label"]]
    fm.num_fields = len(fm.features)
    d = spec["emb_dim"]

    class FuxiDCNv2(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedding_layer = FeatureEmbedding(fm, d)
            in_dim = fm.num_fields * d
            self.crossnet = CrossNetV2(in_dim, spec["cross_layers"])
            self.parallel_dnn = MLP_Block(input_dim=in_dim, output_dim=None, hidden_units=spec["mlp"],
                                          hidden_activations="ReLU", output_activation=None)
            self.fc = nn.Linear(in_dim + spec["mlp"][-1], 1)

        def forward(self, x: dict) -> torch.Tensor:
            e = self.embedding_layer(x, flatten_emb=True)
            out = torch.cat([self.crossnet(e), self.parallel_dnn(e)], dim=-1)
            return torch.sigmoid(self.fc(out)).squeeze(-1)

    model = FuxiDCNv2()

    def forward(xs: torch.Tensor, xd: torch.Tensor) -> torch.Tensor:
        x = {c: xs[:, i] for i, c in enumerate(spec["sparse"])}
        x.update({c: xd[:, i] for i, c in enumerate(spec["dense"])})
        return model(x)

    return model, forward, "fuxictr layers (FeatureEmbedding, CrossNetV2, MLP_Block) as model_zoo DCNv2"


def build_deepctr(spec: dict):
    from deepctr_torch.inputs import DenseFeat, SparseFeat
    from deepctr_torch.models import DCN

    d = spec["emb_dim"]
    cols = [SparseFeat(c, vocabulary_size=spec["vocab"][c], embedding_dim=d) for c in spec["sparse"]]
    cols += [DenseFeat(c, 1) for c in spec["dense"]]
    model = DCN(cols, cols, cross_num=spec["cross_layers"], cross_parameterization="matrix",
                dnn_hidden_units=tuple(spec["mlp"]), device="cpu", dnn_dropout=0.0, l2_reg_linear=0.0,
                l2_reg_embedding=0.0, l2_reg_cross=0.0, l2_reg_dnn=0.0)

    def forward(xs: torch.Tensor, xd: torch.Tensor) -> torch.Tensor:
        return model(torch.cat([xs.float(), xd], dim=1)).squeeze(-1)  # columns in feature_index order

    return model, forward, "deepctr_torch.models.DCN (cross_parameterization='matrix' = DCN-V2)"


BUILDERS = {"torch-rechub": build_rechub, "fuxictr": build_fuxictr, "deepctr-torch": build_deepctr}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True, choices=sorted(BUILDERS))
    ap.add_argument("--data", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    spec = json.loads((args.data / "spec.json").read_text())
    torch.manual_seed(spec["seed"])
    torch.set_num_threads(spec["threads"])
    xs, xd, y = load(args.data, "train", spec)
    ts, td, ty = load(args.data, "test", spec)
    model, forward, what = BUILDERS[args.lib](spec)
    opt = torch.optim.Adam(model.parameters(), lr=spec["lr"])
    loss_fn = nn.BCELoss()
    B = spec["batch_size"]
    xs_t, xd_t, y_t = torch.from_numpy(xs), torch.from_numpy(xd), torch.from_numpy(y)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(spec["seed"]))
    n_batches = len(y) // B  # drop_last, as opengem's trainer
    model.train()
    t0 = time.perf_counter()
    for b in range(n_batches):
        idx = perm[b * B:(b + 1) * B]
        p = forward(xs_t[idx], xd_t[idx]).clamp(1e-7, 1 - 1e-7)
        loss = loss_fn(p, y_t[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    train_s = time.perf_counter() - t0
    model.eval()
    with torch.no_grad():
        pt = torch.from_numpy(ts)
        pd = torch.from_numpy(td)
        preds = torch.cat([forward(pt[i:i + 8192], pd[i:i + 8192]) for i in range(0, len(ty), 8192)]).numpy()
    from sklearn.metrics import log_loss, roc_auc_score

    res = {
        "lib": args.lib, "model": what, "train_rows": n_batches * B, "train_seconds": train_s,
        "examples_per_s": n_batches * B / train_s, "test_rows": int(len(ty)),
        "test_auc": float(roc_auc_score(ty, preds)), "test_logloss": float(log_loss(ty, preds)),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "params": sum(p.numel() for p in model.parameters()), "torch": torch.__version__,
        "last_loss": float(loss),
    }
    args.out.write_text(json.dumps(res))
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
