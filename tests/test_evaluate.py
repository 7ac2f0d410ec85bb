import json
from pathlib import Path

import pytest

from opengem.train.checkpoint import CheckpointError
from opengem.train.config import load_run_config
from opengem.train.evaluate import evaluate_run, format_metrics
from opengem.train.trainer import train

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.toml"
KEYS = {"ne", "auc", "calibration", "rows", "base_rate"}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("evalrun")
    train(load_run_config(TINY, ["train.progress=false", "train.steps=8"]), out)
    return out


def test_eval_json_keys_and_checkpoint_roundtrip(run_dir):
    res = evaluate_run(run_dir)
    on_disk = json.loads((run_dir / "eval.json").read_text())
    assert on_disk["metrics"] == res["metrics"]
    assert {"metrics", "ne_base_rate", "partitions", "oracle"} <= set(on_disk)
    assert on_disk["partitions"] == ["day=002"]  # the recipe's data.eval = "@last"
    assert "base rate" in on_disk["ne_base_rate"]
    for key in ("feed/click", "stories/click", "all/click", "feed/conversion"):
        assert KEYS <= set(on_disk["metrics"][key]), key
    assert set(on_disk["oracle"]) >= {"feed/click", "stories/click"}
    assert on_disk["metrics"]["all/click"]["rows"] == on_disk["rows"]
    # the reloaded checkpoint reproduces the trainer's own final evaluation exactly
    summary = json.loads((run_dir / "train_summary.json").read_text())
    compared = 0
    for key, m in summary["final_eval"].items():
        for name in ("ne", "auc"):
            if m[name] is None:
                assert res["metrics"][key][name] is None, key
            else:
                assert res["metrics"][key][name] == pytest.approx(m[name], rel=1e-5), key
                compared += 1
    assert compared >= 4
    table = format_metrics({"gem": res}, res["oracle"])
    assert "feed/click" in table and "oracle NE" in table


def test_other_partitions(run_dir):
    res = evaluate_run(run_dir, partitions="day=000", write=False)
    assert res["partitions"] == ["day=000"]
    assert res["rows"] == 1000


def test_missing_run_and_checkpoint_are_clear(tmp_path, run_dir):
    with pytest.raises(FileNotFoundError, match="config.toml"):
        evaluate_run(tmp_path)
    (tmp_path / "config.toml").write_text((run_dir / "config.toml").read_text())
    with pytest.raises(CheckpointError, match="no checkpoint"):
        evaluate_run(tmp_path)


def test_cli(run_dir, capsys):
    from opengem.cli import main

    assert main(["evaluate", "--run", str(run_dir), "--partitions", "@last"]) == 0
    assert "feed/click" in capsys.readouterr().out


def test_cli_takes_the_run_as_a_positional_too(run_dir, tmp_path, capsys):
    """As ``opengem export RUN`` does; runs given both ways are compared side by side."""
    from opengem.cli import main

    other = tmp_path / "other"
    other.symlink_to(run_dir, target_is_directory=True)
    assert main(["evaluate", str(run_dir), "--run", str(other), "--partitions", "@last"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert f"{run_dir.name} NE" in header and "other NE" in header
    assert main(["predict", str(run_dir), "--out", str(tmp_path / "p.parquet"), "--partitions", "@last"]) == 0
    assert (tmp_path / "p.parquet").is_file()
    assert main(["evaluate"]) == 2
    assert capsys.readouterr().err.strip() == "opengem evaluate: error: give a run: RUN or --run RUN"
    assert main(["predict", str(run_dir), "--run", str(run_dir), "--out", str(tmp_path / "q.parquet")]) == 2
    assert capsys.readouterr().err.strip() == "opengem predict: error: give the run once, as RUN or --run RUN"


def test_train_cli_with_data_and_overrides(run_dir, tmp_path, capsys):
    from opengem.cli import main

    out = tmp_path / "dlrm"
    assert main(["train", "--config", str(TINY), "--data", str(run_dir / "data"), "--out", str(out),
                 "model.name=dlrm", "train.steps=3", "train.progress=false", "train.final_eval=false"]) == 0
    cfg = load_run_config(out / "config.toml")
    assert cfg.model.name == "dlrm" and cfg.train.steps == 3
    assert Path(cfg.data.path) == (run_dir / "data").resolve()
    assert not (out / "data").exists()  # --data given: nothing simulated
    assert json.loads((out / "train_summary.json").read_text())["steps"] == 3
