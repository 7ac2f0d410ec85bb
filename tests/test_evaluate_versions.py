"""``RUN@N``: evaluate and predict one published version of an online run; calibrate refuses it.

An online run keeps no ``checkpoints/``, only ``versions/vNNNN`` (checkpoints with a manifest): comparing the
versions it published is how one watches a continuously training model, so evaluate and predict open a
version by name, and write beside the run (the version folder is never written after it is published).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from cli_helpers import one_error_line, run_cli
from opengem.data.dataset import Dataset
from opengem.serve.export import load_run
from opengem.train.config import load_run_config
from opengem.train.data import make_loader, prepare_data
from opengem.train.evaluate import evaluate_run
from opengem.train.online import train_online
from opengem.train.predict import predict_run
from opengem.train.published import split_version

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.toml"
SMALL = ["train.progress=false", "train.threads=1", "train.warmup_steps=2", "data.sim.rows=900",
         "data.batch_size=64", "train.final_eval=false"]
ONLINE = ["train.online_poll_s=0.05", "train.online_max_idle_s=0"]


@pytest.fixture(scope="module")
def online_run(tmp_path_factory) -> Path:
    data = prepare_data(load_run_config(TINY, SMALL).data, tmp_path_factory.mktemp("vdata"))
    run = tmp_path_factory.mktemp("vonline") / "run"
    train_online(load_run_config(TINY, [*SMALL, *ONLINE]), run, data)
    assert len(list((run / "versions").glob("v0*"))) >= 2
    return run


def test_split_version_reads_the_suffix_only_where_no_folder_has_the_whole_name(tmp_path: Path) -> None:
    assert split_version(tmp_path / "run@3") == (tmp_path / "run", 3)
    assert split_version(f"{tmp_path}/run@v0012") == (tmp_path / "run", 12)
    assert split_version(tmp_path / "run") == (tmp_path / "run", None)
    assert split_version(tmp_path / "run@best") == (tmp_path / "run@best", None)
    (tmp_path / "odd@2").mkdir()  # a run folder whose own name ends like a version
    assert split_version(tmp_path / "odd@2") == (tmp_path / "odd@2", None)


def test_evaluate_a_published_version_writes_beside_the_run(online_run: Path) -> None:
    before = sorted(p.name for p in (online_run / "versions" / "v0001").iterdir())
    first = evaluate_run(f"{online_run}@1")
    last = evaluate_run(f"{online_run}@v0002")
    assert first["version"] == 1 and first["checkpoint"] == str(online_run / "versions" / "v0001")
    assert first["checkpoint_kind"] == "published version 1"
    assert first["written"] == [str(online_run / n) for n in ("eval-v0001-valid.json", "eval-v0001.json")]
    assert (online_run / "eval-v0002.json").exists() and not (online_run / "eval.json").exists()
    assert sorted(p.name for p in (online_run / "versions" / "v0001").iterdir()) == before
    assert first["step"] < last["step"] and first["rows"] == last["rows"]
    assert first["loss"] != last["loss"]  # two versions, two models


def test_predict_a_published_version_scores_with_its_weights(online_run: Path, tmp_path: Path) -> None:
    """The probabilities written are the version's model's: the same as the exporter's load of RUN@2."""
    out = tmp_path / "p.parquet"
    res = predict_run(f"{online_run}@2", out)
    assert res["version"] == 2 and res["checkpoint"] == str(online_run / "versions" / "v0002")
    cfg = load_run_config(online_run / "config.toml")
    ds = Dataset(cfg.data.path)
    batch = next(iter(make_loader(ds, cfg.data.eval, cfg.data, train=False)))
    with torch.no_grad():
        want = torch.sigmoid(load_run(f"{online_run}@2").model(batch).logits)
    got = pq.read_table(out).slice(0, batch.batch_size)
    for j, task in enumerate(ds.schema.task_names):
        assert torch.allclose(torch.tensor(got.column(task).to_numpy()), want[:, j], atol=1e-6)


def test_a_version_that_is_not_published_and_calibrate_of_a_version_say_so(online_run: Path, capsys) -> None:  # type: ignore
    rc, err = run_cli(capsys, ["evaluate", f"{online_run}@9"])
    line = one_error_line(err, "evaluate")
    assert rc == 1 and "no published version 9" in line and "(published: 1, 2" in line, line
    rc, err = run_cli(capsys, ["evaluate", str(online_run)])
    line = one_error_line(err, "evaluate")
    assert rc == 1 and f"name one, e.g. {online_run}@" in line and "(the newest)" in line, line
    rc, err = run_cli(capsys, ["calibrate", f"{online_run}@1"])
    line = one_error_line(err, "calibrate")
    assert rc == 2 and "opengem calibrate fits a run's own checkpoint" in line, line
    assert not (online_run / "calibration.json").exists()


def test_data_of_another_schema_is_named_not_blamed_on_checkpoint(online_run: Path, tmp_path: Path) -> None:
    """It failed loading the checkpoint with 'saved by a different model' (after distill, evaluating the VM
    on the FM's data is the natural slip)."""
    from opengem.data.sim_config import SimConfig
    from opengem.data.simulate import simulate
    from opengem.errors import UsageError

    other = tmp_path / "other"
    simulate(SimConfig.from_dict({"rows": 300, "days": 2, "surfaces": 3, "users": 50, "ads": 30,
                                  "advertisers": 5, "topics": 5}), other)
    with pytest.raises(UsageError, match=r"--data .*other has schema 'sim', but .*run was trained on schema "
                                         r".*; they differ in surfaces"):
        evaluate_run(f"{online_run}@1", data_dir=other, write=False)
