"""How much of a GEM run's click logit comes through each InterFormer summary of the history (session 34).

    python mech.py RUN [RUN ...]

On the first evaluation batch of the validation day: the RMS change of the click logit when the history
summary S_sum of layer 0's Cross Arch (read by the Wukong layer's FM) or of the final Cross Arch (read by the
head) is replaced by zeros, and the RMS of each summary slot.
"""
import sys
from collections.abc import Callable

import torch
from torch import nn

from opengem.train.data import make_loader
from opengem.train.evaluate import open_run

SUMMARIES = {"l0": "interformer.layers.0.cross", "final": "interformer.final"}


def find(model: nn.Module, suffix: str) -> nn.Module:
    return next(m for name, m in model.named_modules() if name.endswith(suffix))


def report(run: str) -> None:
    with open_run(run, calibrated=False) as r:
        model = r.model
        batch = next(iter(make_loader(r.ds, "day=006", r.cfg.data, train=False)))
        state: dict[str, object] = {"zero": None}

        def hook(which: str) -> Callable:
            def f(mod: nn.Module, inp: tuple, out: tuple) -> tuple | None:
                x_sum, s_sum = out
                rms = s_sum.pow(2).mean(dim=(0, 2)).sqrt()
                state[f"{which} slot rms"] = [round(float(v), 3) for v in rms]
                return (x_sum, torch.zeros_like(s_sum)) if state["zero"] == which else None
            return f

        for which, suffix in SUMMARIES.items():
            find(model, suffix).register_forward_hook(hook(which))
        with torch.no_grad():
            base = model(batch).logits[:, 0].clone()
            slots = {k: v for k, v in state.items() if k.endswith("rms")}
            moved = {}
            for which in SUMMARIES:
                state["zero"] = which
                moved[which] = round(float((model(batch).logits[:, 0] - base).pow(2).mean().sqrt()), 3)
        print("/".join(run.rstrip("/").split("/")[-3:]), f"click logit sd {float(base.std()):.3f}",
              "logit RMS change with S_sum zeroed:", moved, slots)


for arg in sys.argv[1:]:
    report(arg)
