"""Where GEM's training starts to depend on the CPU's vector ISA: one forward + backward of a study run's
model on its first batch, every module's output (in call order) and every gradient saved, for two processes
to compare.

    python isa_trace.py RUN/config.toml default.pt
    ATEN_CPU_CAPABILITY=avx2 python isa_trace.py RUN/config.toml avx2.pt
    python isa_trace.py --compare default.pt avx2.pt
"""

from __future__ import annotations

import sys

import torch

from opengem.train.config import load_run_config
from opengem.train.data import prepare_data
from opengem.train.step import forward_loss
from opengem.train.trainer import Trainer


def trace(config: str, out_path: str) -> None:
    cfg = load_run_config(config, [])
    data = prepare_data(cfg.data, "/tmp/unused", cfg.data.path)
    out: dict[str, torch.Tensor] = {}
    with Trainer(cfg, None, data) as trainer:
        batch = next(iter(trainer.train_loader())).to(trainer.device)
        model = trainer.parallel.plain

        def hook(name: str):  # noqa: ANN202
            def record(_m: torch.nn.Module, _a: object, o: object) -> None:
                t = o[0] if isinstance(o, tuple | list) else o
                if isinstance(t, torch.Tensor):
                    out[f"{len(out):04d} {name}"] = t.detach().clone()
            return record

        for name, m in model.named_modules():
            if name:
                m.register_forward_hook(hook(name))
        forward_loss(trainer.parallel.model, batch, trainer.weights, cfg.train, trainer.device).backward()
        out.update({f"grad {n}": p.grad.detach().clone() for n, p in model.named_parameters()
                    if p.grad is not None})
    torch.save(out, out_path)


def compare(a_path: str, b_path: str) -> None:
    a, b = torch.load(a_path), torch.load(b_path)
    fwd = [k for k in a if not k.startswith("grad")]
    differ = [k for k in fwd if not torch.equal(a[k], b[k])]
    for k in differ[:6]:
        print(f"differs: {k} {tuple(a[k].shape)} max |diff| {(a[k] - b[k]).abs().max().item():.3g}")
    print(f"module outputs equal: {len(fwd) - len(differ)} of {len(fwd)}; first that differs: "
          f"{differ[0] if differ else 'none'}")
    grads = [k for k in a if k.startswith("grad")]
    print(f"gradients equal: {sum(torch.equal(a[k], b[k]) for k in grads)} of {len(grads)}")


if __name__ == "__main__":
    compare(sys.argv[2], sys.argv[3]) if sys.argv[1] == "--compare" else trace(sys.argv[1], sys.argv[2])
