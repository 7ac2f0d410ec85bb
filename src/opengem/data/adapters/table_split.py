"""Which split a source row goes to, decided row by row so that it can be streamed.

- ``random``: a seeded splitmix64 hash of the row number gives u in [0, 1): u < test_frac -> test,
  u < test_frac + valid_frac -> valid, else train. No state, so pass 1 and pass 2 agree exactly.
- ``time``: cuts at the (1 - valid - test) and (1 - test) quantiles of the time column (read in a first
  pass, 8 bytes a row): the sorted times' values at positions floor(q N), the MovieLens adapters' rule,
  so that both give the same split; ties at a cut go to the later split, so no valid/test row is older
  than a train row.
- ``files``: the user named a source per split (``--src train=... --src test=...``); a split without a
  source is carved from the train source's rows by the same hash as ``random``.

``exact`` (``--exact-holdout``, ``random`` and ``files`` modes): the threshold rule above holds out about
frac * N rows; the exact rule holds out exactly round(frac * N) rows of the split's source (N counted in a
first pass), those with the smallest key = splitmix64(row within the source + seed * 0x9E3779B97F4A7C15):
test the n_test smallest, valid the next n_valid. With seed 0 the key is splitmix64(row), the frappe_x1
adapter's rule, so the importer reproduces that adapter's held-out rows. splitmix64 is a bijection of
uint64, so distinct rows never tie. Cost: 8 bytes a row of the split's source for the keys, once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from opengem.data.adapters.vocab import splitmix64

SPLITS = ("train", "valid", "test")
TRAIN, VALID, TEST = 0, 1, 2
MODES = ("random", "time", "files")
GOLDEN_GAMMA = 0x9E3779B97F4A7C15  # splitmix64's own increment: seeds map to far-apart key streams
U64 = 0xFFFFFFFFFFFFFFFF
KEY_CHUNK = 1 << 20


def uniform(rows: np.ndarray, seed: int) -> np.ndarray:
    """A fixed pseudo-random number in [0, 1) per row number (and seed)."""
    h = splitmix64(splitmix64(rows.astype(np.uint64)) ^ np.uint64(seed & 0xFFFFFFFFFFFFFFFF))
    return (h >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def exact_keys(rows: np.ndarray, seed: int) -> np.ndarray:
    """The exact holdout's sort key of each row number (within its source); seed 0: splitmix64(row)."""
    with np.errstate(over="ignore"):
        return splitmix64(rows.astype(np.uint64) + np.uint64((seed * GOLDEN_GAMMA) & U64))


def holdout_counts(n_rows: int, test_frac: float, valid_frac: float) -> tuple[int, int]:
    """(n_test, n_valid) = round(frac * N) each, Python's round as in the frappe_x1 adapter."""
    return int(round(test_frac * n_rows)), int(round(valid_frac * n_rows))


@dataclass
class SplitRule:
    mode: str
    valid_frac: float = 0.1
    test_frac: float = 0.1
    seed: int = 0
    cuts: tuple[int, int] | None = None  # time mode: (valid cut, test cut)
    carve: tuple[str, ...] = ()  # files mode: splits carved from the train source
    quantiles: bool = True  # time mode: cuts computed from the data (False: given by the user)
    exact: bool = False  # hold out exactly round(frac * N) rows (see the module docstring)
    # exact: (first row of the split's source, N, n_test, n_valid) and the key cuts (None: every row)
    exact_rows: tuple[int, int, int, int] | None = None
    key_cuts: tuple[int | None, int | None] = (None, None)

    def __post_init__(self) -> None:
        if self.mode == "time" and self.cuts is not None:
            self.quantiles = False

    @property
    def hashed_splits(self) -> tuple[bool, bool]:
        """(test, valid): whether each is drawn by the hash from the (train) source's rows."""
        return (self.mode == "random" or "test" in self.carve, self.mode == "random" or "valid" in self.carve)

    def set_exact_cuts(self, first_row: int, n_rows: int) -> None:
        """Key cuts such that exactly n_test rows have key < test cut and n_valid more key < valid cut."""
        hashed_test, hashed_valid = self.hashed_splits
        n_test, n_valid = holdout_counts(n_rows, self.test_frac if hashed_test else 0.0,
                                         self.valid_frac if hashed_valid else 0.0)
        keys = np.empty(n_rows, np.uint64)
        for a in range(0, n_rows, KEY_CHUNK):  # in chunks: the temporaries stay small
            keys[a:a + KEY_CHUNK] = exact_keys(np.arange(a, min(a + KEY_CHUNK, n_rows)), self.seed)
        at = [k for k in (n_test, n_test + n_valid) if k < n_rows]
        if at:
            keys.partition(at)  # in place: the 8-byte key array is the only copy

        def cut(k: int) -> int | None:
            return int(keys[k]) if k < n_rows else None

        self.exact_rows = (first_row, n_rows, n_test, n_valid)
        self.key_cuts = (cut(n_test), cut(n_test + n_valid))

    def _exact_assign(self, rows: np.ndarray) -> np.ndarray:
        assert self.exact_rows is not None, "set_exact_cuts first"
        keys = exact_keys(rows - self.exact_rows[0], self.seed)

        def below(c: int | None) -> np.ndarray:
            return np.ones(len(rows), bool) if c is None else keys < np.uint64(c)

        test, valid = below(self.key_cuts[0]), below(self.key_cuts[1])
        return np.where(test, TEST, np.where(valid, VALID, TRAIN)).astype(np.int8)

    def assign(self, rows: np.ndarray, ts: np.ndarray, file_split: int | None) -> np.ndarray:
        """The split code (0 train, 1 valid, 2 test) of each row."""
        if self.mode == "time":
            assert self.cuts is not None
            later = np.where(ts >= self.cuts[0], VALID, TRAIN)
            return np.where(ts >= self.cuts[1], TEST, later).astype(np.int8)
        if self.mode == "files" and file_split != TRAIN:
            return np.full(len(rows), file_split, np.int8)
        if self.exact:
            return self._exact_assign(rows)
        u = uniform(rows, self.seed)
        hashed_test, hashed_valid = self.hashed_splits
        test = self.test_frac if hashed_test else 0.0
        valid = self.valid_frac if hashed_valid else 0.0
        return np.where(u < test, TEST, np.where(u < test + valid, VALID, TRAIN)).astype(np.int8)

    def describe(self) -> str:
        if self.mode == "time":
            assert self.cuts is not None
            q = f"quantiles {1 - self.valid_frac - self.test_frac:.3g}/{1 - self.test_frac:.3g}"
            where = q if self.quantiles else "given cuts"
            return (f"time split at {where} of the time column: train = ts < {self.cuts[0]}, "
                    f"valid = {self.cuts[0]} <= ts < "
                    f"{self.cuts[1]}, test = ts >= {self.cuts[1]} (ties go to the later split)")
        hashed = (f"a splitmix64 hash of the row number with seed {self.seed}: test if u < {self.test_frac}, "
                  f"valid if u < {self.test_frac + self.valid_frac}")
        if self.exact:
            assert self.exact_rows is not None
            _, n, n_test, n_valid = self.exact_rows
            hashed_test, hashed_valid = self.hashed_splits
            parts = []
            if hashed_test:
                parts.append(f"test = the {n_test} smallest keys (round({self.test_frac} * {n}))")
            if hashed_valid:
                which = f"next {n_valid}" if hashed_test else f"{n_valid} smallest keys"
                parts.append(f"valid = the {which} (round({self.valid_frac} * {n}))")
            hashed = (f"an exact holdout of the {n} source rows by key splitmix64(row + seed * "
                      f"0x9E3779B97F4A7C15) with seed {self.seed}: {', '.join(parts)}")
        if self.mode == "random":
            return f"random split by {hashed}, else train"
        carved = f"; {', '.join(self.carve)} carved from the train source by {hashed}" if self.carve else ""
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
