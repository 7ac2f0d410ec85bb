"""Oracle NE: the true label probabilities scored as if they were a model's predictions.

A simulated dataset knows the probability behind every label, so the NE of those probabilities is the
floor any model can reach on the same rows. Evaluations print it next to a model's NE on exactly the
partitions they score, which turns "NE 0.82" into "0.03 above the best possible". NE follows He et al.
2014: mean log loss over the entropy of the base rate, where the base rate is the empirical positive rate
of that surface x task over the observed labels in the rows scored (so the base-rate predictor has NE 1).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from opengem.data.dataset import Dataset, DatasetError
from opengem.data.schema import FeatureSchema

EPS = 1e-7
TRUTH_PREFIX = "p_"


class NEAccumulator:
    """Streaming NE per key (e.g. ``"feed/click"``): sums of log loss, labels and predictions.

    Holding only sums keeps memory constant whatever the number of rows, and the base rate is known only
    at the end, which is fine because NE's denominator depends on it alone.
    """

    def __init__(self) -> None:
        self._sums: dict[str, np.ndarray] = {}  # key -> [count, positives, logloss, sum_p]

    def update(self, key: str, p: np.ndarray, y: np.ndarray, observed: np.ndarray | None = None) -> None:
        p = np.asarray(p, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        if p.shape != y.shape:
            raise ValueError(f"NEAccumulator[{key}]: {p.shape[0]} predictions for {y.shape[0]} labels")
        if observed is not None:
            p, y = p[observed], y[observed]
        if p.size and (np.isnan(p).any() or np.isnan(y).any()):
            raise ValueError(f"NEAccumulator[{key}]: NaN in predictions or observed labels")
        pc = np.clip(p, EPS, 1.0 - EPS)
        ll = -(y * np.log(pc) + (1.0 - y) * np.log1p(-pc)).sum()
        s = self._sums.setdefault(key, np.zeros(4))
        s += (p.size, y.sum(), ll, p.sum())

    def merge(self, other: NEAccumulator) -> None:
        for k, v in other._sums.items():
            self._sums.setdefault(k, np.zeros(4))
            self._sums[k] += v

    def keys(self) -> list[str]:
        return list(self._sums)

    def count(self, key: str) -> int:
        return int(self._sums[key][0])

    def rate(self, key: str) -> float:
        n, pos, _, _ = self._sums[key]
        return float(pos / n) if n else float("nan")

    def mean_p(self, key: str) -> float:
        n, _, _, sp = self._sums[key]
        return float(sp / n) if n else float("nan")

    def ne(self, key: str) -> float:
        n, pos, ll, _ = self._sums[key]
        if n == 0:
            return float("nan")
        b = pos / n
        if b <= 0.0 or b >= 1.0:
            return float("nan")  # entropy 0: NE undefined when every observed label is the same
        entropy = -(b * math.log(b) + (1.0 - b) * math.log1p(-b))
        return float(ll / n / entropy)

    def results(self) -> dict[str, float]:
        return {k: self.ne(k) for k in sorted(self._sums)}

    def pooled_by_task(self) -> NEAccumulator:
        """``all/<task>`` keys summed over surfaces (pooled as the evaluator pools)."""
        out = NEAccumulator()
        for key, sums in self._sums.items():
            task = key.split("/", 1)[1]
            out._sums.setdefault(f"all/{task}", np.zeros(4))
            out._sums[f"all/{task}"] += sums
        return out

    def table(self) -> list[dict[str, float | int | str]]:
        return [
            {"key": k, "rows": self.count(k), "rate": self.rate(k), "mean_p": self.mean_p(k),
             "ne": self.ne(k)}
            for k in sorted(self._sums)
        ]


def format_table(table: list[dict], title: str = "oracle NE") -> str:
    """Text table of ``NEAccumulator.table()`` rows; the base-rate NE (1.0 by definition) is for scale."""
    lines = [f"{title}", f"{'surface/task':<28}{'rows':>10}{'rate':>10}{'mean p':>10}{'oracle NE':>11}"
             f"{'base NE':>9}"]
    def cell(x: float | None, width: int) -> str:  # None / NaN: a surface x task with no observed row
        return f"{x:>{width}.4f}" if x is not None and x == x else f"{'n/a':>{width}}"

    for r in table:
        lines.append(f"{r['key']:<28}{r['rows']:>10d}{cell(r['rate'], 10)}{cell(r['mean_p'], 10)}"
                     f"{cell(r['ne'], 11)}{1.0:>9.3f}")
    return "\n".join(lines)


def accumulate(data_dir: str | Path, partitions: str = "@all", batch_rows: int = 65536) -> NEAccumulator:
    """Stream labels and truth files of a dataset into an accumulator keyed ``<surface>/<task>``."""
    ds = Dataset(data_dir)
    schema = ds.schema
    acc = NEAccumulator()
    label_cols = [t.label_column for t in schema.tasks]
    cols = [schema.example_id_column, schema.surface_column] + label_cols
    for part in ds.select(partitions):
        files = sorted((ds.root / part).glob("*.parquet"))
        for f in files:
            tf = ds.root / "truth" / part / f.name
            if not tf.exists():
                raise DatasetError(f"{f}: no truth file {tf} (oracle NE needs a simulated dataset)")
            _accumulate_pair(acc, schema, f, tf, cols, batch_rows)
    return acc


def _accumulate_pair(acc: NEAccumulator, schema: FeatureSchema, f: Path, tf: Path, cols: list[str],
                     batch_rows: int) -> None:
    data = pq.ParquetFile(f)
    truth = pq.ParquetFile(tf)
    tcols = [schema.example_id_column] + [TRUTH_PREFIX + t.name for t in schema.tasks]
    missing = [c for c in tcols if c not in truth.schema_arrow.names]
    if missing:
        raise DatasetError(f"{tf}: missing truth column(s) {', '.join(missing)}")
    if data.metadata.num_rows != truth.metadata.num_rows:
        raise DatasetError(f"{tf}: {truth.metadata.num_rows} rows but {f} has {data.metadata.num_rows}")
    row = 0
    pairs = zip(data.iter_batches(batch_rows, columns=cols), truth.iter_batches(batch_rows, columns=tcols))
    for db, tb in pairs:
        ids = db.column(0).to_numpy()
        if not np.array_equal(ids, tb.column(0).to_numpy()):
            bad = int(np.argmax(ids != tb.column(0).to_numpy()))
            raise DatasetError(f"{tf}: example_id differs from {f} at row {row + bad}")
        surf = db.column(1).to_numpy()
        for j, task in enumerate(schema.tasks):
            lab: pa.Array = db.column(2 + j)
            observed = ~np.asarray(lab.is_null().to_numpy(zero_copy_only=False))
            y = lab.fill_null(0).to_numpy()
            p = tb.column(1 + j).to_numpy()
            for s, sname in enumerate(schema.surfaces):
                m = (surf == s) & observed
                if m.any():
                    acc.update(f"{sname}/{task.name}", p[m], y[m])
        row += len(ids)


def oracle_ne(data_dir: str | Path, partitions: str = "@all") -> dict[str, float]:
    """Oracle NE per ``"<surface>/<task>"`` on the chosen partitions of a simulated dataset."""
    return accumulate(data_dir, partitions).results()
