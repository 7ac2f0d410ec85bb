"""The study's frontier rescoring: several runs share each pass over a day, and each run's result is the one
it gets scored alone (bench/frontier_scoring.py)."""

import json
import shutil
from pathlib import Path

import pytest

from opengem.bench.frontier_scoring import frontier_test, frontier_tests
from opengem.bench.isoflop import balanced_shares
from opengem.train.config import load_run_config
from opengem.train.trainer import train

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.toml"


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Two trained runs of different families on the same data (tiny.toml: days 0-1 train, day 2 eval; the
    first run simulates it, the second reads it), each with the result.json the study writes (its identity
    and calibration method)."""
    root = tmp_path_factory.mktemp("frontier")
    runs = []
    for name, extra in (("gem", []), ("dlrm", ["model.name=dlrm", f"data.path={root / 'gem' / 'data'}"])):
        run = root / name
        train(load_run_config(TINY, ["train.progress=false", "train.steps=8", *extra]), run)
        (run / "result.json").write_text(json.dumps({"config_sha256": name, "calibrate": "platt"}))
        runs.append(run)
    return runs


def _copies(runs: list[Path], where: Path) -> list[Path]:
    where.mkdir()
    return [Path(shutil.copytree(r, where / r.name)) for r in runs]


@pytest.mark.parametrize("calibration_rows", [0, -1])
def test_runs_scored_together_get_what_each_gets_alone(two_runs, tmp_path, calibration_rows):
    """Refit on the whole validation day (0) or each run's own calibration kept (-1): the metrics, rows and
    fit rows of two runs scored in one pass equal those of each scored on its own, bit for bit."""
    together = frontier_tests(_copies(two_runs, tmp_path / "together"), "day=002", 0, 1, calibration_rows)
    alone = {r.name: frontier_test(r, "day=002", 0, 1, calibration_rows)
             for r in _copies(two_runs, tmp_path / "alone")}
    assert list(together) == ["gem", "dlrm"]  # in the order asked
    assert together == alone
    assert together["gem"]["metrics"] != together["dlrm"]["metrics"]  # two models, not one scored twice
    assert {r["rows_scored"] for r in together.values()} == {1000}
    fit = {r["calibration_fit_rows"] for r in together.values()}
    assert fit == ({1000} if calibration_rows == 0 else {None})


def test_each_day_is_read_once_for_all_runs(two_runs, tmp_path, monkeypatch):
    """The day's row groups are decoded once for two runs, as for one; a second call reuses every cache."""
    import opengem.data.loader as loader

    reads: list[int] = []
    real = loader.iter_row_group

    def counted(*args, **kwargs):
        reads.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(loader, "iter_row_group", counted)
    runs = _copies(two_runs, tmp_path / "two")
    frontier_tests(runs[:1], "day=002", 0, 1, 0)
    one = len(reads)
    assert one > 0
    reads.clear()
    for r in runs[:1]:
        (r / "frontier_test.json").unlink()
    first = frontier_tests(runs, "day=002", 0, 1, 0)
    assert len(reads) == one
    reads.clear()
    stamp = [(r / "frontier_test.json").stat().st_mtime_ns for r in runs]
    assert frontier_tests(runs, "day=002", 0, 1, 0) == first and not reads
    assert [(r / "frontier_test.json").stat().st_mtime_ns for r in runs] == stamp


def test_run_folders_need_distinct_names(two_runs, tmp_path):
    a, b = _copies(two_runs[:1], tmp_path / "a")[0], _copies(two_runs[:1], tmp_path / "b")[0]
    with pytest.raises(ValueError, match="distinct names"):
        frontier_tests([a, b], "day=002", 0)


def test_balanced_shares_deal_largest_first_and_keep_the_order():
    cost = {"a": 1.0, "b": 9.0, "c": 1.0, "d": 5.0, "e": 4.0}
    shares = balanced_shares(cost, 2)
    assert sorted(n for s in shares for n in s) == sorted(cost)
    # largest first to the lighter share, each name costing its own plus the mean (4): b, d, e (17 against
    # 13), a, c; each share in cost's order
    assert shares == [["a", "b"], ["c", "d", "e"]]
    assert balanced_shares(cost, 9) == [["b"], ["d"], ["e"], ["a"], ["c"]]
    assert balanced_shares({}, 2) == []
