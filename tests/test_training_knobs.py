"""Training knobs a user expects on small click logs (issue 11): embedding L2, head dropout, output bias
at the base rate, peak memory in the summary, evaluation records the report draws, every model in help."""

import json
import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from opengem.bench.report import build_report
from opengem.cli import MODEL_NAMES as CLI_MODEL_NAMES
from opengem.cli import main
from opengem.config import ConfigError
from opengem.data.dataset import Dataset
from opengem.model.heads import HeadConfig, MultiSurfaceHead
from opengem.model.registry import MODEL_NAMES
from opengem.train.config import load_run_config
from opengem.train.data import make_loader, prepare_data
from opengem.train.trainer import Trainer, train

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.toml"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    cfg = load_run_config(TINY, ["train.progress=false"])
    return prepare_data(cfg.data, tmp_path_factory.mktemp("knobs"))


def _heads(model: torch.nn.Module) -> list[MultiSurfaceHead]:
    return [m for m in model.modules() if isinstance(m, MultiSurfaceHead)]


def _tables(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.local_shards()[0].tensor.clone() for k, v in model.state_dict().items()
            if hasattr(v, "local_shards") and "ebc" in k}


def test_output_bias_starts_at_the_train_base_rate(data):
    cfg = load_run_config(TINY, ["train.progress=false"])
    ds = Dataset(data)
    # the rates, counted here independently from the train partitions' Parquet files
    sch = ds.schema
    t = pq.read_table(ds.files("@train"), columns=[sch.surface_column, *(k.label_column for k in sch.tasks)])
    surface = t.column(0).to_numpy()
    with Trainer(cfg, None, data) as tr:
        (head,) = _heads(tr.model)
        bias = head.out_bias.detach().cpu().numpy()
        for j, task in enumerate(sch.tasks):
            y = t.column(1 + j).to_numpy(zero_copy_only=False).astype(float)
            for s in range(len(sch.surfaces)):
                sel = (surface == s) & ~np.isnan(y)
                rate = y[sel].mean()
                assert bias[s, j] == pytest.approx(math.log(rate / (1 - rate)), abs=1e-5), (s, task.name)
                assert tr.base_rates[s][j] == pytest.approx(rate, abs=1e-6)
    assert load_run_config(TINY).train.init_output_bias  # on by default
    with Trainer(load_run_config(TINY, ["train.progress=false", "train.init_output_bias=false"]), None,
                 data) as tr:
        assert torch.count_nonzero(_heads(tr.model)[0].out_bias) == 0 and tr.base_rates is None


def test_embedding_l2_pulls_touched_rows_towards_zero(data):
    ds = Dataset(data)
    cfg0 = load_run_config(TINY, ["train.progress=false", "train.warmup_steps=0"])
    batch = next(iter(make_loader(ds, "@train", cfg0.data, train=True)))
    after, parts = {}, {}
    for l2 in (0.0, 1.0):
        cfg = load_run_config(TINY, ["train.progress=false", "train.warmup_steps=0",
                                     f"train.embedding_l2={l2}"])
        with Trainer(cfg, None, data) as tr:
            before = _tables(tr.model)
            tr.train_step(batch)
            after[l2] = _tables(tr.model)
            parts[l2] = dict(tr.last_parts)
    assert "embedding_l2" not in parts[0.0] and parts[1.0]["embedding_l2"] > 0
    key = next(k for k in before if "user_id" in k)
    touched = (after[0.0][key] != before[key]).any(dim=1)
    assert touched.any() and not touched.all()
    shrunk = after[1.0][key][touched].norm(dim=1) < after[0.0][key][touched].norm(dim=1)
    assert shrunk.float().mean() > 0.9, "L2 did not pull the touched rows towards 0"
    # rows no example looked up are left alone
    assert torch.equal(after[1.0][key][~touched], before[key][~touched])


def test_head_dropout_trains_noisy_evaluates_deterministic():
    torch.manual_seed(0)
    plain = MultiSurfaceHead(12, 2, 3, HeadConfig(hidden=[16], adapter_dim=4))
    torch.manual_seed(0)
    drop = MultiSurfaceHead(12, 2, 3, HeadConfig(hidden=[16], adapter_dim=4, dropout=0.5))
    # same parameter names and values: a dropout setting does not change checkpoints
    shapes = [{k: v.shape for k, v in m.state_dict().items()} for m in (plain, drop)]
    assert shapes[0] == shapes[1]
    x, s = torch.randn(64, 12), torch.randint(0, 2, (64,))
    drop.train()
    assert not torch.equal(drop(x, s)[0], drop(x, s)[0])
    drop.eval()
    plain.eval()
    assert torch.allclose(drop(x, s)[0], plain(x, s)[0])
    with pytest.raises(ConfigError, match="model.head.dropout"):
        load_run_config(TINY, ["model.head.dropout=1.0"])
    with pytest.raises(ConfigError, match="train.embedding_l2"):
        load_run_config(TINY, ["train.embedding_l2=-0.1"])


def test_summary_has_peak_memory_and_report_draws_ne_curve(tmp_path):
    run = tmp_path / "run"
    cfg = load_run_config(TINY, ["train.progress=false", "train.steps=12", "train.eval_every=4",
                                 "train.eval_max_batches=2", "model.head.dropout=0.1",
                                 "train.embedding_l2=1e-4"])
    summary = train(cfg, run)
    assert isinstance(summary["peak_rss_mb"], float) and summary["peak_rss_mb"] > 50
    on_disk = json.loads((run / "train_summary.json").read_text())
    assert on_disk["peak_rss_mb"] == summary["peak_rss_mb"]
    evals = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in evals if r["kind"] == "eval" and not r.get("final")] == [4, 8, 12]
    page = build_report([run])
    assert "no evaluation records in metrics.jsonl" not in page
    assert "peak_rss_mb" in page and "Memory: not recorded" not in page


def test_help_lists_every_model(capsys):
    assert tuple(CLI_MODEL_NAMES) == tuple(MODEL_NAMES)
    for argv in (["--help"], ["train", "--help"]):
        with pytest.raises(SystemExit):
            main(argv)
        text = " ".join(capsys.readouterr().out.split())
        for name in MODEL_NAMES:
            assert name in text, (argv, name)
