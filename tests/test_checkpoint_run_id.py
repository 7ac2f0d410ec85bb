"""Checkpoints carry the id of the run that wrote them (issue 10, section 2): finding the latest
checkpoint and retention only ever consider the run's own, so a reused folder never mixes two runs."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import pytest
import torch

from opengem.train import checkpoint as ckpt
from opengem.train.config import load_run_config
from opengem.train.data import prepare_data
from opengem.train.trainer import train
from opengem.transfer.versions import train_fm_versions, version_dir

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.toml"


def _save(run: Path, step: int | None, run_id: str | None, keep: int = 0) -> Path:
    torch.manual_seed(step or 0)
    model = torch.nn.Linear(2, 1)
    return ckpt.save(ckpt.checkpoint_dir(run, step), step or 0, model, run_id=run_id, keep=keep)


def _names(paths: list[Path]) -> list[str]:
    return [p.name for p in paths]


def test_run_id_is_recorded(tmp_path):
    path = _save(tmp_path, 3, "run-a")
    assert ckpt.read_meta(path)["run_id"] == "run-a"
    assert ckpt.read_meta(_save(tmp_path, 4, None))["run_id"] is None


def test_latest_checkpoint_ignores_other_runs(tmp_path):
    """An old run's step 40 and final in the same folder are never the new run's latest."""
    _save(tmp_path, 40, "old")
    _save(tmp_path, None, "old")  # final, step 0 here; an old final
    _save(tmp_path, 10, "new")
    _save(tmp_path, 20, "new")
    root = tmp_path / ckpt.CHECKPOINTS
    assert _names(ckpt.periodic_checkpoints(root, "new")) == ["step-00000010", "step-00000020"]
    assert _names(ckpt.periodic_checkpoints(root, "old")) == ["step-00000040"]
    assert ckpt.latest_checkpoint(tmp_path, "new").name == "step-00000020"
    assert ckpt.latest_checkpoint(tmp_path, "old").name == "step-00000040"
    # without a run id (callers not yet passing one): every complete checkpoint, as before
    assert _names(ckpt.periodic_checkpoints(root)) == ["step-00000010", "step-00000020", "step-00000040"]
    assert ckpt.latest_checkpoint(tmp_path).name == "step-00000040"
    with pytest.raises(ckpt.CheckpointError, match="no checkpoint of run other .*only of run.* new, old"):
        ckpt.latest_checkpoint(tmp_path, "other")


def test_final_of_the_run_wins_its_own_tie(tmp_path):
    _save(tmp_path, 20, "a")
    final = ckpt.save(ckpt.checkpoint_dir(tmp_path), 20, torch.nn.Linear(2, 1), run_id="a")
    assert ckpt.latest_checkpoint(tmp_path, "a") == final


def test_retention_deletes_only_the_runs_own(tmp_path):
    """keep=2 keeps this run's two newest periodic checkpoints and never touches another run's."""
    _save(tmp_path, 40, "old")
    _save(tmp_path, 50, None)  # written before run ids existed: not this run's either
    for step in (10, 20, 30):
        _save(tmp_path, step, "new", keep=2)
    root = tmp_path / ckpt.CHECKPOINTS
    assert _names(ckpt.periodic_checkpoints(root)) == ["step-00000020", "step-00000030", "step-00000040",
                                                       "step-00000050"]


def test_retention_never_deletes_an_unreadable_checkpoint(tmp_path):
    bad = _save(tmp_path, 5, "new")
    (bad / ckpt.META).write_text("{not json")
    for step in (10, 20):
        _save(tmp_path, step, "new", keep=1)
    assert bad.exists()
    assert _names(ckpt.periodic_checkpoints(tmp_path / ckpt.CHECKPOINTS, "new")) == ["step-00000020"]


def test_saved_checkpoint_records_metadata_digest(tmp_path):
    """meta.json holds the sha256 of .metadata exactly as written (what loading checks first)."""
    path = _save(tmp_path, 1, "a")
    meta = json.loads((path / ckpt.META).read_text())
    assert meta[ckpt.DIGEST] == hashlib.sha256((path / ckpt.METADATA).read_bytes()).hexdigest()
    model = torch.nn.Linear(2, 1)
    assert ckpt.load_model(model, path) == 1  # and a checkpoint we wrote loads
    torch.manual_seed(1)
    assert torch.equal(model.weight, torch.nn.Linear(2, 1).weight)


def test_interrupted_fm_version_resumes_its_own_run(tmp_path):
    """``train_fm_versions``: a version folder without its manifest (training was cut short) is resumed from
    its own checkpoint, not refused as a folder holding another run, nor retrained over it."""
    fm_cfg = load_run_config(TINY, ["train.progress=false", "train.threads=1", "data.sim.rows=600",
                                    "data.batch_size=32", "train.steps=4", "train.warmup_steps=1",
                                    "train.checkpoint_every=2"])
    data = prepare_data(fm_cfg.data, tmp_path)
    parts = ["day=000", "day=001", "day=002"]
    cut = copy.deepcopy(fm_cfg)  # version 1 as train_fm_versions configures it, stopped at step 2
    cut.data.train, cut.data.eval = parts[0], parts[1]
    cut.train.final_eval, cut.train.progress, cut.train.steps = False, False, 2
    train(cut, version_dir(tmp_path / "fm", 1), data)
    versions = train_fm_versions(fm_cfg, data, tmp_path / "fm", parts)
    assert [v.version for v in versions] == [1, 2]
    summary = json.loads((version_dir(tmp_path / "fm", 1) / "train_summary.json").read_text())
    assert summary["resumed"]["step"] == 2 and summary["steps"] == 4
    # reuse=False retrains every version; the old ones are moved aside whole and never listed as versions
    again = train_fm_versions(fm_cfg, data, tmp_path / "fm", parts, reuse=False)
    assert [(v.version, v.path.name) for v in again] == [(1, "v0001"), (2, "v0002")]
    assert len(list((tmp_path / "fm" / "versions").glob("v0001.old-*"))) == 1
    assert json.loads((version_dir(tmp_path / "fm", 1) / "train_summary.json").read_text())["resumed"] is None
