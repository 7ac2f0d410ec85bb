import itertools
import json
from pathlib import Path

import pytest

from opengem.data.loader import ParquetLoader, merge_states
from opengem.data.parquet import CanonicalWriter, random_columns
from opengem.data.schema import FeatureSchema

TINY = Path(__file__).resolve().parents[1] / "configs" / "schemas" / "tiny.toml"
SIZES = (100, 61, 45)  # rows per file; row groups of 37 -> 3 + 2 + 2 units
N = sum(SIZES)


@pytest.fixture(scope="module")
def schema() -> FeatureSchema:
    return FeatureSchema.load(TINY)


@pytest.fixture(scope="module")
def files(schema, tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("ds")
    schema.save(root / "schema.toml")
    out, first = [], 0
    for i, n in enumerate(SIZES):
        path = root / "train" / f"part-{i:05d}.parquet"
        path.parent.mkdir(exist_ok=True)
        with CanonicalWriter(schema, path, row_group_size=37) as w:
            w.write(random_columns(schema, n, seed=i, first_id=first))
        out.append(path)
        first += n
    return out


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
