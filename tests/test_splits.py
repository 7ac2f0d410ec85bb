"""Partition selectors: the shipped recipes never train on test nor evaluate on training rows.

Both layouts are covered: day partitions (the simulator) and named train/valid/test splits (every
adapter), the latter both hand-made (runs everywhere) and converted from real data (skipped without it).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from opengem.config import ConfigError
from opengem.data.adapters import convert
from opengem.data.adapters.common import write_dataset
from opengem.data.dataset import Dataset
from opengem.data.parquet import write_parquet
from opengem.data.schema import FeatureSchema
from opengem.data.sim_config import SimConfig
from opengem.data.simulate import simulate
from opengem.data.splits import NAMED, OTHER, TIME, check_disjoint, layout, select_partitions
from opengem.errors import DatasetError
from opengem.train.config import DataConfig, load_run_config
from parquet_helpers import random_columns

REPO = Path(__file__).resolve().parents[1]
TINY_SCHEMA = REPO / "configs" / "schemas" / "tiny.toml"
RECIPES = ["tiny", "small", "base", "large", "frappe", "kuairand"]  # every [data] train/eval recipe
DAYS = ["day=000", "day=001", "day=002", "day=003"]
NAMED_PARTS = ["test", "train", "valid"]  # as Dataset.partitions() lists them: sorted by name


def _recipe_specs() -> list[tuple[str, str, str]]:
    out = [("DataConfig()", DataConfig().train, DataConfig().eval)]
    for name in RECIPES:
        d = load_run_config(REPO / "configs" / f"{name}.toml").data
        out.append((name, d.train, d.eval))
    return out


@pytest.fixture(scope="module")
def named(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A hand-made dataset in the adapters' layout: train/valid/test, written by their writer."""
    out = tmp_path_factory.mktemp("named")
    schema = FeatureSchema.load(TINY_SCHEMA)
    tables = {}
    for i, split in enumerate(("train", "valid", "test")):
        f = out.parent / f"{out.name}-{split}.parquet"
        write_parquet(schema, f, random_columns(schema, 30, seed=i, first_id=1000 * i))
        tables[split] = pq.read_table(f)
    write_dataset(out, schema, tables, "hand-made: ids 0.. train, 1000.. valid, 2000.. test")
    return out


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sim")
    tiny = load_run_config(REPO / "configs" / "tiny.toml").data.sim
    simulate(SimConfig(**{**tiny, "rows": 400, "days": 4}), out)
    return out


def _ids(ds: Dataset, spec: str) -> set[int]:
    col = ds.schema.example_id_column
    return {int(x) for f in ds.files(spec) for x in pq.read_table(f, columns=[col]).column(0).to_numpy()}


# --------------------------------------------------------------------------- layouts and selectors
def test_layout_is_read_from_partition_names():
    assert layout(DAYS) == TIME
    assert layout(NAMED_PARTS) == NAMED and layout(["train", "test"]) == NAMED
    assert layout(["day=000", "train"]) == OTHER  # a mix is neither: never guessed
    assert layout([".", "day=000"]) == OTHER and layout(["a", "b"]) == OTHER and layout([]) == OTHER


def test_time_selectors_train_on_the_past_and_evaluate_on_the_last_day():
    assert select_partitions("D", DAYS, "@train") == DAYS[:-1]
    assert select_partitions("D", DAYS, "@valid") == ["day=003"]
    assert select_partitions("D", DAYS, "@all_but_last") == DAYS[:-1]
    assert select_partitions("D", DAYS, "@last") == ["day=003"]
    with pytest.raises(DatasetError, match=r"'@test' needs named splits .* name the held-out day\(s\), "
                                           r"e.g. 'day=003'"):
        select_partitions("D", DAYS, "@test")
    with pytest.raises(DatasetError, match="needs at least two days"):
        select_partitions("D", ["day=000"], "@train")


def test_days_are_ordered_by_number_not_by_name():
    parts = sorted(["day=9", "day=10", "day=11"])  # by name: day=10, day=11, day=9
    assert select_partitions("D", parts, "@valid") == ["day=11"]
    assert select_partitions("D", parts, "@train") == ["day=9", "day=10"]
    assert select_partitions("D", parts, "@all") == ["day=9", "day=10", "day=11"]


def test_named_split_selectors_and_refused_time_selectors():
    assert select_partitions("D", NAMED_PARTS, "@train") == ["train"]
    assert select_partitions("D", NAMED_PARTS, "@valid") == ["valid"]
    assert select_partitions("D", NAMED_PARTS, "@test") == ["test"]
    assert select_partitions("D", NAMED_PARTS, "@train,@valid") == ["train", "valid"]
    assert select_partitions("D", NAMED_PARTS, "train") == ["train"]  # names still work
    assert select_partitions("D", NAMED_PARTS, "@all") == ["train", "valid", "test"]
    assert select_partitions("D", NAMED_PARTS, "t*") == ["train", "test"]
    for token in ("@last", "@all_but_last"):
        with pytest.raises(DatasetError, match=rf"D: '{token}' needs day=NNN partitions .* use '@train', "
                                               r"'@valid' or '@test'"):
            select_partitions("D", NAMED_PARTS, token)
    with pytest.raises(DatasetError, match=r"'@valid' selects the 'valid' split, which this dataset does not "
                                           r"have \(have: train, test\)"):
        select_partitions("D", ["test", "train"], "@valid")


def test_other_layouts_take_only_all_and_names():
    parts = ["a", "b", "c"]
    assert select_partitions("D", parts, "@all") == parts
    assert select_partitions("D", parts, "a,c") == ["a", "c"]
    for token in ("@last", "@train", "@valid"):
        with pytest.raises(DatasetError, match="are neither: select them by name"):
            select_partitions("D", parts, token)
    with pytest.raises(DatasetError, match="neither"):  # days plus a stray split: not guessed either
        select_partitions("D", ["day=000", "day=001", "test"], "@last")


def test_unknown_selector_and_empty_spec_are_refused():
    with pytest.raises(DatasetError, match=r"unknown partition selector '@trian'.*@all, @train"):
        select_partitions("D", DAYS, "@trian")
    with pytest.raises(DatasetError, match="empty partition spec"):
        select_partitions("D", DAYS, " , ")


def test_config_refuses_an_unknown_selector_naming_the_key():
    with pytest.raises(ConfigError, match=r"data.eval: unknown partition selector '@lats'"):
        load_run_config(None, ["data.eval=@lats"])
    with pytest.raises(ConfigError, match=r"data.train: empty partition spec"):
        load_run_config(None, ["data.train=''"])


def test_check_disjoint_refuses_shared_partitions():
    check_disjoint(["train"], ["valid"])
    check_disjoint(DAYS[:-1], DAYS[-1:], "D", "@train", "@valid")
    with pytest.raises(DatasetError, match=r"D: data.train \('@all'\) and data.eval \('@valid'\) both select "
                                           r"valid: evaluating on training rows"):
        check_disjoint(NAMED_PARTS, ["valid"], "D", "@all", "@valid")
    with pytest.raises(DatasetError, match=r"both select day=002, day=003"):
        check_disjoint(DAYS, DAYS[2:])


# --------------------------------------------------------------------------- the shipped recipes
@pytest.mark.parametrize("name,train,eval_", _recipe_specs(), ids=[r[0] for r in _recipe_specs()])
def test_recipe_selects_train_split_and_valid_split_on_named_layout(named, name, train, eval_):
    ds = Dataset(named)
    assert ds.partitions() == NAMED_PARTS
    assert ds.select(train) == ["train"] and ds.select(eval_) == ["valid"]
    check_disjoint(ds.select(train), ds.select(eval_), ds.root, train, eval_)
    # the rows the trainer would read: ids 0.. are train, 1000.. valid, 2000.. test (never trained on)
    assert _ids(ds, train) == set(range(30)) and _ids(ds, eval_) == set(range(1000, 1030))


@pytest.mark.parametrize("name,train,eval_", _recipe_specs(), ids=[r[0] for r in _recipe_specs()])
def test_recipe_trains_on_the_past_and_evaluates_on_the_last_day_of_a_simulation(sim, name, train, eval_):
    ds = Dataset(sim)
    assert ds.select(train) == DAYS[:-1] and ds.select(eval_) == ["day=003"]
    check_disjoint(ds.select(train), ds.select(eval_), ds.root, train, eval_)
    col = [ds.schema.time_column]
    past = np.concatenate([pq.read_table(f, columns=col).column(0).to_numpy() for f in ds.files(train)])
    future = np.concatenate([pq.read_table(f, columns=col).column(0).to_numpy() for f in ds.files(eval_)])
    assert past.max() < future.min()


def test_recipe_defaults_on_a_converted_dataset(tmp_path):
    """A real adapter's output (Frappe_x1, first 600 rows per source file): train, valid and test."""
    src = Path(os.environ.get("OPENGEM_DATA", REPO.parent / "shared" / "data")) / "frappe_x1"
    if not src.is_dir():
        pytest.skip(f"real data not found at {src} (set $OPENGEM_DATA or provide ../shared/data)")
    convert("frappe_x1", src, tmp_path, limit=600)
    ds = Dataset(tmp_path)
    assert ds.partitions() == NAMED_PARTS
    for name, train, eval_ in _recipe_specs():
        assert (ds.select(train), ds.select(eval_)) == (["train"], ["valid"]), name
        assert not _ids(ds, train) & _ids(ds, "@test"), name
    with pytest.raises(DatasetError, match="use '@train', '@valid' or '@test'"):
        ds.select("@all_but_last")  # was ["test", "train"]: trained on test, evaluated on valid

