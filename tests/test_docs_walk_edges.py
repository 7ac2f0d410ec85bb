"""What new users walking the docs ran into (session 56's two hunts). docs/TRANSFER.md, SCALING.md and
ARCHITECTURE.md: VM recipes refused before the FM trains, the Triton kernel on a CPU run, what to do after
Ctrl-C in the commands without --resume, the ablation study's budgets, the iso-FLOP plan's advice, a
transfer --out that is a run folder. README, DATA.md, SERVING.md: a model name checked before the data is
simulated, selections that select nothing as usage errors, problem lines, export's and convert's messages,
simulate's progress in a log."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from opengem import cli
from opengem.bench import ablation, isoflop, isoflop_report, scale
from opengem.bench.ablation_report import one_seed_agreement
from opengem.config import ConfigError
from opengem.errors import UsageError
from opengem.train.trainer import RunInterrupted
from opengem.transfer.experiment import check_transfer_folder
from opengem.transfer.experiment_config import ExperimentConfig

REPO = Path(__file__).resolve().parents[1]
TINY_TRANSFER = str(REPO / "configs" / "transfer-tiny.toml")


def _opengem(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "opengem.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=600, env=env)


@pytest.mark.parametrize("override,said", [
    ('vm.schema.sparse=["nope"]', "vm.schema.sparse: ['nope'] not in the FM schema"),
    ('vm.model.name="nope"', "vm.model.name: unknown model 'nope'"),
])
def test_a_vm_recipe_that_does_not_fit_is_refused_before_the_fm_trains(tmp_path, override, said):
    out = tmp_path / "t"
    r = _opengem("transfer", "--config", TINY_TRANSFER, "--out", str(out), override, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert said in r.stderr and "Traceback" not in r.stderr and "internal error" not in r.stderr
    assert not (out / "seed0" / "fm").exists()  # no FM version was trained first


def test_no_seeds_is_named_as_such():
    with pytest.raises(ConfigError, match="^seeds: at least one seed"):
        ExperimentConfig(seeds=[]).validate()


def test_transfer_refuses_an_out_that_is_a_training_run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("")
    with pytest.raises(UsageError, match="training run's folder, not a transfer experiment's"):
        check_transfer_folder(run)
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "schema.toml").write_text("")
    with pytest.raises(UsageError, match="dataset folder"):
        check_transfer_folder(tmp_path / "ds")
    earlier = tmp_path / "earlier"
    (earlier / "seed0").mkdir(parents=True)
    (earlier / "transfer.json").write_text("{}")
    check_transfer_folder(earlier)  # an earlier experiment's folder: a re-run reuses its work
    check_transfer_folder(tmp_path / "new")


def test_the_triton_kernel_on_a_cpu_run_is_a_config_error_before_the_run_folder(tmp_path):
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the tests run Triton interpreted
    r = _opengem("train", "--config", str(REPO / "configs" / "tiny.toml"), "--out", str(out), "train.steps=2",
                 'model.gem.kernel="triton"', "train.device=cpu", cwd=tmp_path, env=env)
    assert r.returncode == 2, r.stderr
    assert "model.gem.kernel = 'triton'" in r.stderr and "Traceback" not in r.stderr
    assert not (out / "run.json").exists() and not (out / "config.toml").exists()


def test_after_an_interrupt_each_command_says_its_own_way_to_go_on():
    e = RunInterrupted("stopped by SIGINT at step 3: saved RUN/checkpoints/step-00000003", 130)
    assert str(e).endswith("; run the same command with --resume to continue")  # train, distill
    for command in ("transfer", "scale"):
        __import__(cli.COMMANDS[command][0])  # the CLI has imported the command's module when it runs
        said = cli._message(e, cli.COMMANDS[command])
        assert said.startswith("stopped by SIGINT at step 3: saved") and "--resume" not in said
        assert "run the same command again" in said
    assert cli._message(e, cli.COMMANDS["train"]) == str(e)


def test_the_ablation_study_budgets():
    assert ablation.default_config_path(None).name == "ablation.toml"  # --budget not given: the default
    assert ablation.default_config_path("small").name == "ablation-small.toml"
    with pytest.raises(ConfigError, match="--budget large: the ablation study has a small and a default"):
        ablation.default_config_path("large")
    args = SimpleNamespace(families="gem", config=None, budget=None)
    with pytest.raises(UsageError, match="--families: an option of --design isoflop"):
        ablation.run_cli(args)


def test_a_sweep_names_which_study_each_option_belongs_to():
    args = SimpleNamespace(design="sweep", budget=None, families="gem", plan=False)
    with pytest.raises(UsageError, match=r"--families: options of the studies .*--families: isoflop"):
        scale.run(args)


def test_the_iso_flop_plan_advises_what_moves_steps_and_what_moves_passes():
    with pytest.raises(ConfigError) as few_steps:
        isoflop.plan_grid([1e6], {"gem": [10_000]}, {"gem": 64}, train_rows=10**6, min_steps=5)
    assert "raise the smallest budgets or shrink the batch" in str(few_steps.value)
    assert "data.sim.rows" not in str(few_steps.value)  # rows do not change a run's steps
    with pytest.raises(ConfigError) as passes:
        isoflop.plan_grid([1e12], {"gem": [10_000]}, {"gem": 64}, train_rows=1000, min_steps=1)
    assert "more training rows (data.sim.rows" in str(passes.value)


def test_an_empty_rate_grid_is_reported_as_the_recipe_rate():
    cfg = isoflop.load_isoflop_config(REPO / "configs" / "isoflop-small.toml", ["lr_grid=[]"])
    assert isoflop_report.lr_rule(cfg) == "each family's recipe rate (lr_grid = [], nothing searched)"
    searched = isoflop.load_isoflop_config(REPO / "configs" / "isoflop-small.toml")
    assert isoflop_report.lr_rule(searched).startswith(f"grid {searched.lr_grid}")


def test_one_seed_agreement_of_all_tied_configs_warns_nothing():
    full = {"a": [1.0, 1.0, 1.0], "b": [1.0, 1.0, 1.0]}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = one_seed_agreement(full, 20, np.random.default_rng(0))
    assert res["rho"] != res["rho"]  # NaN: nothing to rank


# ----------------------------------------------------------------------- README, DATA.md, SERVING.md


def test_an_unknown_model_name_is_refused_before_any_data_is_simulated(tmp_path):
    out = tmp_path / "run"
    r = _opengem("train", "--config", str(REPO / "configs" / "small.toml"), "--out", str(out),
                 "model.name=gemm", cwd=tmp_path)
    assert r.returncode == 2 and "model.name: unknown model 'gemm'; choose one of gem" in r.stderr, r.stderr
    assert not out.exists()  # it simulated 875k rows into RUN/data first


@pytest.mark.parametrize("spec,said", [("@bogus", "unknown partition selector '@bogus'"),
                                       ("day=999", "no partition matches 'day=999'")])
def test_a_partition_selection_that_selects_nothing_is_a_usage_error(tmp_path, spec, said):
    from opengem.data.sim_config import SimConfig
    from opengem.data.simulate import simulate

    data = tmp_path / "d"
    simulate(SimConfig(rows=300, days=2, users=40, ads=20, topics=10), data)
    r = _opengem("validate", "--data", str(data), "--partitions", spec, cwd=tmp_path)
    assert r.returncode == 2 and said in r.stderr, r.stderr


def test_problems_name_column_and_row_only_when_known():
    from opengem.data.parquet import Problem, ProblemLog

    assert str(Problem("d/_COMPLETE", None, None, "missing", "error")) == "d/_COMPLETE: missing [error]"
    assert str(Problem("f.parquet", "ad_id", 3, "negative id", "error")) == \
        "f.parquet: column 'ad_id' row 3: negative id [error]"
    log = ProblemLog(raise_errors=False)
    log.add("d/_COMPLETE", None, "missing", "error")
    assert log.report().splitlines()[1] == "  d/_COMPLETE: missing: 1"


def test_export_names_a_missing_folder_and_an_online_run(tmp_path):
    from opengem.serve.export import load_run
    from opengem.train.evaluate import RunNotFoundError

    with pytest.raises(RunNotFoundError, match="nosuch: no such folder"):
        load_run(tmp_path / "nosuch")
    online = tmp_path / "online"
    (online / "versions").mkdir(parents=True)
    (online / "config.toml").write_text("")
    with pytest.raises(RunNotFoundError, match="an online run keeps its models as published versions"):
        load_run(online)


def test_a_named_dataset_source_that_does_not_exist_is_said_so(tmp_path):
    from opengem.data.adapters import convert
    from opengem.data.adapters.common import AdapterError

    with pytest.raises(AdapterError, match="no such folder"):
        convert("movielens_100k", tmp_path / "nowhere", tmp_path / "out")


def test_simulate_writes_no_carriage_returns_into_a_log(tmp_path):
    r = _opengem("simulate", "--out", str(tmp_path / "d"), "--rows", "300", "--days", "2", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "\r" not in r.stdout + r.stderr


def test_a_failed_command_collects_its_cycles_before_the_process_exits(tmp_path, monkeypatch, capsys):
    """convert's one-line error was followed, in ~1 run of 25, by "terminate called without an active
    exception" (exit 134): Arrow readers held by the exception's frames lived until interpreter teardown,
    after Arrow's thread pools. The CLI collects them before returning (0 aborts in 100 runs after)."""
    import gc

    calls = []
    real = gc.collect
    monkeypatch.setattr(gc, "collect", lambda *a: calls.append(1) or real(*a))
    (tmp_path / "t.csv").write_text("a,click\n1,0\n")
    rc = cli.main(["convert", "table", "--src", str(tmp_path / "t.csv"), "--label", "clik", "--infer-schema",
                   "--out", str(tmp_path / "o")])
    assert rc == 1 and "missing your column(s) clik" in capsys.readouterr().err
    assert calls  # collected after the error, before main returned


def test_a_transfer_rerun_of_another_config_keeps_the_earlier_results(tmp_path):
    """Re-running into the same --out reuses the earlier work; the earlier transfer.json (say, of other
    arms) was replaced without a word. Now it is moved aside when the config differs."""
    import json

    from opengem.transfer.experiment import keep_earlier_result

    path = tmp_path / "transfer.json"
    assert keep_earlier_result(path, {"arms": ["baseline"]}) is None  # nothing yet
    path.write_text(json.dumps({"config": {"arms": ["baseline", "kd"]}, "arms": {"kd": 1}}))
    assert keep_earlier_result(path, {"arms": ["baseline", "kd"]}) is None  # the same config: replaced
    assert path.exists()
    kept = keep_earlier_result(path, {"arms": ["baseline"]})
    assert kept is not None and kept.name.startswith("transfer-") and not path.exists()
    assert json.loads(kept.read_text())["arms"] == {"kd": 1}
    path.write_text(json.dumps({"config": {"arms": ["kd"]}}))
    again = keep_earlier_result(path, {"arms": ["baseline"]})  # the same second: a new name, nothing lost
    assert again is not None and again != kept and kept.exists()
