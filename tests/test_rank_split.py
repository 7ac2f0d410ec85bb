"""Any number of ranks on any dataset: the loader splits rows, not only row groups, between ranks (and
their data workers), so every rank has rows to read and the same share of them; positions saved under
one world size resume exactly once under any other, the units cut differently included; and a
2-process run evaluates exactly the rows, and gives exactly the metrics, of one process."""

from __future__ import annotations

import itertools
import json
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dist_helpers import PY, ROOT, env, run_train
from opengem.data.loader import ParquetLoader, Unit, deal, merge_states
from opengem.data.parquet import CanonicalWriter, FileInfo
from opengem.data.schema import FeatureSchema
from parquet_helpers import random_columns

SCHEMA = ROOT / "configs" / "schemas" / "tiny.toml"
SIZES = (100, 61, 45)  # rows per file; row groups of 37 -> 37, 37, 26 | 37, 24 | 37, 8
N = sum(SIZES)


@pytest.fixture(scope="module")
def schema() -> FeatureSchema:
    return FeatureSchema.load(SCHEMA)


def write(schema: FeatureSchema, root: Path, sizes: tuple[int, ...], row_group: int) -> list[Path]:
    out, first = [], 0
    for i, n in enumerate(sizes):
        path = root / f"part-{i:05d}.parquet"
        with CanonicalWriter(schema, path, row_group_size=row_group) as w:
            w.write(random_columns(schema, n, seed=i, first_id=first))
        out.append(path)
        first += n
    return out


@pytest.fixture(scope="module")
def uneven(schema, tmp_path_factory) -> list[Path]:
    """7 row groups of 4 different sizes."""
    return write(schema, tmp_path_factory.mktemp("uneven"), SIZES, 37)


@pytest.fixture(scope="module")
def one_group(schema, tmp_path_factory) -> list[Path]:
    """One file, one row group of 101 rows: fewer row groups than ranks."""
    return write(schema, tmp_path_factory.mktemp("one"), (101,), 1000)


def ids(batches) -> list[int]:
    return [i for b in batches for i in b.example_id.tolist()]


# ------------------------------------------------------------------------------ the deal
@pytest.mark.parametrize("world", [2, 3, 4, 7])
def test_every_rank_reads_rows_of_a_single_row_group(schema, one_group, world):
    """Before: ranks 1.. of a 1-row-group file got nothing ("rank 1 has no rows to evaluate")."""
    got = [ids(ParquetLoader(one_group, schema, 8, rank=r, world_size=world)) for r in range(world)]
    assert all(got), [len(g) for g in got]
    assert sorted(i for g in got for i in g) == list(range(101))  # every row once, by one rank
    assert max(map(len, got)) - min(map(len, got)) <= 1
    loaders = [ParquetLoader(one_group, schema, 8, rank=r, world_size=world) for r in range(world)]
    assert [ld.num_rows for ld in loaders] == [len(g) for g in got]


@pytest.mark.parametrize("world, workers", [(2, 0), (3, 0), (4, 0), (2, 2), (1, 3)])
def test_ranks_and_workers_get_equal_shares_of_unequal_row_groups(schema, uneven, world, workers):
    """Before: whole row groups round-robin gave 2 ranks 95 and 111 rows (training stops at the first
    rank to run out, so 16 rows of each epoch were never trained)."""
    got = [ids(ParquetLoader(uneven, schema, 8, rank=r, world_size=world, num_workers=workers))
           for r in range(world)]
    assert sorted(i for g in got for i in g) == list(range(N))
    assert max(map(len, got)) - min(map(len, got)) <= 1, [len(g) for g in got]


def test_rounds_of_equal_row_groups_are_dealt_whole_round_robin(schema, tmp_path):
    """N ranks with batch B see, step by step, the rows one rank sees with batch N*B (equal row groups)."""
    files = write(schema, tmp_path, (64, 64), 16)  # 8 row groups of 16
    one = [sorted(b.example_id.tolist())
           for b in ParquetLoader(files, schema, 32, shuffle_units=True, seed=5)]
    two = [[b.example_id.tolist() for b in ParquetLoader(files, schema, 16, rank=r, world_size=2,
                                                          shuffle_units=True, seed=5)] for r in range(2)]
    assert one == [sorted(a + b) for a, b in zip(*two, strict=True)]


def _units(sizes: list[int]) -> list[Unit]:
    return [Unit(FileInfo(f"f{i}", [n]), 0, 0, n) for i, n in enumerate(sizes)]


@pytest.mark.parametrize("sizes, streams", [([37, 37, 26, 37, 24, 37, 8], 2), ([5], 4), ([3, 9, 9, 1], 3),
                                            ([10] * 6, 4), ([2, 2], 5)])
def test_deal_covers_every_row_once_in_slices(sizes, streams):
    out = deal(_units(sizes), streams)
    seen: dict[str, list[tuple[int, int]]] = {}
    for stream in out:
        for u in stream:
            assert u.num_rows > 0
            seen.setdefault(u.info.path, []).append((u.begin, u.begin + u.num_rows))
    for i, n in enumerate(sizes):  # the slices of each row group tile it exactly
        spans = sorted(seen[f"f{i}"])
        assert spans[0][0] == 0 and spans[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    rows = [sum(u.num_rows for u in s) for s in out]
    assert max(rows) - min(rows) <= 1 and sum(rows) == sum(sizes)


# ------------------------------------------------------------------------------ positions across world sizes
def _stage(files, schema, world, batches, state, workers=0, **kw) -> tuple[list[int], dict]:
    """Every rank of ``world`` resumes ``state`` and reads ``batches`` batches (None: to the end); the
    rows read and the merged state."""
    got, states = [], []
    for r in range(world):
        loader = ParquetLoader(files, schema, 7, rank=r, world_size=world, num_workers=workers, read_rows=10,
                               **kw)
        if state is not None:
            loader.load_state_dict(json.loads(json.dumps(state)))
        it = iter(loader)
        got += ids(itertools.islice(it, batches) if batches is not None else it)
        states.append(loader.state_dict())
        del it
    return got, merge_states(states)


@pytest.mark.parametrize("mixing", [{}, {"shuffle_window": 2, "shuffle_units": True, "seed": 3}])
@pytest.mark.parametrize("worlds", [(2, 1), (1, 3), (3, 2), (2, 4, 1), (4, 3, 2)])
def test_resume_exactly_once_across_world_sizes(schema, uneven, worlds, mixing):
    """Each world reads a few batches per rank, saves, and the next world resumes the merged state; the
    units the worlds cut differently leave gaps that are read exactly once."""
    got, state = [], None
    for w in worlds:
        rows, state = _stage(uneven, schema, w, 2, state, **mixing)
        got += rows
    rows, state = _stage(uneven, schema, worlds[-1], None, state, **mixing)
    got += rows
    assert sorted(got) == list(range(N))
    assert state["epoch"] == 1 and state["offsets"] == {}


@pytest.mark.parametrize("workers", [0, 2])
def test_gaps_of_a_split_row_group_resume_on_one_rank(schema, one_group, workers):
    """Two ranks stop mid-way through their halves of one row group: one rank resumes the two gaps."""
    head, state = _stage(one_group, schema, 2, 3, None)
    assert any("@" in k for k in state["offsets"])  # the second half is keyed by its first row
    tail, end = _stage(one_group, schema, 1, None, state, workers=workers)
    assert sorted(head + tail) == list(range(101)) and len(head) == 2 * 3 * 7


def test_version_1_state_still_resumes(schema, uneven):
    """Positions saved before slices existed (whole row groups only) are read as they were meant."""
    loader = ParquetLoader(uneven, schema, 7)
    head = ids(itertools.islice(iter(loader), 3))
    state = {**loader.state_dict(), "version": 1}
    assert all("@" not in k for k in state["offsets"])
    again = ParquetLoader(uneven, schema, 7, rank=1, world_size=2)
    again.load_state_dict(state)
    other = ParquetLoader(uneven, schema, 7, rank=0, world_size=2)
    other.load_state_dict(state)
    assert sorted(head + ids(again) + ids(other)) == list(range(N))


# ------------------------------------------------------------------------------ the command, shrunk
@pytest.mark.slow
def test_two_processes_evaluate_every_row_once_with_one_process_metrics(tmp_path):
    """torchrun 2 processes on a dataset whose evaluation day is one row group: the run trains and
    evaluates (before: "rank 1 has no rows to evaluate"), every row once, and one process evaluating the
    same checkpoint gets the same metrics."""
    data = tmp_path / "D"
    r = subprocess.run([PY, "-m", "opengem.cli", "simulate", "--out", str(data), "--rows",
                        "1500", "--days", "3", "--users", "300", "--ads", "100", "--advertisers", "20",
                        "--topics", "10", "--seq-mean", "6", "--seq-max", "16", "--quiet"],
                       env=env(), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    two = run_train(2, tmp_path / "two", data, ["train.steps=4", "train.log_every=2", "data.batch_size=64"])
    assert two["world_size"] == 2
    one = subprocess.run([PY, "-m", "opengem.cli", "evaluate", "--run", str(tmp_path / "two")],
                         env=env(), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-3000:]
    ev = json.loads((tmp_path / "two" / "eval.json").read_text())
    eval_rows = sum(pq.read_metadata(f).num_rows
                    for p in ev["partitions"] for f in (data / p).glob("*.parquet"))
    assert ev["rows"] == eval_rows  # every row of the evaluation day, once
    assert two["final_eval"].keys() == ev["metrics"].keys()
    for k, m in ev["metrics"].items():
        assert two["final_eval"][k]["rows"] == m["rows"], k
        for name in ("ne", "auc"):
            if m[name] is None:
                assert two["final_eval"][k][name] is None
            else:
                assert two["final_eval"][k][name] == pytest.approx(m[name], rel=1e-6, abs=1e-9), (k, name)

