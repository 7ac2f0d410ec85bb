"""Partition selectors: which partitions a spec such as ``@train`` or ``day=00[0-4]`` names.

Kept apart from :mod:`opengem.data.dataset` (which finds partitions on disk) so the rules for choosing
them live in one place.

A dataset has one of two layouts, read from its partition names (what every writer produces, and what
``summary.json`` records):

* **time-partitioned**: every partition is ``day=NNN`` (the simulator). Days are ordered by number.
* **named splits**: every partition is one of ``train``, ``valid``, ``test`` (every adapter in
  :mod:`opengem.data.adapters`, whatever its split rule: random or by time).

A spec is a comma-separated list of fnmatch patterns (``day=00[0-4]``, ``train``) and selectors:

==================  =======================================  ==========================================
selector            time-partitioned                         named splits
==================  =======================================  ==========================================
``@all``            every day (in day order)                 train, valid, test (in this order)
``@train``          every day but the last                   train
``@valid``          the last day ("evaluate on the future")  valid
``@test``           refused: name the held-out day(s)        test
``@all_but_last``   every day but the last                   refused: use @train
``@last``           the last day                             refused: use @valid or @test
==================  =======================================  ==========================================

So a recipe that says ``train = "@train"`` and ``eval = "@valid"`` (the default, and every shipped
recipe) trains on the past and evaluates on the next day of a simulated dataset, and trains on ``train``
and evaluates on ``valid`` of a converted one: it never trains on test nor evaluates on training rows.
``@last``/``@all_but_last`` are refused on named splits because name order is not time order there
(``test`` < ``train`` < ``valid``: "all but last" would train on test and evaluate on valid). A time-
partitioned dataset has no held-out test split, so ``@test`` is refused there rather than guessed: name
the day(s), as ``benchmarks/model_quality.py`` does. Any other layout (partitions named otherwise, or a
mix of the two) accepts only ``@all`` and patterns. :func:`check_disjoint` lets the trainer refuse a
train and eval selection that share a partition.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

from opengem.errors import DatasetError, UsageError


class SelectionError(UsageError, DatasetError):
    """A partition selection (``--partitions``, ``data.train`` / ``data.eval``) that names no partition of
    the dataset, an unknown selector, or training and evaluation partitions that overlap: the command line
    or config is wrong, not the data (exit 2)."""

TIME, NAMED, OTHER = "time", "named", "other"
NAMED_SPLITS = ("train", "valid", "test")
SELECTORS = ("@all", "@train", "@valid", "@test", "@all_but_last", "@last")
_DAY = re.compile(r"day=(\d+)")
_RECIPE = "data.train = '@train', data.eval = '@valid'"


def layout(parts: list[str]) -> str:
    """``"time"`` (all ``day=NNN``), ``"named"`` (all of train/valid/test) or ``"other"``."""
    if parts and all(_DAY.fullmatch(p) for p in parts):
        return TIME
    if parts and all(p in NAMED_SPLITS for p in parts):
        return NAMED
    return OTHER


def spec_tokens(spec: str) -> list[str]:
    """The tokens of a spec; a DatasetError for an empty spec or an unknown ``@`` selector."""
    tokens = [t.strip() for t in str(spec).split(",") if t.strip()]
    if not tokens:
        raise SelectionError(f"empty partition spec {spec!r}: use a selector ({', '.join(SELECTORS)}) "
                           "or partition names such as 'day=00[0-4]'")
    for t in tokens:
        if t.startswith("@") and t not in SELECTORS:
            raise SelectionError(f"unknown partition selector {t!r} in {spec!r}: use one of "
                               f"{', '.join(SELECTORS)} or partition names such as 'day=00[0-4]'")
    return tokens


def _in_time_order(parts: list[str]) -> list[str]:
    return sorted(parts, key=lambda p: int(_DAY.fullmatch(p).group(1)))  # type: ignore[union-attr]


def _selector(root: str | Path, parts: list[str], kind: str, token: str) -> list[str]:
    """The partitions one ``@`` token names on a dataset of layout ``kind``; refusals say why."""
    have = ", ".join(parts)
    if token == "@all":
        return parts
    if kind == TIME:
        if token in ("@last", "@valid"):
            return parts[-1:]
        if token in ("@all_but_last", "@train"):
            if len(parts) < 2:
                raise SelectionError(f"{root}: {token!r} is every day but the last, and the dataset has one "
                                   f"day ({have}): it needs at least two days (or name the partitions)")
            return parts[:-1]
        raise SelectionError(f"{root}: '@test' needs named splits (train/valid/test) and this dataset is "
                           f"partitioned by day ({parts[0]} .. {parts[-1]}): name the held-out day(s), "
                           f"e.g. {parts[-1]!r}, or evaluate on the last day with '@valid'")
    if kind == NAMED:
        if token in ("@last", "@all_but_last"):
            raise SelectionError(f"{root}: {token!r} needs day=NNN partitions in time order, and this "
                                 f"dataset declares named splits ({have}) whose name order is not time "
                                 "order: use '@train', '@valid' or '@test'")
        name = token[1:]
        if name not in parts:
            raise SelectionError(f"{root}: {token!r} selects the {name!r} split, which this dataset does not "
                               f"have (have: {have})")
        return [name]
    raise SelectionError(f"{root}: {token!r} needs day=NNN partitions or named splits train/valid/test, and "
                       f"this dataset's partitions ({have}) are neither: select them by name or pattern")


def select_partitions(root: str | Path, parts: list[str], spec: str = "@all") -> list[str]:
    """The partitions (each once, in spec order) that the comma-separated ``spec`` selects among ``parts``.

    Days come in day order and named splits as train, valid, test; a selector that does not fit the
    dataset's layout raises a DatasetError naming the dataset and the selectors that do.
    """
    tokens = spec_tokens(spec)
    kind = layout(parts)
    if kind == TIME:
        parts = _in_time_order(parts)
    elif kind == NAMED:
        parts = sorted(parts, key=NAMED_SPLITS.index)  # train, valid, test: the order they are used in
    chosen: list[str] = []
    for token in tokens:
        if token.startswith("@"):
            hits = _selector(root, parts, kind, token)
        else:
            hits = [p for p in parts if fnmatch.fnmatch(p, token)]
        if not hits:
            raise SelectionError(f"{root}: no partition matches {token!r} "
                                 f"(have: {', '.join(parts) or 'none'})")
        chosen += [h for h in hits if h not in chosen]
    return chosen


def check_disjoint(train_parts: list[str], eval_parts: list[str], root: str | Path = "",
                   train_spec: str = "", eval_spec: str = "") -> None:
    """Refuse a training selection that shares a partition with the evaluation selection.

    Metrics measured on rows the model trained on look better than they are and nothing flags it; the
    trainer calls this before training whenever it will evaluate.
    """
    shared = [p for p in eval_parts if p in train_parts]
    if shared:
        where = f"{root}: " if str(root) else ""
        raise SelectionError(f"{where}data.train ({train_spec or ','.join(train_parts)!r}) and data.eval "
                           f"({eval_spec or ','.join(eval_parts)!r}) both select {', '.join(shared)}: "
                           f"evaluating on training rows overstates quality; choose disjoint partitions "
                           f"(e.g. {_RECIPE})")
