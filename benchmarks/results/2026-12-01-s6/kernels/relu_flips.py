"""How often do the two kernel paths disagree on the sign of a Wukong FMB pre-activation (issue 13)?

Why: along a training run the two paths' gradients agree to ~1e-6 on all but rare steps, where the FMB's
inner parameters (Y, fm_ln, the first MLP layer) differ by ~1e-3 (gradcheck_seed0.txt, step 105) while
the loss agrees to every printed digit. A ReLU input within rounding of zero does exactly that: the forward
changes by a rounding error, the backward passes or blocks one example's whole gradient for that unit.
This counts such sign disagreements on a trained GEM's real rows: the model runs each batch once per kernel,
each Wukong layer's input is captured, and the first MLP layer's pre-activation is computed from it (the
FMB ops themselves give bit-identical results on the same input, measured: what differs is their input,
through rounding upstream).

Usage: python relu_flips.py RUN_DIR DATA_DIR [BATCHES]
"""

from __future__ import annotations

import sys
import warnings

import torch
import torch.nn.functional as F

from opengem.model.sequence import use_kernel
from opengem.model.wukong import WukongLayer
from opengem.ops.pytorch import pt_fmb
from opengem.train.data import make_loader
from opengem.train.evaluate import open_run


def pre_activation(layer: WukongLayer, x: torch.Tensor) -> torch.Tensor:
    h = pt_fmb.fm_product(x, layer._y(x)).flatten(1)
    h = F.layer_norm(h, (h.shape[1],), layer.fm_ln.weight, layer.fm_ln.bias, layer.fm_ln.eps)
    first = layer.mlp[0]
    return F.linear(h, first.weight, first.bias)


def main(run_dir: str, data_dir: str, batches: int) -> None:
    warnings.filterwarnings("ignore", category=FutureWarning)
    torch.set_num_threads(1)
    with open_run(run_dir, data_dir) as r, torch.no_grad():
        layers = {n: m for n, m in r.model.named_modules() if isinstance(m, WukongLayer)}
        inputs: dict[str, torch.Tensor] = {}
        for name, layer in layers.items():
            layer.register_forward_hook(lambda _m, args, _out, name=name: inputs.__setitem__(name, args[0]))
        total = {n: [0, 0] for n in layers}
        loader = make_loader(r.ds, r.cfg.data.eval, r.cfg.data, train=False)
        for i, batch in zip(range(batches), loader):
            batch = batch.to_device(r.device)
            pre = {}
            for kernel in ("pytorch", "fused"):
                use_kernel(r.model, kernel)
                r.model(batch)
                pre[kernel] = {name: pre_activation(layer, inputs[name]) for name, layer in layers.items()}
            for name in layers:
                ref, fused = pre["pytorch"][name], pre["fused"][name]
                flips = int(((ref > 0) != (fused > 0)).sum())
                total[name][0] += flips
                total[name][1] += ref.numel()
                print(f"batch {i} {name}: {flips} sign flips of {ref.numel()} pre-activations, "
                      f"max |ref - fused| {float((ref - fused).abs().max()):.1e}", flush=True)
        for name, (flips, n) in total.items():
            print(f"{name}: {flips} flips in {n} pre-activations ({flips / n:.1e} per value, "
                  f"{flips / n * 512 * layers[name].mlp[0].out_features:.3f} per 512-row step)")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 20)
