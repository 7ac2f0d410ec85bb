"""Labels of ``opengem convert table``: a 0/1 column as it is, or one derived from a numeric column.

Grammar (``--label`` takes a comma-separated list of these; the import spec's ``labels`` holds the
same strings, so a spec written by ``--infer-schema`` reads back unchanged):

- ``COL``: the column holds 0/1 already (empty = not observed);
- ``NAME=COL OP NUMBER`` with OP one of ``>= > <= < == !=``: task ``NAME`` is 1 where the column's value
  satisfies the comparison, else 0, and not observed where the value is empty, e.g. ``like=rating>=4``
  (MovieLens) or ``long_view=dwell_ms>30000``. ``COL OP NUMBER`` alone names the task after the column.

Why derived labels exist: rating and dwell-time logs carry the graded signal, not a click bit, and
asking users to pre-compute a 0/1 column means a second copy of a multi-GB file.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

OPS: dict[str, Callable[[np.ndarray, float], np.ndarray]] = {
    ">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt, "==": operator.eq,
    "!=": operator.ne,
}
GRAMMAR = ("COL (a 0/1 column) or NAME=COL OP NUMBER with OP one of >=, >, <=, <, ==, != "
           "(e.g. 'like=rating>=4', quoted in a shell)")
_DERIVED = re.compile(r"^(?:(?P<name>[^=<>!]+?)\s*=(?!=))?\s*(?P<col>[^=<>!]+?)\s*"
                      r"(?P<op>>=|<=|==|!=|>|<)\s*(?P<num>\S+)$")
_PLAIN = re.compile(r"^[^=<>!,]+$")


class LabelSyntaxError(ValueError):
    """A label expression outside :data:`GRAMMAR`; callers turn it into their own one-line error."""


def _number_text(x: float) -> str:
    return str(int(x)) if x.is_integer() and abs(x) < 1e15 else repr(x)


@dataclass(frozen=True)
class LabelRule:
    """Task ``name`` from source column ``column``: as is (``op`` empty) or ``column OP threshold``."""

    name: str
    column: str
    op: str = ""
    threshold: float = 0.0

    @property
    def derived(self) -> bool:
        return bool(self.op)

    def __str__(self) -> str:
        if not self.derived:
            return self.column
        name = "" if self.name == self.column else f"{self.name}="
        return f"{name}{self.column}{self.op}{_number_text(self.threshold)}"

    def apply(self, x: np.ndarray) -> np.ndarray:
        """The task's float values from the column's (float64, NaN = empty): 0/1, NaN stays NaN."""
        if not self.derived:
            return x
        seen = np.isfinite(x)
        y = OPS[self.op](np.where(seen, x, 0.0), self.threshold).astype(np.float64)
        return np.where(seen, y, np.nan)


def parse_label(text: str) -> LabelRule:
    """One label expression -> :class:`LabelRule`; anything else raises :class:`LabelSyntaxError`."""
    t = text.strip()
    if not t:
        raise LabelSyntaxError("empty label")
    if _PLAIN.match(t):
        return LabelRule(t, t)
    m = _DERIVED.match(t)
    if m is None:
        raise LabelSyntaxError(f"{text!r} is not {GRAMMAR}")
    col, op = m["col"].strip(), m["op"]
    name = (m["name"] or col).strip()
    try:
        value = float(m["num"])
    except ValueError:
        raise LabelSyntaxError(f"{text!r}: {m['num']!r} is not a number ({GRAMMAR})") from None
    if not math.isfinite(value):
        raise LabelSyntaxError(f"{text!r}: the threshold must be a finite number")
    return LabelRule(name, col, op, value)


def parse_labels(texts: list[str]) -> list[LabelRule]:
    """Several expressions; two tasks with one name raise :class:`LabelSyntaxError`."""
    rules = [parse_label(t) for t in texts]
    names = [r.name for r in rules]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise LabelSyntaxError(f"task name {dup[0]!r} given twice (name derived labels: NAME=COL OP NUMBER)")
    return rules
