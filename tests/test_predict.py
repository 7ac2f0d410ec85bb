"""``opengem predict`` and per-selection evaluation files (issue 11)."""

import json
import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from opengem.bench.report_data import PREDICTIONS, load_run
from opengem.cli import main
from opengem.data.dataset import Dataset
from opengem.metrics import MetricAccumulator
from opengem.train.config import load_run_config
from opengem.train.evaluate import eval_file_name, evaluate_run
from opengem.train.predict import predict_run
from opengem.train.trainer import train

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.toml"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("predrun")
    train(load_run_config(TINY, ["train.progress=false", "train.steps=8"]), out)
    return out


def test_predictions_cover_every_row_and_reproduce_evaluate(run_dir, tmp_path):
    out = tmp_path / "p.parquet"
    res = predict_run(run_dir, out)
    ds = Dataset(load_run_config(run_dir / "config.toml").data.path)
    sch = ds.schema
    truth = pq.read_table(ds.files("@valid"), columns=[sch.example_id_column, sch.surface_column])
    t = pq.read_table(out)
    tasks = sch.task_names
    assert t.column_names == ["example_id", "surface", *tasks, *(f"{k}_label" for k in tasks)]
    assert res["rows"] == t.num_rows == truth.num_rows
    assert sorted(t.column("example_id").to_pylist()) == sorted(truth.column(0).to_pylist())
    for k in tasks:
        p = t.column(k).to_numpy()
        assert ((p > 0) & (p < 1)).all()
    # the file alone reproduces `opengem evaluate`'s metrics on the same selection
    acc = MetricAccumulator(sch.surfaces, tasks)
    probs = torch.tensor(np.stack([t.column(k).to_numpy() for k in tasks], 1))
    labels_np = np.stack([t.column(f"{k}_label").to_numpy(zero_copy_only=False).astype(float)
                          for k in tasks], 1)
    mask = torch.tensor(~np.isnan(labels_np))
    labels = torch.tensor(np.nan_to_num(labels_np), dtype=torch.float32)
    surface = torch.tensor([sch.surfaces.index(s) for s in t.column("surface").to_pylist()])
    acc.update(probs.float(), labels, mask, surface)
    mine = acc.compute()
    ev = evaluate_run(run_dir, write=False)
    for key in ("all/click", "feed/click"):
        assert mine[key]["ne"] == pytest.approx(ev["metrics"][key]["ne"], rel=1e-5)
        assert mine[key]["auc"] == pytest.approx(ev["metrics"][key]["auc"], rel=1e-5)
    # and the report draws reliability curves from it
    (run_dir / PREDICTIONS).write_bytes(out.read_bytes())
    try:
        curves = load_run(run_dir).reliability
    finally:
        (run_dir / PREDICTIONS).unlink()
    assert {"all/click", "feed/click"} <= set(curves)


def test_cli_refuses_to_overwrite_and_leaves_no_temporary(run_dir, tmp_path, capsys):
    out = tmp_path / "p.parquet"
    out.write_text("keep me")
    assert main(["predict", "--run", str(run_dir), "--out", str(out)]) == 2
    assert "exists" in capsys.readouterr().err and out.read_text() == "keep me"
    assert main(["predict", "--run", str(run_dir), "--out", str(out), "--force",
                 "--partitions", "@train"]) == 0
    assert pq.read_table(out).num_rows > 0
    assert [p.name for p in tmp_path.iterdir()] == ["p.parquet"]  # no .tmp left beside it
    assert main(["predict", "--run", str(tmp_path), "--out", str(tmp_path / "q.parquet")]) != 0


def test_evaluations_of_different_selections_do_not_overwrite(run_dir):
    for f in run_dir.glob("eval*.json"):
        os.remove(f)
    default = evaluate_run(run_dir)
    assert {Path(p).name for p in default["written"]} == {"eval.json", "eval-valid.json"}
    other = evaluate_run(run_dir, partitions="@train")
    assert [Path(p).name for p in other["written"]] == ["eval-train.json"]
    on_disk = json.loads((run_dir / "eval.json").read_text())
    assert on_disk["partitions"] == default["partitions"] != other["partitions"]
    assert json.loads((run_dir / "eval-train.json").read_text())["partitions"] == other["partitions"]
    assert eval_file_name("day=003,day=004") == "eval-day=003_day=004.json"
    assert eval_file_name("../x") == "eval-x.json"
