"""C++ twin of the reference masked attention (``attention.cpp``): GEM's many small attentions on the CPU.

The op schemas (``opengem::attention_forward`` / ``attention_backward``), their autograd and their fake
tensors are declared here, so that they exist (and FLOP formulas can name them) before the C++ is built;
``attention.cpp`` only implements them for CPU tensors. The C++ is compiled on first use with
``torch.utils.cpp_extension`` (a C++ compiler and ninja; about 30 s once per machine, then loaded from
``~/.cache/opengem/cpp/``) on x86 CPUs with AVX2 (where torch itself runs AVX2 or AVX-512 kernels; elsewhere
it is not built). :func:`available` says whether that worked; set ``OPENGEM_CPP_KERNELS=0`` to never build
or use it (the models then run SDPA).

Measured against SDPA's CPU flash kernel at GEM-small's shapes (head width 8-16, 2-64 keys, fwd + bwd,
one thread): 1.5-3.8x faster (benchmarks/results/2026-12-08-s56/cpp_attention/).
"""

from __future__ import annotations

import functools
import hashlib
import os
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils import flop_counter

MAX_KEYS = 64  # attention.cpp: MAX_BLOCKS * W
MAX_WIDTH = 256
_SOURCE = Path(__file__).with_name("attention.cpp")

_lib = torch.library.Library("opengem", "FRAGMENT")
_lib.define("attention_forward(Tensor q, Tensor k, Tensor v, Tensor? key_mask) -> (Tensor, Tensor)")
_lib.define("attention_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
            "Tensor? key_mask) -> (Tensor, Tensor, Tensor)")


@torch.library.register_fake("opengem::attention_forward", lib=_lib)
def _forward_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    B, H, Lq, D = q.shape
    out = q.new_empty(B, Lq, H, D).permute(0, 2, 1, 3)
    return out, q.new_empty(B, H, Lq)


@torch.library.register_fake("opengem::attention_backward", lib=_lib)
def _backward_fake(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                   lse: torch.Tensor, key_mask: torch.Tensor | None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    B, H, Lq, D = q.shape
    Lk = k.shape[2]
    return (q.new_empty(B, Lq, H, D).permute(0, 2, 1, 3), k.new_empty(B, Lk, H, D).permute(0, 2, 1, 3),
            v.new_empty(B, Lk, H, D).permute(0, 2, 1, 3))


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, torch.Tensor]) -> None:
    q, k, v, key_mask = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.key_mask = key_mask


def _backward(ctx: Any, dout: torch.Tensor, dlse: torch.Tensor | None) -> tuple[Any, ...]:
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.opengem.attention_backward(dout, q, k, v, out, lse, ctx.key_mask)
    return dq, dk, dv, None


torch.library.register_autograd("opengem::attention_forward", _backward, setup_context=_setup_context,
                                lib=_lib)


def _isa_flags() -> tuple[str, list[str]] | None:
    """A name for the vector ISA torch runs on here and the compiler flags for it (the build is cached per
    name), or None where the kernel is not built: it was written and measured for x86 with AVX2 and FMA.

    ``-mtune=native`` matters: with GCC's generic tuning the same code ran 5-8x slower here (its vector
    loads and stores of the lane blocks); tuning changes scheduling only, so the code still runs on any
    AVX2 machine that shares the cache.
    """
    if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        return "avx2", ["-mavx2", "-mfma", "-mtune=native"]
    return None


_lock = threading.Lock()
_state: dict[str, Any] = {}


def available() -> bool:
    """True once the C++ kernel is built and loaded (building it on the first call); False, with one
    warning saying why, where it cannot be (no compiler, no ninja, ``OPENGEM_CPP_KERNELS=0`` quietly)."""
    if "ok" in _state:
        return _state["ok"]
    with _lock:
        if "ok" not in _state:
            _state["ok"] = _build()
    return _state["ok"]


def _build() -> bool:
    if os.environ.get("OPENGEM_CPP_KERNELS", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    target = _isa_flags()
    if target is None:
        return False
    isa, flags = target
    cflags = ["-O3", "-std=c++17", *flags]
    key = hashlib.sha256("\0".join([_SOURCE.read_text(), *cflags, torch.__version__]).encode()).hexdigest()
    name = f"opengem_attention_{isa}_{key[:16]}"
    folder = _cache_dir() / name
    built, done = folder / f"{name}.so", folder / "complete"
    if done.is_file() and built.is_file():  # built before, by this or another process: ~10 ms, not ~5 s
        try:
            torch.ops.load_library(str(built))
            return True
        except OSError:
            done.unlink(missing_ok=True)  # unreadable: build it again
    path = os.environ.get("PATH", "")
    try:
        from torch.utils.cpp_extension import load

        folder.mkdir(parents=True, exist_ok=True)
        ninja = _ninja_dir()
        os.environ["PATH"] = os.pathsep.join([ninja, path]) if ninja else path
        load(name=name, sources=[str(_SOURCE)], is_python_module=False, extra_cflags=cflags,
             build_directory=str(folder), verbose=False)
        done.write_text(f"{torch.__version__}\n")
    except Exception as e:  # a missing compiler or ninja, a failed build: the models fall back to SDPA
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        warnings.warn(f"opengem: the C++ attention kernel could not be built ({first}); GEM's attention "
                      "runs on SDPA (set OPENGEM_CPP_KERNELS=0 to skip the attempt)", RuntimeWarning,
                      stacklevel=3)
        return False
    finally:
        os.environ["PATH"] = path
    return True


def _cache_dir() -> Path:
    """Where built kernels are kept, one folder per (source, flags, torch) digest."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "opengem" / "cpp"


def _ninja_dir() -> str:
    """Where the ``ninja`` wheel (requirements/) keeps its binary: torch looks for ninja on PATH, which does
    not hold the virtual environment's bin when its python is run by path (as ``make test`` does)."""
    try:
        import ninja
    except ImportError:
        return ""
    return str(ninja.BIN_DIR)


def supports(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether :func:`masked_attention` takes these tensors: CPU, float32 or bfloat16 (computed in
    float32, as the reference does), 1 to 64 keys, head width at most 256, eager (a compiled or exported
    graph keeps the reference SDPA, which Inductor and AOTInductor know), and the kernel built."""
    return (q.device.type == "cpu" and q.dtype in (torch.float32, torch.bfloat16) and k.dtype == q.dtype
            and 1 <= k.shape[-2] <= MAX_KEYS and q.shape[-1] <= MAX_WIDTH
            and not torch.compiler.is_compiling() and not torch.compiler.is_exporting() and available())


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None
                     ) -> torch.Tensor:
    """softmax(q kᵀ / √dh) v per head over masked keys, as ``pt_attention.masked_attention``: q [B, H, Lq,
    dh], k and v [B, H, Lk, dh] of any strides, key_mask [B, Lk] bool. -> [B, H, Lq, dh], a head-major
    view of a token-major [B, Lq, H, dh] tensor (so merging the heads is free)."""
    if not available():
        raise RuntimeError("the C++ attention kernel is not available (see the warning above, or "
                           "OPENGEM_CPP_KERNELS)")
    if not 1 <= k.shape[-2] <= MAX_KEYS or q.shape[-1] > MAX_WIDTH:
        raise ValueError(f"cpp attention: 1 to {MAX_KEYS} keys and head width <= {MAX_WIDTH}, got "
                         f"{k.shape[-2]} keys of width {q.shape[-1]}")
    if q.dtype == torch.bfloat16:
        with torch.autocast("cpu", enabled=False):
            o, _ = torch.ops.opengem.attention_forward(q.float(), k.float(), v.float(), key_mask)
        return o.to(q.dtype)
    o, _ = torch.ops.opengem.attention_forward(q, k, v, key_mask)
    return o


def _forward_flop(q: Any, k: Any, v: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    return flop_counter.sdpa_flop_count(q, k, v)


def _backward_flop(dout: Any, q: Any, k: Any, v: Any, *args: Any, out_shape: Any = None,
                   **kwargs: Any) -> int:
    return flop_counter.sdpa_backward_flop_count(dout, q, k, v)


@functools.cache
def flop_formulas() -> dict[Any, Callable[..., int]]:
    """FlopCounterMode formulas for the two ops: SDPA's, so that MFU counts the same work either way."""
    ops = torch.ops.opengem
    return {ops.attention_forward: _forward_flop, ops.attention_backward: _backward_flop}
