"""Serving: export a trained run to a self-contained artifact and score raw requests with it.

``Predictor`` is imported lazily (PEP 562) so that ``from opengem.serve import BadRequest``, or part B's
server modules importing ``opengem.serve.errors``, do not pay for torch and the model stack.
"""

from __future__ import annotations

from typing import Any

from opengem.serve.errors import BadRequest

__all__ = ["Predictor", "BadRequest"]


def __getattr__(name: str) -> Any:
    if name == "Predictor":
        from opengem.serve.predictor import Predictor
        return Predictor
    raise AttributeError(name)
