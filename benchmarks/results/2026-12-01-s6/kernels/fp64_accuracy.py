"""Which kernel path is closer to float64 (issue 13)? GEM-small's trunk and head, everything the kernels
touch, on fp32 embeddings of random batches: one forward and backward per path, errors against the same
weights run in float64 on the reference path.

Why: if the fused path lost precision (a cancellation, a sum in a worse order) its gradients would sit
farther from float64 than the reference's, and a training gap could come from that. Uses the model section
of configs/small.toml as tests/test_model_kernels.py builds it (small vocabularies; tables are not touched).

Usage: python fp64_accuracy.py [RUN_DIR DATA_DIR]   (from the repository root, so that tests/ is importable)
With a run: its trained weights (``open_run``) on the first three batches of its evaluation rows instead.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch
from torch import nn

from opengem.data.random_batch import random_batch
from opengem.data.sim_config import sim_schema
from opengem.model.gem import merge_sequences
from opengem.model.heads import masked_bce
from opengem.model.registry import build_model
from opengem.model.sequence import use_kernel
from opengem.train.data import make_loader
from opengem.train.evaluate import open_run

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "tests"))
from test_model_kernels import _small_recipe  # noqa: E402


def trunk_logits(m, e, batch, dtype: torch.dtype) -> torch.Tensor:  # noqa: ANN001
    """GEM.forward after the embedding lookups, in ``dtype``."""
    seq, mask = merge_sequences([(e.sequences[g].values.to(dtype), e.sequences[g].mask) for g in m.groups],
                                m.group_type)
    seq, mask = m.encoder(seq, mask, e.target.to(dtype))
    h, _, _ = m.interformer(e.tokens.to(dtype), seq, mask)
    return m.head(h, batch.surface)[0]


def compare(model: nn.Module, cases) -> None:  # noqa: ANN001
    """``cases``: (label, batch, embedded features) triples; ``model`` has groups, encoder, interformer,
    head and group_type as GEM does."""
    for label, batch, e in cases:
        ref, res = None, {}
        paths = (("fp64", "pytorch", torch.float64), ("reference", "pytorch", torch.float32),
                 ("fused", "fused", torch.float32))
        for name, kernel, dtype in paths:
            m = use_kernel(copy.deepcopy(model).to(dtype), kernel)
            logits = trunk_logits(m, e, batch, dtype)
            masked_bce(logits, batch.labels.to(dtype), batch.label_mask).backward()
            g = {n: p.grad.double() for n, p in m.named_parameters()
                 if p.grad is not None and not n.startswith("embedding")}
            if ref is None:
                ref = (logits.detach(), g)
                continue
            err = sum(float((g[n] - ref[1][n]).norm() ** 2) for n in ref[1]) ** 0.5
            norm = sum(float(ref[1][n].norm() ** 2) for n in ref[1]) ** 0.5
            res[name] = (float((logits.detach().double() - ref[0]).abs().max()), err / norm)
        print(f"{label}: max |logit - fp64| / relative gradient error vs fp64: "
              + ", ".join(f"{k} {a:.2e} / {b:.2e}" for k, (a, b) in res.items()), flush=True)


class Trunk(nn.Module):
    """A trained GEM's dense blocks, copied out of its parallel wrapper (the tables stay behind)."""

    def __init__(self, gem: nn.Module) -> None:
        super().__init__()
        self.groups = gem.groups
        self.group_type = gem.group_type
        self.encoder, self.interformer, self.head = gem.encoder, gem.interformer, gem.head


def main(args: list[str]) -> None:
    torch.set_num_threads(1)
    if not args:
        mcfg, sim = _small_recipe()
        schema = sim_schema(sim)
        torch.manual_seed(0)
        model = build_model(schema, mcfg)
        batches = [(f"random batch seed {s}", random_batch(schema, 256, seed=s)) for s in (5, 6, 7)]
        with torch.no_grad():
            compare(model, [(label, b, model.embedding(b)) for label, b in batches])
        return
    with open_run(args[0], args[1]) as r:
        gem = getattr(r.model, "module", r.model)
        loader = make_loader(r.ds, r.cfg.data.eval, r.cfg.data, train=False)
        cases = []
        with torch.no_grad():
            for i, batch in zip(range(3), loader):
                cases.append((f"trained, eval batch {i}", batch, gem.embedding(batch)))
        compare(Trunk(gem), cases)


if __name__ == "__main__":
    main(sys.argv[1:])
