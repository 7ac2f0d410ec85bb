"""Lockstep check (issue 13): along ONE real training run, the reference and fused kernels' gradients at
every step, on the same weights and the same batch.

Also the gradients of the embedding module's outputs (``emb/...``), which the tables' fused optimizer
receives.

Why: tests/test_model_kernels.py pins the two paths equal on random batches at initialisation; a trained
model's gap needs a state or a batch those tests never draw. This trains GEM through the project's own
Trainer (``Trainer.train_step``, the configured kernel) and, before each step, computes the dense
parameters' gradients of the same loss with both kernels (``torch.autograd.grad`` on the dense parameters
only: the fused sparse optimizer, which updates the tables inside the tables' backward, never runs for these
extra passes). A semantic difference shows as a relative gradient difference far above fp32 rounding (~1e-6)
in the parameters it touches; it prints the worst ones and the first steps that show it.

Usage: python gradcheck.py OUT_DIR [section.key=value ...]   (the recipe of repro.sh, ``train.steps``
overridable; model.gem.kernel = the kernel the run itself trains with; the recipe's periodic evaluation,
train.eval_every, runs between steps as in ``Trainer.fit``)
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import torch

from opengem.model.embedding import FeatureEmbedding
from opengem.model.sequence import use_kernel
from opengem.train.config import load_run_config
from opengem.train.optim import dense_parameters
from opengem.train.step import forward, label_loss
from opengem.train.trainer import Trainer

REPO = Path(__file__).resolve().parents[4]
DATA = "/work/s5/sim875/data"
RECIPE = ["data.train='day=00[0-4]'", "data.eval='day=005'", "train.steps=300", "train.threads=1",
          "train.progress=false", "train.final_eval=false"]


def restore_buffers(model: torch.nn.Module, saved: dict[str, torch.Tensor]) -> None:
    """Put back the buffers a training forward updates (RunningNorm's statistics), so that the extra passes
    here leave the run exactly as ``Trainer.train_step`` alone would."""
    with torch.no_grad():
        for n, b in model.named_buffers():
            if n in saved:
                b.copy_(saved[n])


def grads(trainer: Trainer, batch, kernel: str, names: list[str], params: list[torch.nn.Parameter]
          ) -> tuple[dict[str, torch.Tensor], float]:
    """Gradients of the step's loss under ``kernel``: the dense parameters', and the embedding module's
    outputs' (``emb/...``: what the tables' fused optimizer receives, through a kernel-independent module)."""
    saved = {n: b.clone() for n, b in trainer.model.named_buffers() if b.is_floating_point()}
    use_kernel(trainer.model, kernel)
    captured: list = []
    hooks = [m.register_forward_hook(lambda _m, _a, out: captured.append(out))
             for m in trainer.model.modules() if isinstance(m, FeatureEmbedding)]
    try:
        out = forward(trainer.model, batch, trainer.t, trainer.device)
    finally:
        for h in hooks:
            h.remove()
    emb = captured[0]
    outputs = {"emb/tokens": emb.tokens, "emb/target": emb.target,
               **{f"emb/seq/{g}": s.values for g, s in emb.sequences.items()}}
    loss = label_loss(out, batch, trainer.weights)
    g = torch.autograd.grad(loss, params + list(outputs.values()), allow_unused=True)
    restore_buffers(trainer.model, saved)
    return dict(zip(names + list(outputs), g)), float(loss)


def rel(a: torch.Tensor | None, b: torch.Tensor | None) -> float:
    if a is None or b is None:
        return 0.0 if a is None and b is None else float("inf")
    return float((a - b).norm() / a.norm().clamp(min=1e-12))


def main(out: str, overrides: list[str]) -> None:
    warnings.filterwarnings("ignore", category=FutureWarning)
    cfg = load_run_config(REPO / "configs" / "small.toml", RECIPE + overrides)
    train_kernel = cfg.model.gem.kernel
    trainer = Trainer(cfg, out, DATA, force=True)
    dense = dense_parameters(trainer.model)
    names, params = list(dense), list(dense.values())
    worst: dict[str, tuple[float, int]] = {}
    flagged: list[dict] = []
    step = 0
    with trainer:
        for batch in trainer.train_loader():
            batch = batch.to_device(trainer.device)
            g_ref, l_ref = grads(trainer, batch, "pytorch", names, params)
            g_fus, l_fus = grads(trainer, batch, "fused", names, params)
            diffs = {n: rel(g_ref[n], g_fus[n]) for n in g_ref}
            for n, d in diffs.items():
                if d > worst.get(n, (-1.0, 0))[0]:
                    worst[n] = (d, step)
            big = {n: d for n, d in diffs.items() if d > 1e-3}
            if big:
                flagged.append({"step": step, "loss_ref": l_ref, "loss_fused": l_fus, "params": big})
                print(f"step {step}: relative gradient difference > 1e-3 in {sorted(big)}", flush=True)
            use_kernel(trainer.model, train_kernel)
            trainer.train_step(batch)
            step += 1
            if trainer.validator.should_run(step):  # the recipe's periodic evaluation, as Trainer.fit runs it
                trainer.evaluate(max_batches=trainer.validator.max_batches)
            if step % 25 == 0:
                top = sorted(diffs.items(), key=lambda kv: -kv[1])[:3]
                print(f"step {step}: loss ref {l_ref:.6f} fused {l_fus:.6f}; worst rel grad diff "
                      + ", ".join(f"{n} {d:.1e}" for n, d in top), flush=True)
            if step >= cfg.train.steps:
                break
    ranked = sorted(worst.items(), key=lambda kv: -kv[1][0])
    print("worst relative gradient difference per parameter (step):")
    for n, (d, s) in ranked[:25]:
        print(f"  {d:9.2e} (step {s:3d})  {n}")
    print(f"steps with a difference > 1e-3: {len(flagged)} of {step}")
    for f in flagged[:10]:
        print("  ", json.dumps({**f, "params": dict(sorted(f["params"].items(), key=lambda kv: -kv[1])[:6])}))
    (Path(out) / "gradcheck.json").write_text(json.dumps({"worst": worst, "flagged": flagged}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
