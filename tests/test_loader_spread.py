"""Evaluation on a sample spread over the day (``spread_rows``): whole row groups evenly spaced, the same
rows every time, and never the partition's first minutes alone."""

from pathlib import Path

import pytest

from opengem.data.loader import ParquetLoader, Unit, spread_units
from opengem.data.schema import FeatureSchema
from test_loader import TINY, write_dataset

SIZES = (37 * 6, 37 * 4 + 20)  # two files, row groups of 37: 6 + 5 units (the last one 20 rows)


@pytest.fixture(scope="module")
def schema() -> FeatureSchema:
    return FeatureSchema.load(TINY)


@pytest.fixture(scope="module")
def files(schema, tmp_path_factory) -> list[Path]:
    return write_dataset(schema, tmp_path_factory.mktemp("spread"), {"day=006": SIZES})


def _units(sizes: list[int]) -> list[Unit]:
    return [Unit(None, i, 0, n) for i, n in enumerate(sizes)]  # type: ignore[arg-type]


def test_spread_units_are_evenly_spaced_whole_units_and_the_last_is_cut():
    units = _units([10] * 12)
    assert [u.rg for u in spread_units(units, 40)] == [1, 4, 7, 10]  # the middle of each quarter
    assert [u.rg for u in spread_units(units, 20)] == [3, 9]
    cut = spread_units(units, 35)
    assert [u.rg for u in cut] == [1, 4, 7, 10] and [u.num_rows for u in cut] == [10, 10, 10, 5]
    assert cut[-1].begin == 0  # a unit's first rows, read as a slice of its row group
    assert sum(u.num_rows for u in spread_units(units, 1)) == 1
    assert spread_units(units, 500) == units  # fewer rows than asked: all of them
    assert spread_units(units, 0) == units
    uneven = _units([10, 1, 1, 10, 1, 1])  # small units chosen: more of them until the rows are there
    assert sum(u.num_rows for u in spread_units(uneven, 12)) == 12


def test_loader_reads_the_spread_rows_once_and_not_the_first_ones(schema, files):
    every = ParquetLoader(files, schema, 16)
    units = every.all_units()
    first = [i for b in ParquetLoader(files, schema, 16) for i in b.example_id.tolist()]
    spread = ParquetLoader(files, schema, 16, spread_rows=74)
    got = [i for b in spread for i in b.example_id.tolist()]
    assert spread.num_rows == len(got) == 74
    want = [u.first_row + k + (0 if Path(u.info.path) == files[0] else SIZES[0])
            for u in spread_units(units, 74) for k in range(u.num_rows)]
    assert got == want  # example ids count up across files
    assert got != first[:74] and max(got) > SIZES[0]  # reaches the second file: the whole day
    assert got == [i for b in ParquetLoader(files, schema, 16, spread_rows=74) for i in b.example_id.tolist()]
    several = ParquetLoader(files, schema, 16, spread_rows=74, num_workers=2)
    assert sorted(i for b in several for i in b.example_id.tolist()) == sorted(got)


def test_spread_rows_refused_with_shuffling_or_for_training(schema, files):
    from opengem.data.dataset import Dataset
    from opengem.train.config import DataConfig
    from opengem.train.data import make_loader

    with pytest.raises(ValueError, match="spread_rows"):
        ParquetLoader(files, schema, 16, spread_rows=10, shuffle_units=True)
    with pytest.raises(ValueError, match="spread_rows"):
        ParquetLoader(files, schema, 16, spread_rows=10, shuffle_window=4)
    with pytest.raises(ValueError, match="spread_rows"):
        ParquetLoader(files, schema, 16, spread_rows=-1)
    ds = Dataset(files[0].parent.parent)
    with pytest.raises(ValueError, match="spread_rows"):
        make_loader(ds, "day=006", DataConfig(), train=True, spread_rows=10)
    assert make_loader(ds, "day=006", DataConfig(), train=False, spread_rows=10).num_rows == 10
