"""The dense layer ``x @ W^T + b``, choosing a kernel (see :mod:`opengem.ops.kernel`).

``pytorch`` runs ``torch.nn.functional.linear`` (the reference); ``onednn`` runs the forward and both
backward products through oneDNN (:mod:`opengem.ops.onednn.onednn_linear`): fp32 CPU tensors only, where
it is 2.2x MKL's sgemm on AMD hosts (measured numbers in :mod:`opengem.ops.onednn`). Which one a training
run uses is decided once per process by :mod:`opengem.train.cpu_linear`.
"""

from __future__ import annotations

import torch

from opengem.ops.kernel import Kernel, resolve_kernel
from opengem.ops.onednn import onednn_linear
from opengem.ops.pytorch import pt_linear

WITH_ONEDNN: tuple[Kernel, ...] = (Kernel.PYTORCH, Kernel.ONEDNN)
MIN_MACS = 1 << 18  # rows x in x out below this: a oneDNN call's fixed cost (~3 us more) outweighs it


def onednn_takes(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Can ``kernel="onednn"`` run these tensors? fp32 on CPU, outside autocast (a bf16 autocast region
    already sends its matmuls to oneDNN) and outside torch.compile (Inductor picks its own GEMMs)."""
    return (x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
            and not torch.is_autocast_enabled("cpu") and not torch.compiler.is_compiling())


def onednn_worth(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """:func:`onednn_takes` and a product of at least ``MIN_MACS`` multiply-adds; a plain tensor weight (an
    FSDP-sharded DTensor goes the default way)."""
    return (type(weight) in (torch.Tensor, torch.nn.Parameter) and onednn_takes(x, weight)
            and x.numel() * weight.shape[0] >= MIN_MACS)


def kernel_for(kernel: Kernel | str, x: torch.Tensor, weight: torch.Tensor) -> Kernel:
    """The kernel a product of ``x`` and ``weight`` runs when a block asks for ``kernel``: oneDNN where it
    was asked for and :func:`onednn_worth` takes the call, the reference otherwise (``train.cpu_linear``
    sets ``onednn`` on a whole model; each call still falls back where oneDNN cannot run or does not pay)."""
    return Kernel.ONEDNN if kernel == Kernel.ONEDNN and onednn_worth(x, weight) else Kernel.PYTORCH


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
           kernel: Kernel | str = Kernel.PYTORCH) -> torch.Tensor:
    """x [..., in], weight [out, in], bias [out] or None -> [..., out]."""
    k = resolve_kernel(kernel, WITH_ONEDNN)
    if k == Kernel.PYTORCH:
        return pt_linear.linear(x, weight, bias)
    if not onednn_linear.available():
        raise RuntimeError("kernel 'onednn' needs a torch built with oneDNN (torch.backends.mkldnn)")
    if not onednn_takes(x, weight):
        raise ValueError(f"kernel 'onednn' runs fp32 CPU tensors outside autocast and compile; got "
                         f"{x.dtype} on {x.device.type}")
    return onednn_linear.linear(x, weight, bias)
