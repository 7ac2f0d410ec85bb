"""parallelize(): plans per train.sharding, FSDP units, same init whatever the plan, clear config errors."""

from __future__ import annotations

import logging

import pytest
import torch
from torchrec.modules.embedding_modules import EmbeddingCollection

from dist_helpers import ROOT, TINY
from opengem.config import ConfigError
from opengem.data.random_batch import random_batch
from opengem.data.schema import FeatureSchema
from opengem.model.registry import build_model
from opengem.train.config import load_run_config
from opengem.train.distributed import process_group
from opengem.train.optim import apply_sparse_optimizer, embedding_modules
from opengem.train.parallelize import (
    ParallelizeError,
    dense_blocks,
    full_state,
    init_from_full,
    parallelize,
    table_names,
)
from opengem.train.startup import StartupTimer, process_start_time

SCHEMA = ROOT / "configs" / "schemas" / "tiny.toml"


def _build(sharding: str):
    cfg = load_run_config(TINY, ["train.progress=false", f"train.sharding={sharding}"])
    schema = FeatureSchema.load(SCHEMA)
    torch.manual_seed(0)
    model = build_model(schema, cfg.model)
    full = full_state(model)
    apply_sparse_optimizer(model, cfg.train)
    return cfg, schema, model, full


@pytest.mark.parametrize("sharding", ["table_wise", "row_wise", "column_wise"])
def test_plan_follows_config_and_init_is_the_full_model(sharding, caplog):
    """The planner obeys train.sharding; every shard starts from the one full init; planning prints nothing
    (TorchRec warns on every run about a Topology built without its factory)."""
    dev = torch.device("cpu")
    cfg, schema, model, full = _build(sharding)
    tables = set(table_names(model))
    seq_tables = {t.name for m in embedding_modules(model) if isinstance(m, EmbeddingCollection)
                  for t in m.embedding_configs()}
    logging.getLogger("torchrec.distributed.planner").setLevel(logging.NOTSET)  # as in a fresh process
    with process_group(dev) as pg, caplog.at_level(logging.WARNING):
        sharded, info = parallelize(model, None, cfg.train, dev, pg)
        assert not [r.getMessage() for r in caplog.records if r.name.startswith("torchrec")]
        assert set(info["plan"]) == tables
        assert {info["plan"][t] for t in seq_tables} == {sharding}
        # no row-wise EmbeddingBagCollection on CPU in torchrec 1.8: those fall back to table-wise
        want_ebc = "table_wise" if sharding == "row_wise" else sharding
        assert {v for t, v in info["plan"].items() if t not in seq_tables} == {want_ebc}
        assert "fsdp" not in info  # alone: no FSDP
        init_from_full(sharded, full)
        for k, v in sharded.state_dict().items():
            if hasattr(v, "local_shards"):
                for shard in v.local_shards():
                    o, s = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                    want = full[k][tuple(slice(a, a + b) for a, b in zip(o, s))]
                    assert torch.equal(shard.tensor, want), k
            else:
                assert torch.equal(v, full[k]), k
        out = sharded(random_batch(schema, 8, seed=1))
        assert out.logits.shape == (8, len(schema.tasks))


def test_auto_over_one_rank_keeps_every_table_whole():
    """Row-wise over one rank places the same rows on the same rank and only adds bucketising."""
    dev = torch.device("cpu")
    cfg, _, model, _ = _build("auto")
    tables = set(table_names(model))
    with process_group(dev) as pg:
        _, info = parallelize(model, None, cfg.train, dev, pg)
    assert set(info["plan"]) == tables and len(tables) > 1
    assert set(info["plan"].values()) == {"table_wise"}


def test_dense_blocks_are_outermost_layers_without_tables():
    _, _, model, _ = _build("auto")
    blocks = dense_blocks(model)
    names = {id(m): n for n, m in model.named_modules()}
    got = [names[id(b)] for b in blocks]
    assert "interformer.layers.0" in got
    assert not any(n.startswith("interformer.layers.0.") for n in got)  # outermost only
    assert all("ebc" not in n and "ecs" not in n for n in got)


def test_config_errors_name_the_key():
    for bad, key in [("train.sharding=diagonal", "train.sharding"),
                     ("train.dp_replicate=0", "train.dp_replicate"),
                     ("train.fsdp_mixed_precision=fp8", "train.fsdp_mixed_precision"),
                     ("train.keep_checkpoints=-1", "train.keep_checkpoints")]:
        with pytest.raises(ConfigError, match=key):
            load_run_config(TINY, [bad])


def test_2d_sparse_layout_is_gpu_only_with_a_clear_message():
    dev = torch.device("cpu")
    cfg, _, model, _ = _build("auto")
    cfg.train.sparse_replicas = 2
    with process_group(dev) as pg, pytest.raises(ParallelizeError, match="DMPCollection.*CUDA"):
        parallelize(model, None, cfg.train, dev, pg)


def test_startup_timer_phases_add_up(monkeypatch):
    monkeypatch.setattr("opengem.train.startup._process_start_claimed", False)  # as in a fresh process
    t = StartupTimer()
    with t.phase("model_build"):
        pass
    t.add("compile", 0.5)
    t.add("compile", 0.25)
    s = t.summary(train_seconds=0.0)
    assert s["phases"]["compile"] == 0.75 and "model_build" in s["phases"]
    assert s["phases"].get("process_start", 0) > 0  # this interpreter started before the timer
    assert process_start_time() is not None and process_start_time() <= t.created
    assert "compile" in t.format(0.0) and s["effective_training_fraction"] == 0.0
