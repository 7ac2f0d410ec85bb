"""Under CPU bf16 autocast DCNv2 casts its interaction input once (ops/cpu_autocast.to_cpu_autocast_dtype):
the cross layers and the final concat then stay in bf16, instead of casting the [B, D] activation at every
cross layer and promoting the concat back to fp32 (about a fifth of the bf16 step at the peer settings)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from opengem.data.random_batch import random_batch
from opengem.data.sim_config import SimConfig, sim_schema
from opengem.model.registry import build_model
from opengem.ops.cpu_autocast import to_cpu_autocast_dtype
from opengem.train.config import load_run_config

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.toml"
B = 96  # no layer is this wide, so a cast with B rows is an activation, never a weight


class CastCounter(TorchDispatchMode):
    """Counts dtype casts of tensors with ``rows`` rows (activations, not weights)."""

    def __init__(self, rows: int) -> None:
        super().__init__()
        self.rows, self.casts, self.shapes = rows, 0, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten._to_copy.default and args[0].dim() == 2 and args[0].shape[0] == self.rows \
                and args[0].shape[1] > 16:
            self.casts += 1
            self.shapes.append((tuple(args[0].shape), args[0].dtype, out.dtype))
        return out


def _dcnv2() -> tuple[torch.nn.Module, object]:
    cfg = load_run_config(TINY, ["model.name=dcnv2", "model.dcnv2.num_cross_layers=3",
                                 "model.dcnv2.deep_mlp=[64,64]", "model.dcnv2.structure='parallel'"]).model
    schema = sim_schema(SimConfig.from_dict(tomllib.loads(TINY.read_text())["data"]["sim"]))
    torch.manual_seed(0)
    return build_model(schema, cfg), schema


def test_dcnv2_casts_its_wide_activations_once_under_cpu_bf16_autocast():
    model, schema = _dcnv2()
    batch = random_batch(schema, B, seed=0)
    counter = CastCounter(B)
    with counter:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(batch).logits
        out.float().sum().backward()
    # x0 once forward and its gradient once back (casting at every use made 15 casts of [B, D] here)
    assert counter.casts == 2, counter.shapes
    for p in model.parameters():  # master weights stay fp32
        assert p.dtype == torch.float32


def test_dcnv2_bf16_stays_close_to_fp32_and_fp32_is_unchanged():
    model, schema = _dcnv2()
    batch = random_batch(schema, B, seed=1)
    with torch.no_grad():
        fp32 = model(batch).logits
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16 = model(batch).logits.float()
    assert (bf16 - fp32).abs().max().item() < 0.1  # bf16 rounding of a few products, not a different model
    x = torch.randn(3, 5)
    assert to_cpu_autocast_dtype(x) is x  # no autocast: untouched
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert to_cpu_autocast_dtype(x).dtype == torch.bfloat16
        assert to_cpu_autocast_dtype(torch.arange(3)).dtype == torch.int64
