"""Which implementation an op runs: the ``kernel`` argument every public op in ``opengem.ops`` takes.

Each ``ops/<op>.py`` validates ``kernel`` here and dispatches to ``ops/pytorch/pt_<op>.py`` (the reference,
plain PyTorch plus FBGEMM's jagged ops). Faster variants (``ops/triton/triton_<op>.py``, compiled CPU
regions) join by adding a member to :class:`Kernel` and a branch in the op; until one exists, naming it is
an error rather than a silent fallback to the reference, so a benchmark never measures the wrong kernel.
"""

from __future__ import annotations

from enum import StrEnum


class Kernel(StrEnum):
    """Implementations an op may run. ``Kernel.PYTORCH == "pytorch"``: plain strings work too."""

    PYTORCH = "pytorch"


_BY_NAME: dict[str, Kernel] = {k.value: k for k in Kernel}


def resolve_kernel(kernel: Kernel | str) -> Kernel:
    """The :class:`Kernel` named by ``kernel``; ValueError naming the choices for anything else.

    A dict lookup (not ``Kernel(kernel)``) so that torch.compile and FX tracing see a constant.
    """
    found = _BY_NAME.get(kernel) if isinstance(kernel, str) else None
    if found is None:
        raise ValueError(f"kernel {kernel!r} is not one of: {', '.join(_BY_NAME)}")
    return found
