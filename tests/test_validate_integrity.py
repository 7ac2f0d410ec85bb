"""``opengem validate`` across files: duplicate example ids and day partitions that overlap in time.

Each problem is named by file, column and row (row within the file, across row groups).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from opengem.cli import main
from opengem.data.commit import MARKER, mark_complete
from opengem.data.dataset import Dataset
from opengem.data.parquet import ProblemLog, write_parquet
from opengem.data.schema import FeatureSchema
from opengem.data.validate import check_integrity
from opengem.errors import DatasetError
from parquet_helpers import random_columns

TINY = Path(__file__).resolve().parents[1] / "configs" / "schemas" / "tiny.toml"
DAY_S = 86400


def _write(root: Path, part: str, ids: np.ndarray, ts: np.ndarray, name: str = "part-00000.parquet") -> Path:
    schema = FeatureSchema.load(TINY)
    cols = random_columns(schema, len(ids), seed=len(list(root.rglob("*.parquet"))))
    cols[schema.example_id_column] = np.asarray(ids, dtype=np.int64)
    cols[schema.time_column] = np.asarray(ts, dtype=np.int64)
    (root / part).mkdir(parents=True, exist_ok=True)
    write_parquet(schema, root / part / name, cols, row_group_size=16)
    return root / part / name


def _days(root: Path, days: list[int], rows: int = 40) -> Path:
    """Clean day partitions: ids 100*k.., ts inside day k, increasing."""
    FeatureSchema.load(TINY).save(root / "schema.toml")
    for k, day in enumerate(days):
        _write(root, f"day={day:03d}" if day < 1000 else f"day={day}", np.arange(rows) + 100 * k,
               day * DAY_S + np.arange(rows) * 60)
    return root


def _validate(root: Path, capsys: pytest.CaptureFixture, mark: bool = True) -> tuple[int, str]:
    if mark:
        mark_complete(root)  # as a person would after assembling it by hand (markers are tested below)
    rc = main(["validate", "--data", str(root), "--max-problems", "1000"])
    return rc, capsys.readouterr().out


def test_clean_days_pass(tmp_path, capsys):
    rc, out = _validate(_days(tmp_path, [0, 1, 2]), capsys)
    assert rc == 0 and out.startswith("OK: 3 file(s), 120 rows")


def test_duplicate_ids_across_partitions_name_both_places(tmp_path, capsys):
    root = _days(tmp_path, [0, 1])
    ids = np.arange(40) + 100
    ids[35] = 7  # row 35 (third row group of 16) repeats day=000's row 7
    _write(root, "day=001", ids, DAY_S + np.arange(40) * 60)
    rc, out = _validate(root, capsys)
    assert rc == 1
    assert ("day=001/part-00000.parquet: column 'example_id' row 35: duplicate example_id "
            "(value 7; first at day=000/part-00000.parquet row 7) [error]") in out
    assert "day=000/part-00000.parquet: column 'example_id'" not in out  # the first sighting is not a problem
    assert out.count("duplicate example_id (value") == 1


def test_duplicate_ids_within_one_file_and_across_files_of_a_partition(tmp_path, capsys):
    root = _days(tmp_path, [0])
    ids = np.arange(40)
    ids[20] = 3
    _write(root, "day=000", ids, np.arange(40) * 60)
    _write(root, "day=000", np.array([50, 39]), np.array([3000, 3001]), name="part-00001.parquet")
    rc, out = _validate(root, capsys)
    assert rc == 1
    assert ("day=000/part-00000.parquet: column 'example_id' row 20: duplicate example_id "
            "(value 3; first at day=000/part-00000.parquet row 3)") in out
    assert ("day=000/part-00001.parquet: column 'example_id' row 1: duplicate example_id "
            "(value 39; first at day=000/part-00000.parquet row 39)") in out


def test_a_row_earlier_than_an_earlier_day_is_reported(tmp_path, capsys):
    root = _days(tmp_path, [0, 1, 2])
    ts = 2 * DAY_S + np.arange(40) * 60
    ts[17] = 100  # back on day 0; the latest earlier row is day 1's row 39, at DAY_S + 39 * 60
    _write(root, "day=002", np.arange(40) + 200, ts)
    rc, out = _validate(root, capsys)
    assert rc == 1
    assert ("day=002/part-00000.parquet: column 'ts' row 17: earlier than ts 88740 at "
            "day=001/part-00000.parquet row 39 (an earlier day): day partitions overlap in time "
            "(value 100) [error]") in out
    assert out.count("overlap in time (value") == 1


def test_days_are_compared_in_day_order_not_name_order(tmp_path, capsys):
    # by name day=1000 sorts before day=999; in time it is the later day and the data agrees
    rc, out = _validate(_days(tmp_path, [998, 999, 1000]), capsys)
    assert rc == 0, out


def test_named_splits_are_not_time_checked_but_ids_are(tmp_path, capsys):
    FeatureSchema.load(TINY).save(tmp_path / "schema.toml")
    _write(tmp_path, "train", np.arange(40), DAY_S + np.arange(40))  # a random split: times interleave
    _write(tmp_path, "valid", np.arange(40) + 100, np.arange(40))
    rc, out = _validate(tmp_path, capsys)
    assert rc == 0, out
    _write(tmp_path, "test", np.array([5, 200]), np.array([0, 1]))
    rc, out = _validate(tmp_path, capsys)
    assert rc == 1 and "test/part-00000.parquet: column 'example_id' row 0: duplicate example_id" in out
    assert "overlap in time" not in out


def test_check_integrity_reads_only_two_columns_per_row_group(tmp_path, monkeypatch):
    """Streaming: no read of a whole file or dataset, only the id and time columns of one row group."""
    import pyarrow.parquet as pq

    root = _days(tmp_path, [0, 1])
    schema = FeatureSchema.load(TINY)
    calls: list[tuple[int, list[str]]] = []
    real = pq.ParquetFile.read_row_group

    def spy(self, i, columns=None, **kw):
        calls.append((i, list(columns or [])))
        return real(self, i, columns=columns, **kw)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", spy)
    monkeypatch.setattr(pq.ParquetFile, "read", lambda *a, **k: pytest.fail("whole-file read"))
    monkeypatch.setattr(pq, "read_table", lambda *a, **k: pytest.fail("whole-file read"))
    log = ProblemLog(raise_errors=False)
    parts = [(p, sorted((root / p).glob("*.parquet"))) for p in ("day=000", "day=001")]
    check_integrity(parts, schema, log, time_ordered=True)
    assert not log.counts
    assert calls == [(i, ["example_id", "ts"]) for _ in range(2) for i in range(3)]


# --------------------------------------------------------------------------- completion markers
def test_unmarked_dataset_is_a_problem_not_ok(tmp_path, capsys):
    rc, out = _validate(_days(tmp_path, [0, 1]), capsys, mark=False)
    assert rc == 1
    assert re.search(rf"{re.escape(str(tmp_path / MARKER))}:+ missing or not opengem's: readers refuse", out)
    assert f"opengem validate --data {tmp_path} --mark-complete" in out


def test_mark_complete_after_a_clean_validation_makes_the_dataset_readable(tmp_path, capsys):
    root = _days(tmp_path, [0, 1])
    with pytest.raises(DatasetError, match="no _COMPLETE marker"):
        Dataset(root)
    assert main(["validate", "--data", str(root), "--mark-complete"]) == 0
    assert f"marked complete: {root / MARKER}" in capsys.readouterr().out
    assert Dataset(root).select("@train") == ["day=000"]
    rc, out = _validate(root, capsys, mark=False)
    assert rc == 0 and out.startswith("OK: 2 file(s)")


def test_mark_complete_refuses_a_dataset_with_problems(tmp_path, capsys):
    root = _days(tmp_path, [0, 1])
    _write(root, "day=001", np.arange(40), DAY_S + np.arange(40) * 60)  # day 1 repeats day 0's ids
    assert main(["validate", "--data", str(root), "--mark-complete"]) == 1
    captured = capsys.readouterr()
    assert "duplicate example_id" in captured.out and "(not marked complete)" in captured.err
    assert not (root / MARKER).exists() and not (root / "day=000" / MARKER).exists()


def test_mark_complete_needs_every_partition(tmp_path, capsys):
    root = _days(tmp_path, [0, 1])
    assert main(["validate", "--data", str(root), "--mark-complete", "--partitions", "day=000"]) == 2
    assert "opengem validate: error: --mark-complete marks the whole dataset" in capsys.readouterr().err
    assert not (root / MARKER).exists()
