"""Which split a source row goes to, decided row by row so that it can be streamed.

- ``random``: a seeded splitmix64 hash of the row number gives u in [0, 1): u < test_frac -> test,
  u < test_frac + valid_frac -> valid, else train. No state, so pass 1 and pass 2 agree exactly.
- ``time``: cuts at the (1 - valid - test) and (1 - test) quantiles of the time column (read in a first
  pass, 8 bytes a row): the sorted times' values at positions floor(q N), the MovieLens adapters' rule,
  so that both give the same split; ties at a cut go to the later split, so no valid/test row is older
  than a train row.
- ``files``: the user named a source per split (``--src train=... --src test=...``); a split without a
  source is carved from the train source's rows by the same hash as ``random``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from opengem.data.adapters.vocab import splitmix64

SPLITS = ("train", "valid", "test")
TRAIN, VALID, TEST = 0, 1, 2
MODES = ("random", "time", "files")


def uniform(rows: np.ndarray, seed: int) -> np.ndarray:
    """A fixed pseudo-random number in [0, 1) per row number (and seed)."""
    h = splitmix64(splitmix64(rows.astype(np.uint64)) ^ np.uint64(seed & 0xFFFFFFFFFFFFFFFF))
    return (h >> np.uint64(11)).astype(np.float64) / float(1 << 53)


@dataclass
class SplitRule:
    mode: str
    valid_frac: float = 0.1
    test_frac: float = 0.1
    seed: int = 0
    cuts: tuple[int, int] | None = None  # time mode: (valid cut, test cut)
    carve: tuple[str, ...] = ()  # files mode: splits carved from the train source
    quantiles: bool = True  # time mode: cuts computed from the data (False: given by the user)

    def __post_init__(self) -> None:
        if self.mode == "time" and self.cuts is not None:
            self.quantiles = False

    def assign(self, rows: np.ndarray, ts: np.ndarray, file_split: int | None) -> np.ndarray:
        """The split code (0 train, 1 valid, 2 test) of each row."""
        if self.mode == "time":
            assert self.cuts is not None
            later = np.where(ts >= self.cuts[0], VALID, TRAIN)
            return np.where(ts >= self.cuts[1], TEST, later).astype(np.int8)
        if self.mode == "files" and file_split != TRAIN:
            return np.full(len(rows), file_split, np.int8)
        u = uniform(rows, self.seed)
        test = self.test_frac if self.mode == "random" or "test" in self.carve else 0.0
        valid = self.valid_frac if self.mode == "random" or "valid" in self.carve else 0.0
        return np.where(u < test, TEST, np.where(u < test + valid, VALID, TRAIN)).astype(np.int8)

    def describe(self) -> str:
        if self.mode == "time":
            assert self.cuts is not None
            q = f"quantiles {1 - self.valid_frac - self.test_frac:.3g}/{1 - self.test_frac:.3g}"
            where = q if self.quantiles else "given cuts"
            return (f"time split at {where} of the time column: train = ts < {self.cuts[0]}, "
                    f"valid = {self.cuts[0]} <= ts < "
                    f"{self.cuts[1]}, test = ts >= {self.cuts[1]} (ties go to the later split)")
        hashed = (f"splitmix64 hash of the row number with seed {self.seed}: test if u < {self.test_frac}, "
                  f"valid if u < {self.test_frac + self.valid_frac}")
        if self.mode == "random":
            return f"random split by a {hashed}, else train"
        carved = f"; {', '.join(self.carve)} carved from the train source by a {hashed}" if self.carve else ""
        return "one source per split (--src SPLIT=PATH)" + carved


def time_cuts(ts: np.ndarray, valid_frac: float, test_frac: float) -> tuple[int, int]:
    """(valid cut, test cut): the ts at the (1 - valid - test) and (1 - test) quantiles."""
    if len(ts) == 0:
        return 0, 0
    srt = np.sort(ts)
    n = len(srt)

    def position(q: float) -> int:  # floor(q n); round() first: 1 - 0.1 - 0.1 is 0.7999999999999999
        return min(int(np.floor(round(n * q, 6))), n - 1)

    return int(srt[position(1 - valid_frac - test_frac)]), int(srt[position(1 - test_frac)])
