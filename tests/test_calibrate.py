"""``opengem calibrate`` (issue 14, calibration): Platt scaling per surface x task fitted on held-out rows,
folded exactly into the head's last layer, and applied by every reader of the run."""

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from opengem.cli import main
from opengem.data.random_batch import random_batch
from opengem.data.schema import FeatureSchema
from opengem.model.heads import HeadConfig
from opengem.model.registry import MODEL_NAMES, ModelConfig, build_model
from opengem.ops.kernel import Kernel
from opengem.serve.export import load_run
from opengem.train.calibrate import calibrate_run, fit_calibration, fit_logistic
from opengem.train.calibration import (
    CALIBRATION,
    CalibrationError,
    find_head,
    fold_into_head,
    read_calibration,
)
from opengem.train.config import load_run_config
from opengem.train.evaluate import evaluate_run, open_run
from opengem.train.predict import predict_run
from opengem.train.trainer import train

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.toml"
TINY_SCHEMA = ROOT / "configs" / "schemas" / "tiny.toml"


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def test_fit_logistic_recovers_slope_and_offset_and_is_at_the_optimum():
    rng = np.random.default_rng(0)
    z = rng.normal(-2.0, 1.5, 200_000)
    y = (rng.random(z.size) < _sigmoid(0.7 * z - 0.4)).astype(float)
    a, c = fit_logistic(z, y)
    assert a == pytest.approx(0.7, abs=0.03) and c == pytest.approx(-0.4, abs=0.06)
    q = _sigmoid(a * z + c)  # first-order optimality: the score equations hold
    assert abs(np.dot(q - y, z)) < 1e-6 * z.size and abs((q - y).sum()) < 1e-6 * z.size
    # with an intercept, the fitted probabilities sum to the positives exactly (calibration in the large)
    assert q.sum() == pytest.approx(y.sum(), rel=1e-6)
    a1, c1 = fit_logistic(z, (rng.random(z.size) < _sigmoid(z + 0.5)).astype(float), slope=False)
    assert a1 == 1.0 and c1 == pytest.approx(0.5, abs=0.05)


def test_fit_logistic_on_a_constant_logit_and_bad_shapes():
    z = np.zeros(1000)
    y = np.r_[np.ones(100), np.zeros(900)]
    a, c = fit_logistic(z, y)
    assert _sigmoid(a * 0 + c) == pytest.approx(0.1, rel=1e-6)
    with pytest.raises(ValueError, match="equal non-empty"):
        fit_logistic(np.zeros(3), np.zeros(4))


def test_cells_fall_back_to_their_task_and_never_reverse_the_ranking():
    rng = np.random.default_rng(1)
    n = 60_000
    surface = rng.integers(0, 3, n)
    z = rng.normal(-2.0, 1.0, (n, 2))
    level = np.array([0.5, -0.5, 0.0])[surface]  # surface 0 under-, 1 over-predicted by the model
    y = np.zeros((n, 2))
    y[:, 0] = rng.random(n) < _sigmoid(z[:, 0] + level)
    y[:, 1] = rng.random(n) < _sigmoid(-z[:, 1] - 2.0)  # task 1 ranks backwards
    mask = np.ones((n, 2), bool)
    mask[surface == 2, 0] = rng.random((surface == 2).sum()) < 0.001  # surface 2: a handful of labels
    fit = fit_calibration(z, y, mask, surface, ["a", "b", "c"], ["click", "conv"], "platt", min_positives=30)
    assert fit.cells["a/click"]["source"] == "own" and fit.offset[0, 0] == pytest.approx(0.5, abs=0.1)
    assert fit.cells["b/click"]["source"] == "own" and fit.offset[1, 0] == pytest.approx(-0.5, abs=0.1)
    assert fit.cells["c/click"]["source"] == "all/click"
    assert (fit.slope[2, 0], fit.offset[2, 0]) == pytest.approx(
        fit_logistic(z[mask[:, 0], 0], y[mask[:, 0], 0]))
    for cell in ("a", "b", "c"):  # a backwards model keeps its ranking: offset only
        assert fit.cells[f"{cell}/conv"]["slope"] == 1.0
    for key in ("a/click", "b/click", "a/conv"):  # each own fit matches its cell's rate exactly
        assert fit.cells[key]["cal_after"] == pytest.approx(1.0, abs=1e-6)
    none = fit_calibration(z, y * 0, mask, surface, ["a", "b", "c"], ["click", "conv"], "offset", 30)
    assert (none.slope == 1).all() and (none.offset == 0).all()
    assert none.cells["a/click"]["source"].startswith("none")


@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize("kernel", [Kernel.FUSED, Kernel.PYTORCH])
def test_folding_into_the_head_is_exact_for_every_model(name, kernel):
    """logit' = a[s, t] * logit + c[s, t] on every row, whatever the model: the logit is linear in the head's
    last layer, so the fit needs no new op in any reader (export, AOTI, serving)."""
    torch.manual_seed(0)
    schema = FeatureSchema.load(TINY_SCHEMA)
    model = build_model(schema, ModelConfig(name=name, head=HeadConfig(context="dense"))).eval()
    find_head(model).kernel = kernel
    with torch.no_grad():  # the context term (model.head.context) adds to the same logit: it must scale too
        find_head(model).context_weight.normal_()
    batch = random_batch(schema, 64)
    with torch.no_grad():
        before = model(batch).logits.double()
    S, T = len(schema.surfaces), len(schema.task_names)
    rng = np.random.default_rng(2)
    a, c = rng.uniform(0.5, 1.5, (S, T)), rng.normal(0, 0.5, (S, T))
    fold_into_head(model, a, c)
    with torch.no_grad():
        after = model(batch).logits.double()
    s = batch.surface.long()
    want = torch.as_tensor(a)[s] * before + torch.as_tensor(c)[s]
    torch.testing.assert_close(after, want, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("calrun")
    train(load_run_config(TINY, ["train.progress=false", "train.steps=30"]), out)
    return out


def _logits(run_dir, calibrated: bool) -> tuple[torch.Tensor, torch.Tensor]:
    from opengem.train.data import make_loader

    with open_run(run_dir, calibrated=calibrated) as r, torch.no_grad():
        batch = next(iter(make_loader(r.ds, r.cfg.data.eval, r.cfg.data, train=False)))
        return r.model(batch).logits.double(), batch.surface.long()


def test_calibrate_writes_the_fit_and_evaluate_predict_export_apply_it(tiny_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    raw, surface = _logits(run, calibrated=False)
    doc = calibrate_run(run, min_positives=5)
    assert (run / CALIBRATION).exists() and doc["fitted_on"]["spec"] == "@valid"
    a, c = torch.tensor(doc["slope"]), torch.tensor(doc["offset"])
    cal, _ = _logits(run, calibrated=True)
    torch.testing.assert_close(cal, a[surface] * raw + c[surface], rtol=1e-5, atol=1e-5)
    # evaluate on the rows it was fitted on: each cell with its own fit is right on average (the MLE's
    # intercept equation), and the result says what was applied
    ev = evaluate_run(run, write=False)
    assert ev["calibration"]["method"] == "platt" and ev["calibration"]["fitted_on"] == ["day=002"]
    own = [k for k, v in doc["cells"].items() if v["source"] == "own"]
    assert own, doc["cells"]
    for key in own:
        assert ev["metrics"][key]["calibration"] == pytest.approx(1.0, abs=1e-4), key
    # predict writes the calibrated probabilities
    predict_run(run, tmp_path / "p.parquet")
    p = pq.read_table(tmp_path / "p.parquet")
    assert ev["metrics"]["all/click"]["calibration"] == pytest.approx(
        np.nanmean(p.column("click").to_numpy()[~np.isnan(p.column("click_label").to_numpy(
            zero_copy_only=False).astype(float))]) / np.nanmean(p.column("click_label").to_numpy(
                zero_copy_only=False).astype(float)), rel=1e-4)
    # export folds it into the artifact's weights
    loaded = load_run(run)
    assert loaded.source["calibration"]["method"] == "platt"
    with open_run(run) as r:
        head = find_head(r.model).state_dict()
        want = {k: v.detach().cpu() for k, v in head.items() if k.startswith("out_")}
    got = find_head(loaded.model).state_dict()
    for k, v in want.items():
        torch.testing.assert_close(got[k], v)


def test_a_calibration_of_another_checkpoint_is_not_applied(tiny_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    calibrate_run(run, method="offset", min_positives=5)
    doc = json.loads((run / CALIBRATION).read_text())
    doc["checkpoint_digest"] = "0" * 64  # as if training went on after the fit
    (run / CALIBRATION).write_text(json.dumps(doc))
    ev = evaluate_run(run, write=False)
    assert ev["calibration"] is None
    assert "was fitted on checkpoint" in capsys.readouterr().err


def test_bad_calibration_files_are_refused_in_one_line(tmp_path):
    schema = FeatureSchema.load(TINY_SCHEMA)
    surfaces, tasks = list(schema.surfaces), schema.task_names
    S, T = len(surfaces), len(tasks)
    good = {"format": 1, "method": "platt", "checkpoint_digest": "x", "surfaces": surfaces, "tasks": tasks,
            "slope": [[1.0] * T] * S, "offset": [[0.0] * T] * S}
    path = tmp_path / CALIBRATION
    path.write_text(json.dumps(good))
    assert read_calibration(path, surfaces, tasks)["method"] == "platt"
    bad = [("{not json", "unreadable"),
           (json.dumps({**good, "format": 7}), "not an opengem calibration"),
           (json.dumps({**good, "method": "isotonic"}), "'method'"),
           (json.dumps({**good, "tasks": ["x"]}), "fitted for surfaces"),
           (json.dumps({**good, "slope": [[1.0] * T]}), "'slope' must be"),
           (json.dumps({**good, "offset": [["0"] * T] * S}), "'offset' must be"),
           (json.dumps({**good, "slope": [[-1.0] * T] * S}), "reverse or erase")]
    for text, msg in bad:
        path.write_text(text)
        with pytest.raises(CalibrationError, match=msg):
            read_calibration(path, surfaces, tasks)
    path.write_text(json.dumps({**good, "offset": [[float("nan")] * T] * S}))  # json writes NaN
    with pytest.raises(CalibrationError, match="finite"):
        read_calibration(path, surfaces, tasks)


def test_cli_fits_prints_refuses_training_data_and_removes(tiny_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    assert main(["calibrate", "--run", str(run), "--min-positives", "5"]) == 0
    out = capsys.readouterr().out
    assert "feed/click" in out and f"wrote {run / CALIBRATION}" in out
    assert main(["evaluate", "--run", str(run)]) == 0
    assert "calibrated (platt on day=002)" in capsys.readouterr().out
    assert main(["export", str(run), "--out", str(tmp_path / "art"), "--backend", "eager"]) == 0
    assert "calibrated (platt on day=002)" in capsys.readouterr().out
    assert main(["calibrate", "--run", str(run), "--partitions", "day=000"]) == 2
    assert "training data of this run" in capsys.readouterr().err
    (run / CALIBRATION).write_text("[]")
    assert main(["evaluate", "--run", str(run)]) == 1
    err = capsys.readouterr().err
    assert "not an opengem calibration file" in err and "Traceback" not in err
    assert main(["calibrate", "--run", str(run), "--remove"]) == 0
    assert not (run / CALIBRATION).exists()


@pytest.mark.slow
def test_two_ranks_fold_the_calibration_into_their_shards(tiny_run, tmp_path):
    """Under torchrun the head's weights are FSDP2 DTensors (sharded over surfaces): each rank folds the fit
    into its own shard, and `opengem evaluate` reads the 1-process metrics."""
    import subprocess
    import sys

    from dist_helpers import ROOT, env

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    calibrate_run(run, min_positives=5)
    one = evaluate_run(run, write=False)["metrics"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "opengem.cli", "evaluate", "--run-dir", str(run)]
    r = subprocess.run(cmd, env=env(), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "calibrated (platt on day=002)" in r.stdout
    two = json.loads((run / "eval.json").read_text())
    assert two["calibration"]["method"] == "platt"
    for k in ("all/click", "all/conversion", "feed/click"):
        assert two["metrics"][k]["ne"] == pytest.approx(one[k]["ne"], rel=1e-5)
        assert two["metrics"][k]["calibration"] == pytest.approx(one[k]["calibration"], rel=1e-5)


def test_one_pass_gives_the_fit_and_the_calibrated_metrics_of_the_folded_model(tiny_run):
    """The observers of evaluate_model: LogitCollector keeps what collect_logits gives on the same rows, and
    CalibratedMetrics scores the raw logits through a fit as the model with that fit folded in scores."""
    from opengem.train.calibrate import CalibratedMetrics, LogitCollector, collect_logits
    from opengem.train.data import make_loader
    from opengem.train.evaluate import evaluate_model, evaluate_models

    with open_run(tiny_run, calibrated=False) as r:
        schema = r.ds.schema
        surfaces, tasks = list(schema.surfaces), schema.task_names
        rows = lambda spec: make_loader(r.ds, spec, r.cfg.data, train=False)  # noqa: E731
        kept = LogitCollector()
        valid = evaluate_model(r.model, rows(r.cfg.data.eval), schema, r.device, on_logits=kept)
        assert valid == evaluate_model(r.model, rows(r.cfg.data.eval), schema, r.device)  # watching is free
        zs, y, m, s = kept.arrays()
        assert list(zs) == ["model"]
        alone = collect_logits(r.model, rows(r.cfg.data.eval), r.device)
        for got, want in zip((zs["model"], y, m, s), alone):
            np.testing.assert_array_equal(got, want)
        both = LogitCollector()  # several models score each batch: its rows are kept once
        evaluate_models({"a": r.model, "b": r.model}, rows(r.cfg.data.eval), schema, r.device, on_logits=both)
        zs2, y2, m2, s2 = both.arrays()
        assert list(zs2) == ["a", "b"] and len(y2) == len(y) == len(zs2["b"])
        np.testing.assert_array_equal(zs2["a"], zs["model"])
        np.testing.assert_array_equal(y2, y)
        np.testing.assert_array_equal(m2, m)
        np.testing.assert_array_equal(s2, s)
        fit = fit_calibration(zs["model"], y, m, s, surfaces, tasks, "platt", min_positives=5)
        assert not np.allclose(fit.slope, 1.0) and not np.allclose(fit.offset, 0.0)
        calibrated = CalibratedMetrics(fit, surfaces, tasks)
        raw = evaluate_model(r.model, rows(r.cfg.data.train), schema, r.device, on_logits=calibrated)
        fold_into_head(r.model, fit.slope, fit.offset)
        folded = evaluate_model(r.model, rows(r.cfg.data.train), schema, r.device)["metrics"]
    got = calibrated.compute()
    assert got.keys() == folded.keys()
    for cell, m in folded.items():
        for k in ("ne", "auc", "calibration"):
            if m[k] == m[k]:  # NaN where a cell has no positives
                assert got[cell][k] == pytest.approx(m[k], rel=1e-5, abs=1e-7), (cell, k)
    assert got["all/click"]["ne"] != raw["metrics"]["all/click"]["ne"]
