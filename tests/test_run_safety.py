"""Run folders: one owner at a time (lock), never mixed with another run (--resume / --force, run ids),
clean stops on SIGINT/SIGTERM that resume exactly without logging a step twice, refused config changes on
--resume, per-run start-up phases, and an eval set without labels named instead of scored as 0.0."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dist_helpers import ROOT, TINY, assert_same_params, env
from opengem.data.dataset import Dataset
from opengem.errors import DatasetError, UsageError
from opengem.train import checkpoint as ckpt
from opengem.train import startup
from opengem.train import trainer as trainer_mod
from opengem.train.config import load_run_config
from opengem.train.data import prepare_data
from opengem.train.evaluate import EvalDataError, evaluate_run
from opengem.train.run_dir import (
    ResumeConfigError,
    RunExistsError,
    RunLock,
    RunLockedError,
    config_changes,
    read_run,
)
from opengem.train.trainer import RunInterrupted, train

FAST = ["train.progress=false", "train.threads=1", "train.warmup_steps=3", "train.final_eval=false",
        "data.batch_size=64"]


def cfg(*overrides: str):
    return load_run_config(TINY, [*FAST, *overrides])


def records(run: Path, kind: str | None = None) -> list[dict]:
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in recs if kind is None or r["kind"] == kind]


def train_steps(run: Path) -> list[int]:
    return [r["step"] for r in records(run, "train")]



@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return prepare_data(load_run_config(TINY).data, tmp_path_factory.mktemp("runsafety"))


@pytest.fixture(scope="module")
def done_run(tmp_path_factory, data):
    """A finished 4-step run (checkpoints at 2 and 4), copied by the tests that change it."""
    out = tmp_path_factory.mktemp("done") / "run"
    train(cfg("train.steps=4", "train.checkpoint_every=2", "train.log_every=2"), out, data)
    return out


def copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# --------------------------------------------------------------------------- lock
def test_second_writer_fails_at_once_naming_the_holder(tmp_path, data):
    run = tmp_path / "run"
    run.mkdir()
    with RunLock(run):
        with pytest.raises(RunLockedError, match=rf"in use by another run \(pid {os.getpid()} on "):
            train(cfg("train.steps=2"), run, data)
        assert not (run / "metrics.jsonl").exists() and not (run / "checkpoints").exists()
    summary = train(cfg("train.steps=2"), run, data)  # the holder is gone: the folder is free again
    assert summary["steps"] == 2
    RunLock(run).acquire().release()  # and the run released it when it ended


def test_online_run_takes_the_lock(tmp_path, data, capsys):
    from opengem.cli import main

    run = tmp_path / "online"
    run.mkdir()
    with RunLock(run):
        code = main(["train", "--online", "--config", str(TINY), "--data", str(data), "--out", str(run),
                     "train.progress=false", "train.online_max_idle_s=0"])
    err = capsys.readouterr().err
    assert code == 1 and f"in use by another run (pid {os.getpid()}" in err, err
    assert not (run / "versions").exists()


# --------------------------------------------------------------------------- ownership
def test_out_holding_another_run_is_refused_and_left_alone(tmp_path, done_run, data, capsys):
    from opengem.cli import main

    run = copy_run(done_run, tmp_path / "run")
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    with pytest.raises(RunExistsError, match="holds run .*--resume.*--force"):
        train(cfg("train.steps=2"), run, data)
    code = main(["train", "--config", str(TINY), "--data", str(data), "--out", str(run), *FAST,
                 "train.steps=2"])
    assert code == 2 and "use --resume to continue it" in capsys.readouterr().err
    after = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"}
    assert after == {p: b for p, b in before.items() if p.name != ".lock"}  # nothing appended or replaced


def test_force_moves_the_old_run_aside_whole(tmp_path):
    """--force: the old run (its embedded-default data included) moves to RUN.old-<time>, still evaluable
    on its own data; the new run starts a fresh log under a new run id."""
    run = tmp_path / "run"
    first = train(cfg("train.steps=2"), run)
    old_log = (run / "metrics.jsonl").read_bytes()
    second = train(cfg("train.steps=3"), run, force=True)
    [old] = tmp_path.glob("run.old-*")
    assert read_run(old)["run_id"] == first["run_id"] != second["run_id"] == read_run(run)["run_id"]
    assert (old / "metrics.jsonl").read_bytes() == old_log
    assert [r["run_id"] for r in records(run, "setup")] == [second["run_id"]]  # a log of its own
    assert ckpt.read_meta(old / "checkpoints" / "final")["step"] == 2
    assert ckpt.read_meta(run / "checkpoints" / "final")["step"] == 3
    assert load_run_config(old / "config.toml").data.path == str((old / "data").resolve())
    assert evaluate_run(old, write=False)["step"] == 2
    # a later run in the same process measures its own start-up, not the process's
    assert "process_start" not in second["startup"]["phases"]


def test_folder_checks(tmp_path, data):
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="is a file"):
        train(cfg(), tmp_path / "file", data)
    with pytest.raises(UsageError, match="dataset folder"):
        train(cfg(), data, data)
    with pytest.raises(UsageError, match="give one"):
        train(cfg(), tmp_path / "r", data, resume=True, force=True)
    inner = tmp_path / "r2"
    train(cfg("train.steps=1"), inner)
    with pytest.raises(UsageError, match="would move the dataset"):
        train(cfg("train.steps=1"), inner, inner / "data", force=True)


def test_overlapping_train_and_eval_partitions_are_refused(tmp_path, data):
    with pytest.raises(DatasetError, match="both select day=000"):
        train(cfg("train.steps=2", "train.final_eval=true", "data.eval=day=000"), tmp_path / "r", data)
    assert not (tmp_path / "r" / "checkpoints").exists()


def test_evaluate_resume_and_retention_use_only_the_runs_own_checkpoints(tmp_path, done_run, data):
    """A newer checkpoint of another run in the folder (step 40) is never evaluated, resumed or deleted."""
    run = copy_run(done_run, tmp_path / "run")
    other = train(cfg("train.steps=6"), tmp_path / "other", data)
    foreign = run / "checkpoints" / "step-00000040"
    shutil.copytree(tmp_path / "other" / "checkpoints" / "final", foreign)
    meta = json.loads((foreign / "meta.json").read_text())
    (foreign / "meta.json").write_text(json.dumps({**meta, "step": 40}))
    assert meta["run_id"] == other["run_id"] != read_run(run)["run_id"]

    res = evaluate_run(run, write=False)
    assert res["step"] == 4 and res["checkpoint"].endswith("final")
    more = train(cfg("train.steps=8", "train.checkpoint_every=2", "train.log_every=2",
                     "train.keep_checkpoints=1"), run, data, resume=True)
    assert more["resumed"]["step"] == 4 and more["run_id"] == read_run(run)["run_id"]
    assert foreign.exists()  # retention kept the other run's checkpoint
    assert [p.name for p in ckpt.periodic_checkpoints(run / "checkpoints", run_id=more["run_id"])] == [
        "step-00000008"]


# --------------------------------------------------------------------------- resume
def test_resume_with_changed_settings_is_refused_naming_the_keys(tmp_path, done_run, data, capsys):
    from opengem.cli import main

    run = copy_run(done_run, tmp_path / "run")
    with pytest.raises(ResumeConfigError, match=r"data.batch_size 64 -> 32; train.lr 0.003 -> 0.001"):
        train(cfg("train.steps=6", "train.lr=1e-3", "data.batch_size=32"), run, data, resume=True)
    code = main(["train", "--resume", "--config", str(TINY), "--data", str(data), "--out", str(run), *FAST,
                 "train.steps=6", "train.seed=7"])
    assert code == 2 and "train.seed 0 -> 7" in capsys.readouterr().err
    with pytest.raises(ResumeConfigError, match=r"model.embedding.d 16 -> 8"):
        train(cfg("train.steps=6", "model.embedding.d=8"), run, data, resume=True)
    assert ckpt.latest_checkpoint(run).name == "final" and len(records(run, "setup")) == 1  # untouched
    # more steps is no change of what is computed: allowed
    more = train(cfg("train.steps=6"), run, data, resume=True)
    assert more["resumed"]["step"] == 4 and more["config_changes"] == {}
    # --allow-config-change goes on, and records the change in metrics.jsonl and train_summary.json
    changed = train(cfg("train.steps=8", "train.lr=1e-3"), run, data, resume=True, allow_config_change=True)
    assert changed["config_changes"] == {"train.lr": [0.003, 0.001]} and changed["allow_config_change"]
    setup = records(run, "setup")[-1]
    assert setup["config_changes"] == {"train.lr": [0.003, 0.001]} and setup["allow_config_change"] is True
    saved = json.loads((run / "train_summary.json").read_text())
    assert saved["config_changes"] == {"train.lr": [0.003, 0.001]}


def test_config_changes_names_what_resume_may_not_change():
    base = cfg("train.steps=10")

    def diff(*o: str) -> set[str]:
        return set(config_changes(base, cfg("train.steps=10", *o)))

    assert diff("train.seed=1") == {"train.seed"}
    assert diff("data.train=day=000", "data.eval=day=001") == {"data.train", "data.eval"}
    assert diff("data.path='/elsewhere'") == {"data.path"}
    assert diff("data.sim.rows=10") == {"data.sim.rows"}
    assert diff("model.head.hidden=[8]") == {"model.head.hidden"}
    assert diff("train.steps=20", "train.log_every=1", "train.checkpoint_every=3", "train.threads=2") == set()
    cosine = cfg("train.steps=10", "train.lr_decay='cosine'")
    assert set(config_changes(cosine, cfg("train.steps=20", "train.lr_decay='cosine'"))) == {"train.steps"}


def test_resume_after_a_crash_logs_no_step_twice(tmp_path, done_run, data):
    """Killed after the step-2 checkpoint, with steps 3..4 already logged: the resumed run rolls the log back
    to step 2 and logs 3..4 once, with the losses of the uninterrupted run."""
    run = copy_run(done_run, tmp_path / "run")
    shutil.rmtree(run / "checkpoints" / "final")
    shutil.rmtree(run / "checkpoints" / "step-00000004")
    (run / "train_summary.json").unlink()
    full = {r["step"]: r["loss"] for r in records(done_run, "train")}
    res = train(cfg("train.steps=4", "train.checkpoint_every=2", "train.log_every=2"), run, data, resume=True)
    assert res["resumed"]["step"] == 2
    assert train_steps(run) == [2, 4]
    assert {r["step"]: r["loss"] for r in records(run, "train")} == full
    assert records(run, "setup")[-1]["log_records_rolled_back"] == 1


def test_a_run_from_before_run_ids_is_refused_or_adopted(tmp_path, done_run, data):
    run = copy_run(done_run, tmp_path / "run")
    (run / "run.json").unlink()
    with pytest.raises(RunExistsError, match="holds an earlier run"):
        train(cfg("train.steps=6"), run, data)
    res = train(cfg("train.steps=6"), run, data, resume=True)
    assert res["resumed"]["step"] == 4 and read_run(run)["adopted"] is True
    assert evaluate_run(run, write=False)["step"] == 6


def test_resuming_a_finished_run_does_not_log_its_final_evaluation_twice(tmp_path, data):
    run = tmp_path / "run"
    train(cfg("train.steps=2", "train.final_eval=true"), run, data)
    again = train(cfg("train.steps=2", "train.final_eval=true"), run, data, resume=True)
    assert again["resumed"]["step"] == 2 and again["final_eval"]
    assert [(r["step"], r.get("final")) for r in records(run, "eval")] == [(2, True)]


# --------------------------------------------------------------------------- stop signals
def _signal_at(monkeypatch, sig: signal.Signals, at_call: int) -> None:
    """Deliver ``sig`` to this process during the ``at_call``-th optimizer step, as Ctrl-C would."""
    real, calls = trainer_mod.optimizer_step, [0]

    def step(*a, **k):
        calls[0] += 1
        if calls[0] == at_call:
            signal.raise_signal(sig)
        return real(*a, **k)

    monkeypatch.setattr(trainer_mod, "optimizer_step", step)


def test_sigint_saves_a_checkpoint_and_resume_is_exact(tmp_path, data, monkeypatch):
    args = ("train.steps=12", "train.log_every=4")
    ref = train(cfg(*args), tmp_path / "ref", data)
    run = tmp_path / "run"
    handler = signal.getsignal(signal.SIGINT)
    with monkeypatch.context() as m:
        _signal_at(m, signal.SIGINT, 6)
        stopped = r"stopped by SIGINT at step 6: saved .*step-00000006.*--resume"
        with pytest.raises(RunInterrupted, match=stopped) as e:
            train(cfg(*args), run, data)
    assert e.value.exit_code == 130
    assert signal.getsignal(signal.SIGINT) is handler  # the old handler is back
    assert ckpt.read_meta(run / "checkpoints" / "step-00000006")["step"] == 6
    assert not (run / "checkpoints" / "final").exists() and not (run / "train_summary.json").exists()
    res = train(cfg(*args), run, data, resume=True)
    assert res["resumed"]["step"] == 6 and res["steps"] == 12
    assert train_steps(run) == [4, 8, 12]
    # the step-8 record averages steps 5..8 across the stop: the same as the uninterrupted run's
    assert {r["step"]: r["loss"] for r in records(run, "train")} == {
        r["step"]: r["loss"] for r in records(tmp_path / "ref", "train")}
    assert res["last_loss"] == ref["last_loss"]
    assert_same_params(tmp_path / "ref", run)


def test_sigterm_exits_143(tmp_path, data, monkeypatch):
    _signal_at(monkeypatch, signal.SIGTERM, 2)
    with pytest.raises(RunInterrupted, match="stopped by SIGTERM at step 2") as e:
        train(cfg("train.steps=5", "train.checkpoint_every=2"), tmp_path / "run", data)
    assert e.value.exit_code == 143
    assert ckpt.latest_checkpoint(tmp_path / "run").name == "step-00000002"


# --------------------------------------------------------------------------- start-up phases
def test_start_up_phases_are_measured_per_run(monkeypatch):
    """The demo's second run reported the first run's training as its `process_start` (132 s)."""
    monkeypatch.setattr(startup, "_process_start_claimed", False, raising=False)
    monkeypatch.setenv(startup.T0_ENV, str(time.time() - 100))
    first = startup.StartupTimer()
    assert first.phases["process_start"] == pytest.approx(100, abs=5)
    second = startup.StartupTimer()  # a second run in the same process
    assert "process_start" not in second.phases
    assert second.summary(0.0)["wall_seconds"] < 5


# --------------------------------------------------------------------------- evaluation without labels
def _without_labels(src: Path, dst: Path, part: str) -> Path:
    shutil.copytree(src, dst)
    labels = [t.label_column for t in Dataset(dst).schema.tasks]
    for f in (dst / part).glob("*.parquet"):
        t = pq.read_table(f)
        for c in labels:
            i = t.schema.get_field_index(c)
            t = t.set_column(i, t.schema.field(c), pa.nulls(t.num_rows, pa.float32()))
        pq.write_table(t, f)
    return dst


def test_eval_set_without_labels_is_named_not_scored(tmp_path, data, capsys):
    unlabelled = _without_labels(data, tmp_path / "data", "day=002")
    run = tmp_path / "run"
    summary = train(cfg("train.steps=4", "train.eval_every=2", "train.final_eval=true"), run, unlabelled)
    # training finished and saved; the evaluations that had nothing to measure are a recorded warning
    assert summary["final_eval"] is None and (run / "checkpoints" / "final").exists()
    [warning] = summary["warnings"]
    assert "partitions day=002" in warning and "has an observed label" in warning, warning
    assert [r["message"] for r in records(run, "warning")] == [warning]
    assert not records(run, "eval")
    assert "warning: " in capsys.readouterr().err
    with pytest.raises(EvalDataError, match=r"partitions day=002: none of the \d+ evaluation rows has an "
                                            r"observed label"):
        evaluate_run(run)
    assert not (run / "eval.json").exists()


# --------------------------------------------------------------------------- the real thing: processes
def _cli(out: Path, data: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "opengem.cli", "train", "--config", str(TINY), "--data", str(data),
            "--out", str(out), *FAST, "train.log_every=10", *extra]


@pytest.mark.slow
def test_two_writers_then_ctrl_c_then_resume(tmp_path, data):
    """Two `opengem train` on one --out: one fails at once naming the other's pid. Ctrl-C on the other
    saves a checkpoint and exits 130 with one line; --resume finishes with no step logged twice and the
    same parameters and losses as an uninterrupted run."""
    n = "train.steps=400"
    run = tmp_path / "run"
    procs = [subprocess.Popen(_cli(run, data, n), env=env(), cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        t0 = time.time()
        while all(p.poll() is None for p in procs):
            assert time.time() - t0 < 120, "neither writer ended"
            time.sleep(0.05)
        loser = next(p for p in procs if p.poll() is not None)
        winner = next(p for p in procs if p is not loser)
        err = loser.stderr.read()
        assert loser.returncode == 1 and f"in use by another run (pid {winner.pid} on " in err, err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1
        while not (run / "metrics.jsonl").exists() or not train_steps(run):
            assert winner.poll() is None and time.time() - t0 < 120, "the run ended before Ctrl-C"
            time.sleep(0.05)
        winner.send_signal(signal.SIGINT)
        _, err = winner.communicate(timeout=120)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert winner.returncode == 130, err
    assert "Traceback" not in err
    [line] = [x for x in err.strip().splitlines() if "error:" in x]
    assert line.startswith("opengem train: error: stopped by SIGINT at step ") and "--resume" in line, err
    stopped = ckpt.read_meta(ckpt.latest_checkpoint(run))["step"]
    assert 0 < stopped < 400
    r = subprocess.run([*_cli(run, data, n), "--resume"], env=env(), cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    steps = train_steps(run)
    assert steps == list(range(10, 401, 10))  # strictly increasing, none twice, none missing
    ref = subprocess.run(_cli(tmp_path / "ref", data, n), env=env(), cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert ref.returncode == 0, ref.stderr[-3000:]
    assert {r["step"]: r["loss"] for r in records(run, "train")} == {
        r["step"]: r["loss"] for r in records(tmp_path / "ref", "train")}
    assert_same_params(tmp_path / "ref", run)
