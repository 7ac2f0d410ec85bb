import itertools
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import opengem.data.loader as loader_module
from opengem.data.commit import mark_complete
from opengem.data.loader import ParquetLoader, merge_states
from opengem.data.parquet import CanonicalWriter
from opengem.data.schema import FeatureSchema
from parquet_helpers import random_columns

TINY = Path(__file__).resolve().parents[1] / "configs" / "schemas" / "tiny.toml"
SIZES = (100, 61, 45)  # rows per file; row groups of 37 -> 3 + 2 + 2 units
N = sum(SIZES)


@pytest.fixture(scope="module")
def schema() -> FeatureSchema:
    return FeatureSchema.load(TINY)


def write_dataset(schema: FeatureSchema, root: Path, partitions: dict[str, tuple[int, ...]]) -> list[Path]:
    """Files of random rows (row groups of 37) per partition folder; example ids count up across files, the
    k-th file drawn with seed k."""
    schema.save(root / "schema.toml")
    out, first = [], 0
    for part, sizes in partitions.items():
        for i, n in enumerate(sizes):
            path = root / part / f"part-{i:05d}.parquet"
            path.parent.mkdir(exist_ok=True)
            with CanonicalWriter(schema, path, row_group_size=37) as w:
                w.write(random_columns(schema, n, seed=len(out), first_id=first))
            out.append(path)
            first += n
    mark_complete(root)  # a dataset written by hand: readers of the folder require its marker
    return out


@pytest.fixture(scope="module")
def files(schema, tmp_path_factory) -> list[Path]:
    return write_dataset(schema, tmp_path_factory.mktemp("ds"), {"train": SIZES})


def ids(batches) -> list[int]:
    return [i for b in batches for i in b.example_id.tolist()]


def test_full_pass_exactly_once_with_exact_batch_sizes(schema, files):
    batches = list(ParquetLoader(files, schema, 16))
    assert sorted(ids(batches)) == list(range(N))
    assert [len(b) for b in batches] == [16] * (N // 16) + [N % 16]  # spans row groups and files
    dropped = list(ParquetLoader(files, schema, 16, drop_last=True))
    assert [len(b) for b in dropped] == [16] * (N // 16)


def test_directory_input_and_num_rows(schema, files):
    loader = ParquetLoader(files[0].parent.parent, schema, 50)
    assert loader.num_rows == N
    assert sorted(ids(loader)) == list(range(N))


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_order_is_deterministic(schema, files, workers):
    a = ids(ParquetLoader(files, schema, 16, num_workers=workers))
    b = ids(ParquetLoader(files, schema, 16, num_workers=workers))
    assert a == b and sorted(a) == list(range(N))


def test_shuffle_units_changes_order_not_content(schema, files):
    plain = ids(ParquetLoader(files, schema, 16))
    s1 = ids(ParquetLoader(files, schema, 16, shuffle_units=True, seed=1))
    s1b = ids(ParquetLoader(files, schema, 16, shuffle_units=True, seed=1))
    s2 = ids(ParquetLoader(files, schema, 16, shuffle_units=True, seed=2))
    assert s1 == s1b
    assert s1 != plain and s1 != s2
    assert sorted(s1) == sorted(s2) == list(range(N))


@pytest.mark.parametrize("workers", [0, 1, 2])
@pytest.mark.parametrize("k", [1, 5])
def test_resume_reads_every_remaining_row_exactly_once(schema, files, workers, k):
    first = ParquetLoader(files, schema, 16, num_workers=workers)
    it = iter(first)
    head = ids(itertools.islice(it, k))  # workers have prefetched more than k: that must not count
    state = json.loads(json.dumps(first.state_dict()))  # state is plain JSON
    del it
    assert len(state["offsets"]) <= 7  # one entry per touched unit, nothing per row
    second = ParquetLoader(files, schema, 16, num_workers=workers)
    second.load_state_dict(state)
    tail = ids(second)
    assert len(head) == 16 * k
    assert sorted(head + tail) == list(range(N))


def test_resume_with_two_ranks_and_into_one(schema, files):
    heads, states = [], []
    for rank in range(2):
        loader = ParquetLoader(files, schema, 8, rank=rank, world_size=2)
        heads.append(ids(itertools.islice(iter(loader), 3)))
        states.append(loader.state_dict())
    assert not set(heads[0]) & set(heads[1])
    tails = []
    for rank in range(2):
        loader = ParquetLoader(files, schema, 8, rank=rank, world_size=2)
        loader.load_state_dict(states[rank])
        tails.append(ids(loader))
    everything = heads[0] + heads[1] + tails[0] + tails[1]
    assert sorted(everything) == list(range(N))
    # Offsets are per unit, so the merged state resumes on a different world size too.
    single = ParquetLoader(files, schema, 8, num_workers=2)
    single.load_state_dict(merge_states(states))
    assert sorted(heads[0] + heads[1] + ids(single)) == list(range(N))


def test_next_iteration_is_a_new_epoch(schema, files):
    loader = ParquetLoader(files, schema, 32, shuffle_units=True)
    e0, e1 = ids(loader), ids(loader)
    assert sorted(e0) == sorted(e1) == list(range(N))
    assert e0 != e1  # shuffled per epoch
    assert loader.epoch == 2 and loader.state_dict()["offsets"] == {}


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_inside_a_row_group_read_in_pieces(schema, files, workers):
    """read_rows < row group: offsets land mid-unit and mid-piece; still exactly once."""
    first = ParquetLoader(files, schema, 7, num_workers=workers, read_rows=10)
    head = ids(itertools.islice(iter(first), 4))
    state = first.state_dict()
    assert any(0 < v < 37 for v in state["offsets"].values())  # a partially consumed unit
    second = ParquetLoader(files, schema, 7, num_workers=workers, read_rows=10)
    second.load_state_dict(state)
    assert sorted(head + ids(second)) == list(range(N))
    full = ParquetLoader(files, schema, 7, read_rows=10)
    assert [len(b) for b in full] == [7] * (N // 7) + ([N % 7] if N % 7 else [])


# ------------------------------------------------------------------------------ row mixing (shuffle_window)
FIRSTS = [sum(SIZES[:i]) for i in range(len(SIZES))]


def unit_of(i: int, firsts: list[int] = FIRSTS) -> tuple[int, int]:
    """(file, row group) of example id ``i`` (row groups of 37; ``firsts``: each file's first id)."""
    f = max(j for j, first in enumerate(firsts) if first <= i)
    return f, (i - firsts[f]) // 37


def content(batches) -> list[tuple]:
    """Everything that identifies a batch's rows and values."""
    return [(tuple(b.example_id.tolist()), b.dense.numpy().tobytes(), tuple(b.sparse.values().tolist()),
             tuple(b.labels.flatten().tolist())) for b in batches]


def run(files, schema, batch_size, stops, state=None, **kw) -> tuple[list, dict]:
    """Batches over passes that stop after ``stops[i]`` batches (None: to the end), each in a fresh loader
    resumed from the previous one's state."""
    out = []
    for k in stops:
        loader = ParquetLoader(files, schema, batch_size, **kw)
        if state is not None:
            loader.load_state_dict(json.loads(json.dumps(state)))
        it = iter(loader)
        out += list(itertools.islice(it, k) if k is not None else it)
        state = loader.state_dict()
        del it
    return out, state


@pytest.mark.parametrize("workers", [0, 2])
def test_shuffle_window_0_and_1_are_unchanged(schema, files, workers):
    plain = ParquetLoader(files, schema, 16, num_workers=workers, read_rows=10, shuffle_units=True, seed=3)
    expected = content(plain)
    for w in (0, 1):
        loader = ParquetLoader(files, schema, 16, num_workers=workers, read_rows=10, shuffle_units=True,
                               seed=3, shuffle_window=w)
        assert content(loader) == expected
        assert loader.state_dict() == plain.state_dict() and "shuffle" not in loader.state_dict()
    if workers == 0:  # one row group after another, in file order, as before
        assert ids(ParquetLoader(files, schema, 16, shuffle_window=1)) == list(range(N))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("window", [2, 4])
def test_shuffle_window_mixes_rows_exactly_once(schema, files, workers, window):
    loader = ParquetLoader(files, schema, 16, num_workers=workers, read_rows=10, shuffle_window=window)
    batches = list(loader)
    order = ids(batches)
    assert sorted(order) == list(range(N))
    # Each unit's rows in file order. A unit is a row group or, where the deal splits a round of row
    # groups of different sizes between streams (here the 2 workers), a slice of one: a slice per stream.
    units = [(FIRSTS[files.index(Path(u.info.path))] + u.first_row, u.num_rows) for u in loader.units()]
    assert sorted(first for first, _ in units) == sorted({first for first, _ in units})
    per_unit: dict[int, list[int]] = {}
    for i in order:
        per_unit.setdefault(max(f for f, n in units if f <= i), []).append(i)
    assert all(v == sorted(v) for v in per_unit.values())
    assert (len(units) > 7) == (workers == 2)  # 7 row groups; 2 streams split the rounds of unequal sizes
    mixed = [len({unit_of(i) for i in b.example_id.tolist()}) for b in batches]
    plain = [len({unit_of(i) for i in b.example_id.tolist()})
             for b in ParquetLoader(files, schema, 16, num_workers=workers)]
    assert sum(m > 1 for m in mixed) >= len(mixed) - 2 > sum(p > 1 for p in plain)
    if workers == 0:
        assert [len(b) for b in batches] == [16] * (N // 16) + [N % 16]
    dropped = list(ParquetLoader(files, schema, 16, num_workers=workers, shuffle_window=window,
                                 drop_last=True))
    assert all(len(b) == 16 for b in dropped) and len(set(ids(dropped))) == len(ids(dropped))


def test_shuffle_window_is_deterministic(schema, files):
    kw = dict(read_rows=10, shuffle_units=True, shuffle_window=3)
    a = ParquetLoader(files, schema, 16, seed=1, **kw)
    b = ParquetLoader(files, schema, 16, seed=1, **kw)
    a0, b0 = content(a), content(b)
    assert a0 == b0
    assert content(a) == content(b) != a0  # the next epoch: mixed again, differently
    assert content(ParquetLoader(files, schema, 16, seed=2, **kw)) != a0


def test_shuffle_window_order_does_not_depend_on_where_the_data_lies(schema, files, tmp_path):
    """A fresh clone or another --out puts the same dataset elsewhere: the mixed order (and so every trained
    number) must be the same."""
    import shutil

    moved = []
    for f in files:
        dst = tmp_path / "elsewhere" / f.parent.name / f.name
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, dst)
        moved.append(dst)
    kw = dict(read_rows=10, shuffle_units=True, shuffle_window=3, seed=1)
    assert content(ParquetLoader(moved, schema, 16, **kw)) == content(ParquetLoader(files, schema, 16, **kw))


@pytest.mark.parametrize("workers, stops", [(0, [1, 5, None]), (0, [3, 0, 4, None]), (2, [2, 4, None]),
                                            (2, [6, None])])
@pytest.mark.parametrize("batch_size, read_rows", [(16, 8192), (7, 10)])
def test_shuffle_window_resume_replays_the_uninterrupted_stream(schema, files, workers, stops, batch_size,
                                                                 read_rows):
    # Even stops with 2 workers: a DataLoader restarts its round-robin at worker 0.
    kw = dict(num_workers=workers, read_rows=read_rows, shuffle_units=True, seed=4, shuffle_window=3)
    full = content(ParquetLoader(files, schema, batch_size, **kw))
    resumed, state = run(files, schema, batch_size, stops, **kw)
    assert content(resumed) == full
    assert state["epoch"] == 1 and state["offsets"] == {}


def test_shuffle_window_resume_with_bad_rows_skipped(schema, files, tmp_path):
    table = pq.read_table(files[1])
    col = table.column_names.index("ad_id")
    values = table.column("ad_id").to_pylist()
    for r in (3, 40, 41):  # dropped by check_columns: offsets still count them as read
        values[r] = -5
    field = table.schema.field(col)
    table = table.set_column(col, field, pa.array(values, type=field.type))
    pq.write_table(table, tmp_path / "bad.parquet", row_group_size=37)
    bad = [files[0], tmp_path / "bad.parquet", files[2]]
    kw = dict(read_rows=10, on_error="skip", shuffle_window=2)
    loader = ParquetLoader(bad, schema, 7, **kw)
    full = content(loader)
    good = sorted(set(range(N)) - {FIRSTS[1] + r for r in (3, 40, 41)})
    assert sorted(i for b in full for i in b[0]) == good and loader.problems.total == 3
    for stops in ([2, 3, None], [5, 1, 1, None]):
        assert content(run(bad, schema, 7, stops, **kw)[0]) == full


def two_ranks_merged(files, schema, batches: int, **kw) -> tuple[list[int], dict]:
    """Two ranks each read ``batches`` batches of 8 rows: the ids they delivered and their merged state."""
    heads, states = [], []
    for rank in range(2):
        out, state = run(files, schema, 8, [batches], rank=rank, world_size=2, **kw)
        heads += ids(out)
        states.append(state)
    return heads, merge_states(states)


@pytest.mark.parametrize("workers", [0, 2, 3])
def test_shuffle_window_two_ranks_merged_into_one(schema, files, workers):
    """Windows depend on the number of streams (ranks x workers): with another number, a window the
    merged state cut mid-way is read unit by unit, the others are mixed; with the same number (1 rank x 2
    workers = 2 ranks x 1) the resume is exact. Every row is delivered exactly once, over further
    interruptions too."""
    kw = dict(read_rows=10, shuffle_window=2)
    heads, merged = two_ranks_merged(files, schema, 3, **kw)
    assert merged["shuffle"] == {"window": 2, "seed": 0, "streams": 2}
    tails = [ids(run(files, schema, 8, [None], state=merged, rank=r, world_size=2, **kw)[0])
             for r in range(2)]
    assert sorted(heads + tails[0] + tails[1]) == list(range(N))  # same world size: the same windows
    single = ParquetLoader(files, schema, 8, num_workers=workers, **kw)
    single.load_state_dict(merged)
    it = iter(single)
    middle = ids(itertools.islice(it, 2))
    state = single.state_dict()
    del it
    # None: some window was cut under another layout, remembered for later resumes in this epoch (unless
    # every cut window's offsets happen to fit this layout's order too: the unit keys hold tmp paths).
    assert state["shuffle"]["streams"] in ((2,) if workers == 2 else (None, max(1, workers)))
    rest, end = run(files, schema, 8, [1, None], state=state, num_workers=workers, **kw)
    assert sorted(heads + middle + ids(rest)) == list(range(N))
    assert end["epoch"] == 1 and end["shuffle"]["streams"] == max(1, workers)  # a new epoch: own windows


def test_shuffle_window_state_from_other_mixing_is_refused(schema, files):
    for saved_kw, kw in [({"shuffle_window": 4}, {"shuffle_window": 2}),
                         ({}, {"shuffle_window": 2}),
                         ({"shuffle_window": 2, "seed": 1}, {"shuffle_window": 2, "seed": 2})]:
        _, state = run(files, schema, 16, [3], read_rows=10, **saved_kw)
        loader = ParquetLoader(files, schema, 16, read_rows=10, **kw)
        loader.load_state_dict(state)
        with pytest.raises(ValueError, match=r"does not fit the row mixing at unit .*part-\d+\.parquet#\d"):
            next(iter(loader))
    # At an epoch boundary nothing is cut mid-window: any mixing resumes.
    _, state = run(files, schema, 16, [None], shuffle_window=4)
    loader = ParquetLoader(files, schema, 16, shuffle_window=2)
    loader.load_state_dict(state)
    assert sorted(ids(loader)) == list(range(N)) and loader.epoch == 2
    with pytest.raises(ValueError, match="mix rows differently"):
        merge_states([run(files, schema, 8, [1], rank=r, world_size=2, shuffle_window=2 + r)[1]
                      for r in range(2)])


# ------------------------------------------------------------- a window per partition (shuffle_window -1)
DAY_SIZES = ((100, 61), (45, 80))  # rows per file in day=000 and day=001; row groups of 37


@pytest.fixture(scope="module")
def day_files(schema, tmp_path_factory) -> list[Path]:
    return write_dataset(schema, tmp_path_factory.mktemp("days"),
                         {f"day={d:03d}": sizes for d, sizes in enumerate(DAY_SIZES)})


DAY_FIRSTS = list(itertools.accumulate([n for day in DAY_SIZES for n in day], initial=0))[:-1]


def test_partition_window_reads_days_in_order_each_mixed_whole(schema, day_files):
    loader = ParquetLoader(day_files, schema, 16, read_rows=10, shuffle_window=-1)
    batches = list(loader)
    order = ids(batches)
    day0 = sum(DAY_SIZES[0])
    assert sorted(order) == list(range(day0 + sum(DAY_SIZES[1])))
    assert sorted(order[:day0]) == list(range(day0))  # every row of day 0 before any of day 1
    for part in (order[:day0], order[day0:]):
        units = {unit_of(i, DAY_FIRSTS) for i in part}
        assert {f for f, _ in units} == ({0, 1} if part[0] < day0 else {2, 3})
        for u in units:  # each unit's rows in file order, the day's units interleaved
            rows = [i for i in part if unit_of(i, DAY_FIRSTS) == u]
            assert rows == sorted(rows)
        assert len({unit_of(i, DAY_FIRSTS) for i in part[:16]}) > 2
    assert loader.state_dict()["shuffle"]["window"] == -1


@pytest.mark.parametrize("workers, stops", [(0, [2, 7, None]), (2, [4, None])])
def test_partition_window_resume_replays_the_uninterrupted_stream(schema, day_files, workers, stops):
    kw = dict(num_workers=workers, read_rows=10, seed=2, shuffle_window=-1)
    full = content(ParquetLoader(day_files, schema, 16, **kw))
    resumed, state = run(day_files, schema, 16, stops, **kw)
    assert content(resumed) == full
    assert state["epoch"] == 1 and state["offsets"] == {}
    _, mid = run(day_files, schema, 16, [3], **kw)
    with pytest.raises(ValueError):  # a state of partition windows is not one of 31-unit windows
        run(day_files, schema, 16, [None], state=mid, **{**kw, "shuffle_window": 31})


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("window, shuffle", [(0, False), (3, True), (-1, False)])
def test_skip_drops_the_first_batches_and_the_rest_is_the_uninterrupted_stream(schema, day_files, workers,
                                                                                window, shuffle, monkeypatch):
    kw = dict(num_workers=workers, read_rows=10, seed=1, shuffle_window=window, shuffle_units=shuffle,
              drop_last=True)
    full = content(ParquetLoader(day_files, schema, 16, **kw))
    loader = ParquetLoader(day_files, schema, 16, **kw)
    built = []
    real_to_batch = loader_module.to_batch
    monkeypatch.setattr(loader_module, "to_batch", lambda *a: built.append(1) or real_to_batch(*a))
    assert loader.skip(4) == 4
    assert not built  # the dropped batches are read and checked, never turned into tensors
    assert loader.epoch == 0 and loader.state_dict()["offsets"]  # the position after the dropped batches
    assert content(loader) == full[4:]
    assert loader.epoch == 1
    odd = ParquetLoader(day_files, schema, 16, **kw)
    odd.skip(5)  # with workers the rest starts again at worker 0 (as a resume does): the same batches
    assert sorted(content(odd)) == sorted(full[5:])
    short = ParquetLoader(day_files, schema, 16, **kw)
    assert short.skip(len(full) + 3) == len(full) and short.epoch == 1  # the epoch ended first


def test_shuffle_window_below_minus_one_is_refused(schema, day_files):
    with pytest.raises(ValueError, match="a window per partition"):
        ParquetLoader(day_files, schema, 16, shuffle_window=-2)


def test_partition_window_refuses_a_partition_too_large_to_read_at_once(schema, day_files, monkeypatch):
    """A window reads a piece of each of its units at once: a partition of more row groups than the cap
    is refused, naming it, before any row is read (day=000 here has 3 + 2 row groups)."""
    from opengem.data import loader as loader_module
    from opengem.errors import DatasetError

    monkeypatch.setattr(loader_module, "PARTITION_WINDOW_MAX_UNITS", 4)
    with pytest.raises(DatasetError, match=r"day=000 has 5 row groups, more than 4"):
        ParquetLoader(day_files, schema, 16, shuffle_window=-1)
    ParquetLoader(day_files, schema, 16, shuffle_window=8)  # a positive window is not capped
    monkeypatch.setattr(loader_module, "PARTITION_WINDOW_MAX_UNITS", 5)
    assert len(ids(ParquetLoader(day_files, schema, 16, shuffle_window=-1))) == sum(map(sum, DAY_SIZES))


@pytest.mark.parametrize("workers", [0, 3])
def test_partition_window_two_ranks_merged_into_one(schema, day_files, workers):
    """Two ranks' partition-window states merged and resumed by one loader (another number of streams):
    every row exactly once; a state of 31-unit windows is refused by a partition-window loader."""
    kw = dict(read_rows=10, shuffle_window=-1)
    heads, merged = two_ranks_merged(day_files, schema, 4, **kw)
    assert merged["shuffle"]["window"] == -1
    rest, end = run(day_files, schema, 8, [2, None], state=merged, num_workers=workers, **kw)
    assert sorted(heads + ids(rest)) == list(range(sum(map(sum, DAY_SIZES))))
    assert end["epoch"] == 1
    _, other = run(day_files, schema, 8, [3], shuffle_window=31, read_rows=10)
    with pytest.raises(ValueError, match="does not fit the row mixing"):
        run(day_files, schema, 8, [None], state=other, **kw)
