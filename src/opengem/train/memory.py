"""Memory savers applied to a model from outside (torchtitan style): none changes the model's parameters.

- Activation checkpointing (``apply_activation_checkpointing``): each InterFormer / Wukong / cross-layer
  attention / sequence-encoder layer keeps only its inputs for backward and recomputes its insides
  (``torch.utils.checkpoint``, non-reentrant). The layer's ``forward`` is replaced on the instance instead of
  wrapping the module, so parameter names and checkpoints stay identical with AC on or off.
- bf16 autocast (``autocast``): matmuls and attention in bfloat16, weights and the loss in fp32.
- FP8 saved activations (``fp8_saved_activations``): every float tensor autograd saves for backward (above a
  size threshold, not a parameter) is stored as float8 (e4m3 or e5m2) with one per-tensor scale, and cast back
  when backward needs it. Forward is unchanged; only gradients see the rounding.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from opengem.model.interformer import InterFormerLayer
from opengem.model.sequence import PyramidLevel, TransformerBlock
from opengem.model.wukong import CrossLayerAttention, WukongLayer
from opengem.ops.cpu_autocast import current_thin, thin_products
from opengem.train.config import AC_MODES, FP8_MODES, PRECISIONS

FP8_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def checkpoint_layer_types() -> tuple[type[nn.Module], ...]:
    """The modules AC wraps: one per GEM layer."""
    return (InterFormerLayer, WukongLayer, CrossLayerAttention, PyramidLevel, TransformerBlock)


def _checkpointed_forward(module: nn.Module) -> Callable[..., Any]:
    inner = module.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():  # evaluation: nothing is saved, nothing to recompute
            return inner(*args, **kwargs)
        # Recompute must see the arguments as they were: a list the caller appends to after the call
        # (InterFormer's cross-layer memory) would otherwise be longer at backward time.
        args = tuple(list(a) if isinstance(a, list) else a for a in args)
        kwargs = {k: list(v) if isinstance(v, list) else v for k, v in kwargs.items()}
        # eager, the recompute runs in backward, outside the step's thin_products: it re-enters the forward's
        # choice. Compiled, the region is traced once with the choice in force (guarded on) and the recompute
        # replays that graph; dynamo also takes no context_fn but selective checkpointing's. The default
        # choice needs neither, so its path stays checkpoint's plain call.
        thin = current_thin()
        if thin == "fp32" or torch.compiler.is_compiling():
            return checkpoint(inner, *args, use_reentrant=False, **kwargs)
        return checkpoint(inner, *args, use_reentrant=False,
                          context_fn=lambda: (contextlib.nullcontext(), thin_products(thin)), **kwargs)

    return forward


def apply_activation_checkpointing(model: nn.Module, mode: str = "layer",
                                   types: tuple[type[nn.Module], ...] | None = None) -> list[str]:
    """Checkpoint every outermost module of ``types`` (default: GEM's layers); returns their names.

    Outermost only: a TransformerBlock inside an already checkpointed PyramidLevel would be recomputed twice.
    """
    if mode not in AC_MODES:
        raise ValueError(f"train.activation_checkpointing: {mode!r} is not one of {', '.join(AC_MODES)}")
    if mode == "none":
        return []
    types = types or checkpoint_layer_types()
    wrapped: list[str] = []
    skip: list[str] = []
    for name, m in model.named_modules():
        if any(name.startswith(p + ".") for p in skip) or not isinstance(m, types):
            continue
        if getattr(m, "_opengem_ac", False):
            skip.append(name)
            continue
        m.forward = _checkpointed_forward(m)  # type: ignore[method-assign]
        m._opengem_ac = True
        wrapped.append(name)
        skip.append(name)
    return wrapped


def autocast(precision: str, device: torch.device,
             thin: str = "fp32") -> contextlib.AbstractContextManager[Any]:
    """bf16 autocast for ``precision == "bf16"``, a no-op for fp32. ``thin`` (``train.cpu_bf16_thin``):
    whether GEM's thin products join it on CPU (``opengem.ops.cpu_autocast.thin_products``)."""
    if precision not in PRECISIONS:
        raise ValueError(f"train.precision: {precision!r} is not one of {', '.join(PRECISIONS)}")
    if precision == "fp32":
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(torch.autocast(device_type=device.type, dtype=torch.bfloat16))
    stack.enter_context(thin_products(thin))
    return stack


def bf16_matmul_support(device: torch.device) -> bool | None:
    """Whether this device multiplies bf16 matrices in hardware; None where torch cannot say.

    CPU: AVX-512-BF16 dot products or AMX tiles. Without either, oneDNN and ATen emulate bf16 through fp32
    and a bf16 matmul runs several times slower than an fp32 one (session 51's Intel AVX-512 host: bf16
    peak 32 GFLOP/s against fp32 149). GPU: torch's own check (Ampere and later, without emulation).
    """
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    if device.type != "cpu":
        return None
    names = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    probes = [getattr(torch.cpu, name, None) for name in names]
    if any(p is None for p in probes):  # private torch API: absent in another version means "unknown"
        return None
    return any(bool(p()) for p in probes)  # type: ignore[misc]


def slow_bf16_warning(precision: str, device: torch.device) -> str | None:
    """The warning a ``train.precision = "bf16"`` run gets on a device without bf16 matrix units, or None."""
    if precision != "bf16" or bf16_matmul_support(device) is not False:
        return None
    if device.type == "cpu":
        lacks = "CPU has neither AVX-512-BF16 nor AMX"
        measured = " (session 51, such a CPU: DCNv2 0.47x, GEM-small 0.9x its fp32 examples/s)"
    else:
        lacks, measured = f"{device.type} device has no native bf16", ""
    return (f"train.precision = \"bf16\" but this {lacks}: bf16 matmuls are emulated and run slower than "
            f"fp32{measured}; train.precision = \"fp32\" is faster here")


# --------------------------------------------------------------------------- FP8 saved activations
@dataclass
class SavedTensorStats:
    """Bytes autograd was asked to save and bytes actually kept (after FP8 packing)."""

    tensors: int = 0
    packed: int = 0  # tensors stored as FP8
    bytes_in: int = 0  # what default autograd would keep (shared storages counted once per saving)
    bytes_kept: int = 0
    _seen: dict[int, Any] = field(default_factory=dict, repr=False)

    @property
    def ratio(self) -> float:
        return self.bytes_in / max(self.bytes_kept, 1)


@dataclass
class _FP8Packed:
    data: torch.Tensor
    scale: torch.Tensor
    dtype: torch.dtype
    size: tuple[int, ...]
    stride: tuple[int, ...]


def fp8_pack(t: torch.Tensor, fp8: torch.dtype) -> _FP8Packed | torch.Tensor:
    """Per-tensor scaling: amax maps to the format's largest finite value, so nothing overflows.

    A tensor holding inf or NaN (e.g. attention's log-sum-exp of a fully masked row) is returned as it is:
    no scale represents it.
    """
    fmax = torch.finfo(fp8).max
    amax = t.detach().abs().amax().float()
    if not bool(torch.isfinite(amax)):
        return t
    scale = torch.where(amax > 0, amax / fmax, torch.ones_like(amax))
    data = (t.detach().float() / scale).clamp(-fmax, fmax).to(fp8)
    return _FP8Packed(data, scale, t.dtype, tuple(t.shape), tuple(t.stride()))


def fp8_unpack(p: _FP8Packed) -> torch.Tensor:
    """Back to the saved dtype with the saved strides: compiled backward graphs assert them."""
    x = (p.data.float() * p.scale).to(p.dtype)
    if x.stride() != p.stride:
        x = torch.empty_strided(p.size, p.stride, dtype=p.dtype, device=x.device).copy_(x)
    return x


def _should_pack(t: torch.Tensor, min_numel: int) -> bool:
    if not t.is_floating_point() or t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2, torch.float64):
        return False
    if isinstance(t, nn.Parameter) or (t.is_leaf and t.requires_grad):
        return False  # a parameter stays resident anyway: an FP8 copy would add memory, not save it
    return t.numel() >= min_numel


@contextlib.contextmanager
def fp8_saved_activations(mode: str = "e4m3", min_numel: int = 4096,
                          stats: SavedTensorStats | None = None) -> Iterator[SavedTensorStats]:
    """Within the block, store saved activations as FP8 (``mode``) or keep them (``"off"``), counting bytes.

    Run the forward inside the block; backward may run outside (unpacking does not need the hooks).
    With ``mode="off"`` the hooks only count, so the same code measures the baseline.
    A tensor saved by several ops is packed once (looked up by identity while it is alive).
    """
    if mode not in FP8_MODES:
        raise ValueError(f"train.fp8_saved_activations: {mode!r} is not one of {', '.join(FP8_MODES)}")
    st = stats if stats is not None else SavedTensorStats()
    fp8 = FP8_DTYPES.get(mode)

    def pack(t: torch.Tensor) -> Any:
        key = id(t)
        hit = st._seen.get(key)
        if hit is not None and hit[0]() is t:
            return hit[1]
        st.tensors += 1
        nbytes = t.numel() * t.element_size()
        st.bytes_in += nbytes
        if fp8 is None or not _should_pack(t, min_numel):
            st.bytes_kept += nbytes
            out: Any = t
        else:
            out = fp8_pack(t, fp8)
            if isinstance(out, _FP8Packed):
                st.packed += 1
                st.bytes_kept += out.data.numel() + 4
            else:
                st.bytes_kept += nbytes
        with contextlib.suppress(TypeError):
            st._seen[key] = (weakref.ref(t), out)
        return out

    def unpack(p: Any) -> torch.Tensor:
        return fp8_unpack(p) if isinstance(p, _FP8Packed) else p

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield st
    finally:
        st._seen.clear()


def maybe_fp8_saved_activations(mode: str, min_numel: int) -> contextlib.AbstractContextManager[Any]:
    """The trainer's form: no hooks at all when off (the count-only hooks cost a little time)."""
    return contextlib.nullcontext() if mode == "off" else fp8_saved_activations(mode, min_numel)
