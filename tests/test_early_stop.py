"""Early stopping (issue 11): which step wins, when the run stops, and that the kept weights are used."""

import json
import math
from pathlib import Path

import pytest

from opengem.config import ConfigError, load_config
from opengem.train.config import RunConfig, load_run_config
from opengem.train.early_stop import EarlyStopConfig, EarlyStopper
from opengem.train.evaluate import evaluate_run
from opengem.train.trainer import train

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.toml"


def _res(ne: float, auc: float = 0.5, loss: float = 0.5) -> dict:
    return {"loss": loss, "metrics": {"feed/click": {"ne": 9.0, "auc": 0.1},
                                      "all/click": {"ne": ne, "auc": auc}}}


def test_stopper_keeps_the_best_and_stops_after_patience():
    s = EarlyStopper(EarlyStopConfig(metric="ne", patience=2))
    seen = [s.update(step, _res(ne)) for step, ne in [(10, 0.9), (20, 0.85), (30, 0.86)]]
    assert seen == [True, True, False]
    assert not s.should_stop
    assert s.update(40, _res(0.87)) is False and s.should_stop
    assert (s.best_step, s.best_value, s.evaluations) == (20, 0.85, 4)
    # AUC: larger is better; an explicit key decides instead of the all/<task> mean
    a = EarlyStopper(EarlyStopConfig(metric="auc", key="feed/click", patience=1))
    assert a.update(1, _res(0.9, auc=0.6)) and not a.update(2, _res(0.1, auc=0.7)) and a.should_stop
    # NaN (no observed label) never improves; state survives a resume
    n = EarlyStopper(EarlyStopConfig(patience=3))
    assert not n.update(1, _res(math.nan))
    m = EarlyStopper(EarlyStopConfig(patience=3))
    m.load_state_dict(json.loads(json.dumps(s.state_dict())))
    assert (m.best_step, m.bad, m.should_stop) == (20, 2, True)


def test_config_inline_table_and_errors(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[train]\nearly_stop = { partition = "@valid", metric = "ne", patience = 2 }\n')
    cfg = load_config(RunConfig, p)
    assert cfg.train.early_stop == EarlyStopConfig(partition="@valid", metric="ne", patience=2)
    assert not RunConfig().train.early_stop.enabled  # default: off, today's behaviour
    with pytest.raises(ConfigError, match="train.early_stop.metric"):
        load_run_config(TINY, ["train.early_stop.metric='acc'"])
    with pytest.raises(ConfigError, match="train.early_stop.patience"):
        load_run_config(TINY, ["train.early_stop.patience=-1"])


def _records(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_run_stops_keeps_best_and_evaluate_uses_it(tmp_path):
    # min_delta 10: only the first evaluation can improve, so the run must stop after `patience` more
    run = tmp_path / "run"
    cfg = load_run_config(TINY, ["train.progress=false", "train.steps=40", "train.eval_every=4",
                                 "train.early_stop.patience=2", "train.early_stop.min_delta=10.0"])
    summary = train(cfg, run)
    es = summary["early_stop"]
    assert summary["steps"] == 12 and es["stopped_early"] and es["best_step"] == 4
    decisions = [r for r in _records(run) if r["kind"] == "early_stop" and not r.get("final")]
    assert [(r["step"], r["improved"]) for r in decisions] == [(4, True), (8, False), (12, False)]
    meta = json.loads((run / "checkpoints" / "best" / "meta.json").read_text())
    assert meta["step"] == 4
    # the decision's score: the mean over tasks of the all/<task> NE of the step-4 evaluation
    at4 = next(r for r in _records(run) if r["kind"] == "eval" and r["step"] == 4)["metrics"]
    task_ne = [m["ne"] for k, m in at4.items() if k.startswith("all/")]
    assert decisions[0]["value"] == pytest.approx(sum(task_ne) / len(task_ne), rel=1e-9)
    # the final evaluation and `opengem evaluate` both measure the kept step-4 model, not step 12
    at12 = next(r for r in _records(run) if r["kind"] == "eval" and r["step"] == 12 and not r.get("final"))
    assert at12["metrics"]["all/click"]["ne"] != pytest.approx(at4["all/click"]["ne"], rel=1e-6)
    assert summary["final_eval"]["all/click"]["ne"] == pytest.approx(at4["all/click"]["ne"], rel=1e-6)
    ev = evaluate_run(run)
    assert ev["checkpoint_kind"].startswith("best") and ev["step"] == 4
    assert ev["metrics"]["all/click"]["ne"] == pytest.approx(at4["all/click"]["ne"], rel=1e-6)


def test_epoch_mode_decides_once_per_epoch(tmp_path):
    run = tmp_path / "run"
    cfg = load_run_config(TINY, ["train.progress=false", "train.steps=0", "train.epochs=6",
                                 "train.eval_every=0",
                                 "train.early_stop.patience=1", "train.early_stop.min_delta=10.0",
                                 "train.final_eval=false"])
    summary = train(cfg, run)
    assert summary["epochs"] == 2 and summary["early_stop"]["stopped_early"]
    per_epoch = summary["steps"] // 2
    assert summary["early_stop"]["best_step"] == per_epoch


def test_early_stop_partition_must_not_overlap_train(tmp_path):
    cfg = load_run_config(TINY, ["train.progress=false", "train.steps=4", "train.early_stop.patience=1",
                                 "train.early_stop.partition='@train'"])
    with pytest.raises(ConfigError, match=r"train.early_stop.partition \('@train'\) and data.train"):
        train(cfg, tmp_path / "run")


def test_the_state_training_ended_in_is_compared_too(tmp_path):
    """With eval_every = 0 the last epoch was never compared (done before the check), nor the steps after
    the last periodic evaluation: 'best' could be worse than the final model."""
    run = tmp_path / "run"
    cfg = load_run_config(TINY, ["train.progress=false", "train.steps=0", "train.epochs=2",
                                 "train.eval_every=0", "train.early_stop.patience=5",
                                 "train.final_eval=false"])
    summary = train(cfg, run)
    decisions = [r for r in _records(run) if r["kind"] == "early_stop" and not r.get("final")]
    assert [r["step"] for r in decisions] == [summary["steps"] // 2, summary["steps"]]
    run2 = tmp_path / "run2"
    cfg = load_run_config(TINY, ["train.progress=false", "train.steps=10", "train.eval_every=4",
                                 "train.early_stop.patience=5", "train.final_eval=false"])
    train(cfg, run2)
    decisions = [r for r in _records(run2) if r["kind"] == "early_stop" and not r.get("final")]
    assert [r["step"] for r in decisions] == [4, 8, 10]


def test_an_early_stopped_run_resumed_stays_stopped(tmp_path):
    """--resume of a run early stopping had ended trained on (5 more steps, another decision, final
    checkpoint overwritten); a finished run resumes as a no-op."""
    run = tmp_path / "run"
    args = ["train.progress=false", "train.steps=40", "train.eval_every=4", "train.early_stop.patience=1",
            "train.early_stop.min_delta=10.0"]
    first = train(load_run_config(TINY, args), run)
    assert first["early_stop"]["stopped_early"] and first["steps"] == 8
    again = train(load_run_config(TINY, args), run, resume=True)
    assert again["steps"] == 8 and again["early_stop"]["best_step"] == 4
