import json
from pathlib import Path

import pytest
import torch

from opengem.config import ConfigError
from opengem.data.dataset import Dataset
from opengem.model.heads import masked_bce
from opengem.train.config import TrainConfig, load_run_config
from opengem.train.data import make_loader, prepare_data
from opengem.train.distributed import process_group
from opengem.train.optim import lr_factor
from opengem.train.parallelize import build_run_model
from opengem.train.trainer import train

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.toml"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    cfg = load_run_config(TINY, ["train.progress=false", "train.steps=24", "train.log_every=4",
                                 "train.checkpoint_every=12", "train.eval_every=12",
                                 "train.eval_max_batches=2"])
    summary = train(cfg, out)
    return out, summary


def test_run_folder_complete(tiny_run):
    out, summary = tiny_run
    assert summary["steps"] == 24
    assert (out / "checkpoints" / "final" / ".metadata").exists()
    assert (out / "checkpoints" / "step-00000012" / ".metadata").exists()
    assert any((out / "tb").glob("events.out.tfevents.*"))
    assert (out / "data" / "schema.toml").exists()  # embedded default simulated into RUN/data
    # the resolved config reloads and names the data it trained on
    cfg = load_run_config(out / "config.toml")
    assert Path(cfg.data.path) == (out / "data").resolve()
    assert cfg.train.steps == 24
    assert summary["flops_per_example"] and summary["flops_per_example"] > 0
    assert summary["sparse_optimizer"] is not None  # DMP built a fused optimizer for the tables
    # train.cpu_linear = auto: what the run decided, for --resume (train/cpu_linear.py)
    assert json.loads((out / "cpu_linear.json").read_text())["kernel"] in ("pytorch", "onednn")


def test_loss_decreases(tiny_run):
    out, _ = tiny_run
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train_losses = [r["loss"] for r in records if r["kind"] == "train"]
    assert len(train_losses) == 6
    assert train_losses[-1] < 0.6 * train_losses[0], train_losses
    periodic = [r["step"] for r in records if r["kind"] == "eval" and not r.get("final")]
    assert periodic == [12, 24]
    final = [r for r in records if r["kind"] == "eval" and r.get("final")]
    assert final and "feed/click" in final[0]["metrics"]


def test_fused_sparse_optimizer_updates_tables(tmp_path):
    """One step must change the rows of an embedding table a batch touched (the fused optimizer ran)."""
    cfg = load_run_config(TINY, ["train.progress=false"])
    data = prepare_data(cfg.data, tmp_path)
    ds = Dataset(data)
    dev = torch.device("cpu")
    with process_group(dev) as pg:
        model = build_run_model(ds.schema, cfg, dev, pg).model

        def table_weights():
            return {k: v.local_shards()[0].tensor.clone() for k, v in model.state_dict().items()
                    if hasattr(v, "local_shards")}

        before = table_weights()
        assert before, "no sharded embedding tables: the model did not go through DMP"
        batch = next(iter(make_loader(ds, cfg.data.train, cfg.data, train=True)))
        out = model(batch)
        masked_bce(out.logits, batch.labels, batch.label_mask).backward()
        after = table_weights()
        changed = {k for k in before if not torch.equal(before[k], after[k])}
        assert changed, "no embedding table changed after backward"
    assert not torch.distributed.is_initialized()  # the private process group was destroyed


def test_lr_schedule():
    cfg = TrainConfig(steps=100, warmup_steps=10, lr_decay="cosine", min_lr_ratio=0.1)
    assert lr_factor(0, cfg) == pytest.approx(0.1)
    assert lr_factor(9, cfg) == pytest.approx(1.0)
    assert lr_factor(10, cfg) == pytest.approx(1.0)
    assert lr_factor(55, cfg) == pytest.approx(0.55)
    assert lr_factor(100, cfg) == pytest.approx(0.1)
    assert lr_factor(500, TrainConfig(warmup_steps=10)) == 1.0


def test_bad_config_names_the_key():
    with pytest.raises(ConfigError, match="train.device"):
        load_run_config(TINY, ["train.device=tpu"])
    with pytest.raises(ConfigError, match="unknown key 'stepz'"):
        load_run_config(TINY, ["train.stepz=3"])
    with pytest.raises(ConfigError, match="train.lr_decay"):
        load_run_config(TINY, ["train.steps=0", "train.lr_decay=cosine"])


@pytest.mark.parametrize("recipe", ["tiny", "small", "base", "large"])
def test_recipes_load(recipe):
    cfg = load_run_config(TINY.parent / f"{recipe}.toml")
    assert cfg.model.name == "gem"
    assert cfg.data.path == ""  # every recipe runs on the embedded default


def test_small_recipe_baselines_near_gems_flops():
    """The demo trains each baseline for GEM's training FLOPs (rows x its FLOPs/example); keep their
    FLOPs/example near GEM's, so none reads less than half or more than two epochs of the demo's data."""
    from opengem.data.sim_config import SimConfig, sim_schema
    from opengem.demo import load_demo_config
    from opengem.model.registry import build_model

    demo = load_demo_config(None, [])
    flops = {}
    for name in ("gem", "dlrm", "dcnv2"):
        cfg = load_run_config(TINY.parent / "small.toml", demo.overrides.get(name, []))
        cfg.model.name = name
        schema = sim_schema(SimConfig.from_dict(cfg.data.sim))
        flops[name] = build_model(schema, cfg.model).flops_per_example()
    for name in ("dlrm", "dcnv2"):
        assert 0.5 < flops[name] / flops["gem"] < 2.0, flops


def test_bad_data_dir_is_clear(tmp_path):
    from opengem.data.dataset import DatasetError

    cfg = load_run_config(TINY, ["train.progress=false"])
    with pytest.raises(DatasetError, match="dataset folder not found"):
        train(cfg, tmp_path / "run", tmp_path / "nope")


def test_capped_periodic_evaluation_reads_rows_spread_over_the_day(tmp_path):
    """train.eval_max_batches: that many eval batches' rows, whole row groups spread over the validation
    partitions (not their first rows, a time-ordered day's first minutes)."""
    from opengem.train.evaluate import evaluate_model
    from opengem.train.trainer import Trainer

    cfg = load_run_config(TINY, ["train.progress=false", "train.steps=2", "data.eval_batch_size=64",
                                 "data.sim.chunk_rows=64"])
    with Trainer(cfg, tmp_path / "run") as tr:
        tr.fit()
        got = tr._evaluate_or_warn(2)
        d = tr.cfg.data
        units = make_loader(tr.ds, d.eval, d, train=False).all_units()
        assert len(units) > 4  # enough row groups that the first two are not a spread
        spread = evaluate_model(tr.model, make_loader(tr.ds, d.eval, d, train=False, spread_rows=128),
                                tr.ds.schema, tr.device)
        first = evaluate_model(tr.model, make_loader(tr.ds, d.eval, d, train=False), tr.ds.schema,
                               tr.device, max_batches=2)
    assert got["rows"] == first["rows"] == 128
    assert got["metrics"] == spread["metrics"] and got["metrics"] != first["metrics"]
