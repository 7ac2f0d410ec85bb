"""Ops below model/: jagged <-> padded conversion and attention, each choosing a kernel.

Layout after meta-recsys/generative-recommenders: ``ops/<op>.py`` is the public op and dispatches on its
``kernel`` argument to ``ops/pytorch/pt_<op>.py`` (the reference) or, later, to a faster variant
(``ops/triton/``, compiled CPU regions). ops/ imports only torch (and FBGEMM's ops), never model/ or data/,
so both can use it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opengem.ops import attention


def flop_formulas() -> dict[Any, Callable[..., int]]:
    """Every op module's custom FlopCounterMode formulas, for ``FlopCounterMode(custom_mapping=...)``."""
    return {**attention.flop_formulas()}
