"""What the bug hunt of session 55 found in simulate, scale and the studies, pinned: each bad input is one
line with the right exit code, a plan writes no study, and nothing a study wrote is lost or left
disagreeing with its results."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cli_helpers import one_error_line, run_cli
from opengem.data.oracle import format_table
from opengem.data.sim_config import SimConfig, SimConfigError
from opengem.train.config import DataConfig
from opengem.train.data import prepare_data

ROOT = Path(__file__).resolve().parents[1]
TINY_SWEEP = ROOT / "configs" / "scaling-tiny.toml"


@pytest.mark.parametrize("flag", ["--plan", "--families=gem", "--budget=small"])
def test_a_sweep_refuses_the_study_options_it_would_ignore(tmp_path: Path, capsys, flag: str) -> None:  # type: ignore
    rc, err = run_cli(capsys, ["scale", "--config", str(TINY_SWEEP), flag, "--out", str(tmp_path / "s")])
    line = one_error_line(err, "scale")
    assert rc == 2 and f"{flag.split('=')[0]}: options of the studies" in line, line
    assert not (tmp_path / "s").exists()


def test_an_isoflop_plan_writes_no_study_config(tmp_path: Path, capsys) -> None:  # type: ignore
    rc, _ = run_cli(capsys, ["scale", "--design", "isoflop", "--budget", "small", "--families", "gem",
                             "--plan", "--set", "budgets=[3.8e8,1.2e9]", "--out", str(tmp_path / "iso")])
    assert rc == 0
    assert not (tmp_path / "iso" / "isoflop.toml").exists()
    assert not list((tmp_path / "iso").glob(".*.running"))


@pytest.mark.parametrize("key", ["click_scale", "drift_rad_per_day", "seq_mean"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_every_float_of_the_simulator_must_be_finite(key: str, value: float) -> None:
    with pytest.raises(SimConfigError, match=rf"data.sim.{key}: must be a finite number"):
        SimConfig.from_dict({key: value})


def test_fewer_topics_than_interests_names_topics(tmp_path: Path, capsys) -> None:  # type: ignore
    rc, err = run_cli(capsys, ["simulate", "--out", str(tmp_path / "d"), "--rows", "200", "--topics", "3"])
    line = one_error_line(err, "simulate")
    assert rc == 2 and "topics: must be >= interests_max (5" in line, line


def test_the_oracle_table_shows_a_cell_with_no_rows() -> None:
    table = format_table([{"key": "video/click", "rows": 0, "rate": None, "mean_p": None, "ne": None}])
    assert table.splitlines()[-1].split() == ["video/click", "0", "n/a", "n/a", "n/a", "1.000"]


def test_simulated_data_of_another_config_is_kept_unless_a_scratch_cache(tmp_path: Path) -> None:
    small = DataConfig(sim={"rows": 600, "days": 3, "users": 50, "ads": 20, "topics": 10})
    first = prepare_data(small, tmp_path)
    summary = (first / "summary.json").read_text()
    assert prepare_data(small, tmp_path) == first  # the same config: reused
    other = DataConfig(sim={**small.sim, "rows": 700})
    from opengem.errors import UsageError

    with pytest.raises(UsageError, match=r"another simulator config \(rows 600 -> 700\)"):
        prepare_data(other, tmp_path)
    assert (first / "summary.json").read_text() == summary
    assert '"rows": 700' in (prepare_data(other, tmp_path, replace=True) / "summary.json").read_text()
    # a writer killed before it finished leaves no complete dataset: simulated anew, not refused
    (first / "_COMPLETE").unlink()
    assert prepare_data(small, tmp_path) == first and '"rows": 600' in (first / "summary.json").read_text()


def test_a_schema_task_weight_must_be_finite(tmp_path: Path) -> None:
    from opengem.data.schema import FeatureSchema, SchemaError

    text = (ROOT / "configs" / "schemas" / "tiny.toml").read_text()
    assert 'name = "click"' in text
    bad = tmp_path / "schema.toml"
    bad.write_text(text.replace("weight = 0.5", "weight = nan", 1))
    with pytest.raises(SchemaError, match=r"weight: must be a finite number >= 0, got nan"):
        FeatureSchema.load(bad)


def test_a_folder_that_is_not_data_is_named_as_what_it_is(tmp_path: Path) -> None:
    from opengem.data.dataset import Dataset
    from opengem.errors import DatasetError

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text("[model]\nname = 'gem'\n")
    with pytest.raises(DatasetError, match="a training run folder .config.toml., not a dataset"):
        Dataset(run)
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "a.txt").write_text("x")
    with pytest.raises(DatasetError, match=r"files: not a dataset \(no schema.toml\)"):
        Dataset(tmp_path / "files")


@pytest.mark.parametrize("override, why", [
    ("bootstrap=0", "bootstrap: resamples for the confidence intervals, >= 1"),  # IndexError after training
    ("kd.grid=[[1.0,0.0]]", "kd.grid: weights >= 0 and temperatures > 0"),  # internal error in the KD loss
    ("vm.schema.max_len=0", "sharing.sequence_encoder: the param_sharing arm"),  # failed after earlier arms
    ("vm.schema.max_len=-2", "vm.schema.max_len: >= 0"),
    ("fm.train.lr=nan", "fm.train.lr = nan: must be a finite number"),  # was named train.lr (the VM's key)
])
def test_a_transfer_recipe_that_cannot_run_is_refused_by_key(override: str, why: str) -> None:
    from opengem.config import ConfigError
    from opengem.transfer.experiment_config import load_experiment_config

    with pytest.raises(ConfigError, match=re.escape(why)):
        load_experiment_config(ROOT / "configs" / "transfer-tiny.toml", [override])


@pytest.mark.parametrize("override, why", [
    ("distill.sharing_lr_scale=nan", "distill.sharing_lr_scale = nan: must be a finite number"),
    ("distill.kd.temperature=inf", "distill.kd.temperature = inf: must be a finite number"),
    ("distill.kd.weight=nan", "distill.kd.weight = nan: must be a finite number"),  # blamed distill.aux_head
    ("vm.schema.max_len=-3", "vm.schema.max_len: >= 0"),  # trained a VM without history, recorded -3
    ("distill.student_adapter.steps=-1", "distill.student_adapter: steps >= 1 and lr > 0 when enabled"),
])
def test_a_distill_recipe_that_cannot_run_is_refused_by_key(override: str, why: str) -> None:
    from opengem.config import ConfigError
    from opengem.transfer.distill_config import load_distill_config

    with pytest.raises(ConfigError, match=re.escape(why)):
        load_distill_config(ROOT / "configs" / "distill-example.toml", [override])


def test_validate_names_every_missing_or_mistyped_column_of_a_file(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from opengem.data.dataset import Dataset
    from opengem.data.validate import validate_files

    data = prepare_data(DataConfig(sim={"rows": 300, "days": 2, "users": 50, "ads": 20, "topics": 10}),
                        tmp_path)
    ds = Dataset(data)
    f = ds.files("@all")[0]
    t = pq.read_table(f)
    t = t.set_column(t.schema.get_field_index("user_id"), "user_id", t.column("user_id").cast(pa.string()))
    t = t.drop(["ad_id"])
    pq.write_table(t, f)
    log, _ = validate_files([f], ds.schema)
    text = log.report()
    assert log.total == 2 and "column user_id: wrong type" in text and "column ad_id: missing" in text, text


def test_a_run_in_use_is_told_apart_without_touching_its_lock(tmp_path: Path) -> None:
    from opengem.train.run_dir import LOCK_FILE, RunLock, run_in_use

    run = tmp_path / "run"
    assert run_in_use(run) is None and not run.exists()
    run.mkdir()
    with RunLock(run):
        holder = run_in_use(run)
        assert holder is not None and "pid" in holder
        before = (run / LOCK_FILE).read_text()
    assert run_in_use(run) is None and (run / LOCK_FILE).read_text() == before


def test_a_failed_run_logs_why_and_the_report_says_so(tmp_path: Path, capsys) -> None:  # type: ignore
    """A run that failed said only 'training did not finish?' in its report."""
    from opengem.bench.report import build_report

    run = tmp_path / "r"
    rc, err = run_cli(capsys, ["train", "--config", str(ROOT / "configs" / "tiny.toml"), "--out", str(run),
                               "train.steps=3", "train.lr=1e6", "train.progress=false"])
    assert rc == 1 and "loss is nan" in one_error_line(err, "train")
    assert '"kind": "error"' in (run / "metrics.jsonl").read_text().splitlines()[-1]
    page = build_report([run])
    assert "training stopped with an error at step" in page and "did not finish" not in page


@pytest.mark.parametrize("override, why", [
    ("train.sparse_eps=nan", "train.sparse_eps = nan: must be a finite number"),  # internal error
    ("train.sparse_eps=-1", "train.sparse_eps: must be > 0"),
    ("train.dist_timeout_s=inf", "train.dist_timeout_s = inf: must be a finite number"),  # OverflowError
    ("train.dist_timeout_s=1e300", "train.dist_timeout_s: must be <= 1e9 seconds"),
    ("train.early_stop.min_delta=nan", "train.early_stop.min_delta = nan"),  # accepted: nothing improved
    ("train.weight_decay=inf", "train.weight_decay = inf"),  # 'loss is nan (lower train.lr)'
])
def test_a_training_float_that_cannot_work_is_refused_by_key(override: str, why: str) -> None:
    from opengem.config import ConfigError
    from opengem.train.config import load_run_config

    with pytest.raises(ConfigError, match=re.escape(why)):
        load_run_config(ROOT / "configs" / "tiny.toml", [override]).validate()


def test_compile_may_be_switched_on_a_resume() -> None:
    """train.compile is resumable, but it sets model.embedding.pad_to_max_len, which the resume check
    counted as a change the user never made."""
    from opengem.train.config import load_run_config
    from opengem.train.run_dir import config_changes

    old = load_run_config(ROOT / "configs" / "tiny.toml", [])
    new = load_run_config(ROOT / "configs" / "tiny.toml", ["train.compile=true",
                                                           "model.embedding.pad_to_max_len=true"])
    assert config_changes(old, new) == {}
