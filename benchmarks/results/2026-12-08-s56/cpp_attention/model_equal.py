"""GEM-small (configs/small.toml) on one batch, the C++ attention core vs SDPA: logits and every dense
parameter's gradient from the same weights (the tables restored between the two: their fused optimizer
updates them inside backward).

    .venv/bin/python benchmarks/results/2026-12-08-s56/cpp_attention/model_equal.py DATA
"""
import copy
import sys

import opengem.ops.cpp.cpp_attention as ca
from opengem.train.config import load_run_config
from opengem.train.trainer import Trainer

cfg = load_run_config("configs/small.toml", ["train.progress=false", "train.threads=1"])
built = ca.supports
with Trainer(cfg, None, sys.argv[1]) as trainer:
    batch = next(iter(trainer.train_loader())).to_device(trainer.device)
    model = trainer.model
    state = copy.deepcopy(model.state_dict())
    outs, grads = {}, {}
    for arm, fn in (("sdpa", lambda q, k: False), ("cpp", built)):
        ca.supports = fn
        model.load_state_dict(state)
        model.zero_grad(set_to_none=True)
        out = model(batch)
        logits = out.logits if hasattr(out, "logits") else out
        outs[arm] = logits.detach().clone()
        logits.float().pow(2).mean().backward()
        grads[arm] = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    diff = (outs["sdpa"] - outs["cpp"]).abs().max().item()
    print(f"logits max |diff| {diff:.2e} (max |logit| {outs['sdpa'].abs().max().item():.2f})")
    rel = sorted((((grads["sdpa"][n] - grads["cpp"][n]).norm() / (grads["sdpa"][n].norm() + 1e-30)).item(), n)
                 for n in grads["sdpa"])[::-1]
    for r, n in rel[:5]:
        print(f"gradient relative diff {r:.2e} {n}")
