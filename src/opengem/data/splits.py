"""Partition selectors: which partitions a spec such as ``@all_but_last`` or ``day=00[0-4]`` names.

Kept apart from :mod:`opengem.data.dataset` (which finds partitions on disk) so the rules for choosing
them live in one place.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path

from opengem.errors import DatasetError


def select_partitions(root: str | Path, parts: list[str], spec: str = "@all") -> list[str]:
    """The partitions (in order, each once) that the comma-separated ``spec`` selects among ``parts``."""
    chosen: list[str] = []
    for token in [t.strip() for t in spec.split(",") if t.strip()]:
        if token == "@all":
            hits = parts
        elif token == "@last":
            hits = parts[-1:]
        elif token == "@all_but_last":
            hits = parts[:-1]
        else:
            hits = [p for p in parts if fnmatch.fnmatch(p, token)]
        if not hits:
            raise DatasetError(f"{root}: no partition matches {token!r} (have: {', '.join(parts)})")
        chosen += [h for h in hits if h not in chosen]
    return chosen
