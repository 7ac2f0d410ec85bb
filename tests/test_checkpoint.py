"""Checkpoints: exact resume (in-process, and after SIGKILL in 1 and 2 processes), 2 -> 1 processes,
atomicity/retention, and clear errors for truncated, foreign or malicious checkpoints."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from dist_helpers import (
    TINY,
    aligned_dataset,
    assert_same_params,
    env,
    final_tensors,
    losses,
    run_train,
    train_cmd,
)
from opengem.errors import TrainError
from opengem.train import checkpoint as ckpt
from opengem.train import distributed
from opengem.train.config import load_run_config
from opengem.train.data import prepare_data
from opengem.train.trainer import train

FAST = ["train.progress=false", "train.threads=1", "train.warmup_steps=3", "train.final_eval=false",
        "train.log_every=2", "data.batch_size=64", "train.checkpoint_every=4"]



@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckptdata")
    return prepare_data(load_run_config(TINY).data, root)


def test_resume_in_process_is_exact(tmp_path, data):
    """8 steps then resume to 12 == 12 steps: same parameters (bitwise), same losses, same optimizer step."""
    full = train(load_run_config(TINY, FAST + ["train.steps=12"]), tmp_path / "full", data)
    train(load_run_config(TINY, FAST + ["train.steps=8"]), tmp_path / "part", data)
    meta = ckpt.read_meta(ckpt.latest_checkpoint(tmp_path / "part"))
    assert meta["step"] == 8 and meta["loader"]["offsets"]  # a mid-epoch loader position
    res = train(load_run_config(TINY, FAST + ["train.steps=12"]), tmp_path / "part", data, resume=True)
    assert res["resumed"]["step"] == 8 and res["steps"] == 12
    assert res["last_loss"] == full["last_loss"] and res["first_loss"] == full["first_loss"]
    assert losses(tmp_path / "part")[12] == losses(tmp_path / "full")[12]
    assert_same_params(tmp_path / "full", tmp_path / "part")


def test_a_sequence_encoder_without_ffn_resumes(tmp_path, data):
    """The demo recipe's encoder (ffn_mult = 0) has a LayerNorm it never uses: trainable, no optimizer state
    was saved for it, and the resumed optimizer expected some ("Missing key ... ln2.bias.exp_avg")."""
    no_ffn = ["model.gem.sequence.ffn_mult=0"]
    full = train(load_run_config(TINY, FAST + no_ffn + ["train.steps=8"]), tmp_path / "full", data)
    train(load_run_config(TINY, FAST + no_ffn + ["train.steps=4"]), tmp_path / "part", data)
    res = train(load_run_config(TINY, FAST + no_ffn + ["train.steps=8"]), tmp_path / "part", data,
                resume=True)
    assert res["resumed"]["step"] == 4 and res["last_loss"] == full["last_loss"]
    assert_same_params(tmp_path / "full", tmp_path / "part")


def test_every_dense_parameter_of_the_recipes_models_learns(tmp_path, data):
    """A trainable parameter that never gets a gradient gets no optimizer state, and then no run of it can
    resume (above): after one step, every trainable dense parameter of GEM as the demo recipe configures it
    has one."""
    from opengem.train.trainer import Trainer

    small = Path(__file__).resolve().parents[1] / "configs" / "small.toml"
    demo_model = [f"model.gem.{k}={v}" for k, v in _gem_keys(load_run_config(small).model.gem).items()]
    cfg = load_run_config(TINY, FAST + demo_model)
    with Trainer(cfg, None, data) as trainer:
        trainer.train_step(next(iter(trainer.train_loader())).to_device(trainer.device))
        idle = [n for n, p in trainer.model.named_parameters()  # tables: fused optimizer, no .grad
                if p.requires_grad and p.grad is None and ".ebc." not in n and ".ecs." not in n]
    assert idle == []


def _gem_keys(gem) -> dict[str, object]:
    """The demo recipe's GEM sizes that change which blocks exist (the rest keep the tiny recipe's)."""
    return {"sequence.ffn_mult": gem.sequence.ffn_mult, "cross_layers": gem.cross_layers,
            "cross_rank": gem.cross_rank}


def test_resume_at_an_epoch_boundary_goes_on_into_the_next_epoch(tmp_path, data):
    """A checkpoint taken on an epoch's last step (its loader position: the epoch's end) resumes into the
    next epoch, exactly as a run that never stopped; it used to fail with 'gave no full batch'."""
    one_epoch = ["train.steps=0", "train.epochs=1", "train.checkpoint_every=0"]
    epoch = train(load_run_config(TINY, FAST + one_epoch), tmp_path / "epoch", data)["steps"]
    full = train(load_run_config(TINY, FAST + [f"train.steps={epoch + 3}"]), tmp_path / "full", data)
    train(load_run_config(TINY, FAST + [f"train.steps={epoch}"]), tmp_path / "part", data)
    res = train(load_run_config(TINY, FAST + [f"train.steps={epoch + 3}"]), tmp_path / "part", data,
                resume=True)
    assert res["resumed"]["step"] == epoch and res["steps"] == epoch + 3
    assert res["last_loss"] == full["last_loss"]
    after = {k: v for k, v in losses(tmp_path / "full").items() if k > epoch}
    assert after and {k: v for k, v in losses(tmp_path / "part").items() if k > epoch} == after
    assert_same_params(tmp_path / "full", tmp_path / "part")


def test_a_finished_run_resumed_with_more_steps_goes_on_exactly(tmp_path, data):
    """A run that stopped mid-epoch on train.steps and is resumed with more steps: the epoch it stopped in
    goes on with its own shuffle seed (the final checkpoint recorded the next epoch, so from the next
    epoch on the losses left the uninterrupted run's), and the summary's rate counts this process's work."""
    one_epoch = ["train.steps=0", "train.epochs=1", "train.checkpoint_every=0"]
    epoch = train(load_run_config(TINY, FAST + one_epoch), tmp_path / "epoch", data)["steps"]
    total, first = 2 * epoch + 3, epoch + epoch // 2  # past the end of epoch 1 and into epoch 2
    full = train(load_run_config(TINY, FAST + [f"train.steps={total}"]), tmp_path / "full", data)
    part = train(load_run_config(TINY, FAST + [f"train.steps={first}"]), tmp_path / "part", data)
    assert part["epochs"] == 2  # epochs begun
    res = train(load_run_config(TINY, FAST + [f"train.steps={total}"]), tmp_path / "part", data, resume=True)
    assert res["steps"] == total and res["epochs"] == full["epochs"] == 3
    assert losses(tmp_path / "part") == losses(tmp_path / "full")
    assert_same_params(tmp_path / "full", tmp_path / "part")
    assert res["examples_per_s"] < 1.5 * (total - first) * res["examples"] / total / res["train_seconds"]


def test_a_failed_resume_leaves_config_toml_as_it_was(tmp_path, data):
    """--allow-config-change with a model the checkpoint does not hold fails to load it; config.toml used
    to be rewritten first, so every later command on the run failed with 'saved by a different model'."""
    train(load_run_config(TINY, FAST + ["train.steps=4"]), tmp_path / "run", data)
    saved = (tmp_path / "run" / "config.toml").read_text()
    with pytest.raises(ckpt.CheckpointError, match="saved by a different model"):
        train(load_run_config(TINY, FAST + ["train.steps=8", "model.embedding.d=8"]), tmp_path / "run", data,
              resume=True, allow_config_change=True)
    assert (tmp_path / "run" / "config.toml").read_text() == saved
    res = train(load_run_config(TINY, FAST + ["train.steps=8"]), tmp_path / "run", data, resume=True)
    assert res["resumed"]["step"] == 4 and res["steps"] == 8


def test_skip_batches_drops_the_first_batches_of_a_fresh_run_only(tmp_path, data):
    """data.skip_batches = 3 with 6 steps ends where 9 steps without it end; resumed to 8 steps it does not
    skip again (it ends where 11 do); more batches than an epoch holds is one TrainError line."""
    def offsets(run: str) -> dict:
        return ckpt.read_meta(ckpt.latest_checkpoint(tmp_path / run))["loader"]["offsets"]

    order = ["data.shuffle=false", "train.checkpoint_every=0"]
    phases = {}
    for run, steps, skip in (("skip", 6, 3), ("nine", 9, 0), ("eleven", 11, 0)):
        cfg = load_run_config(TINY, FAST + order + [f"train.steps={steps}", f"data.skip_batches={skip}"])
        res = train(cfg, tmp_path / run, data)
        phases[run] = res["startup"]["phases"]
    assert offsets("skip") == offsets("nine") != offsets("eleven")
    assert phases["skip"]["skip_batches"] > 0 and "skip_batches" not in phases["nine"]
    res = train(load_run_config(TINY, FAST + order + ["train.steps=8", "data.skip_batches=3"]),
                tmp_path / "skip", data, resume=True)
    assert offsets("skip") == offsets("eleven") and "skip_batches" not in res["startup"]["phases"]
    with pytest.raises(TrainError, match=r"skip_batches = 100000, but partitions .* only \d+ full batches"):
        train(load_run_config(TINY, FAST + ["train.steps=2", "data.skip_batches=100000"]), tmp_path / "x",
              data)


def test_skip_batches_stops_every_rank_when_one_rank_is_short(tmp_path, data, monkeypatch):
    """A rank whose shard holds fewer batches than data.skip_batches stops every rank with the same line
    (naming the short rank), not only itself while the others wait in the first step's collectives until
    dist_timeout. Simulated: this process is rank 0 with enough batches, the gathered counts say rank 1 has
    2."""
    monkeypatch.setattr(distributed, "gather_objects", lambda obj: [obj, 2])
    with pytest.raises(TrainError, match=r"skip_batches = 3, but .* give rank 1 only 2 full batches"):
        train(load_run_config(TINY, FAST + ["train.steps=2", "data.skip_batches=3"]), tmp_path / "x", data)


def test_retention_and_incomplete_ignored(tmp_path, data):
    train(load_run_config(TINY, FAST + ["train.steps=16", "train.checkpoint_every=2",
                                        "train.keep_checkpoints=2"]), tmp_path, data)
    root = tmp_path / "checkpoints"
    assert [p.name for p in ckpt.periodic_checkpoints(root)] == ["step-00000014", "step-00000016"]
    # a half-written newer checkpoint (crash while saving) is never picked
    (root / "step-00000099.tmp").mkdir()
    (root / "step-00000099.tmp" / ".metadata").write_bytes(b"partial")
    assert ckpt.latest_checkpoint(tmp_path).name in ("final", "step-00000016")
    with pytest.raises(ckpt.CheckpointError, match="incomplete"):
        ckpt.read_meta(root / "step-00000099.tmp")


@pytest.fixture(scope="module")
def saved(tmp_path_factory, data):
    out = tmp_path_factory.mktemp("saved")
    train(load_run_config(TINY, FAST + ["train.steps=2"]), out, data)
    return out


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def _load_into_tiny(path: Path, overrides: list[str] | None = None) -> None:
    from opengem.data.dataset import Dataset
    from opengem.train.distributed import process_group
    from opengem.train.parallelize import build_run_model

    cfg = load_run_config(TINY, ["train.progress=false", *(overrides or [])])
    ds = Dataset(load_run_config(path.parents[1] / "config.toml").data.path)
    with process_group(torch.device("cpu")) as pg:
        model = build_run_model(ds.schema, cfg, torch.device("cpu"), pg).model
        ckpt.load_model(model, path)


def test_truncated_checkpoint_is_clear(tmp_path, saved):
    c = _copy(saved / "checkpoints" / "final", tmp_path / "c")
    f = max(c.glob("*.distcp"), key=lambda p: p.stat().st_size)
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(ckpt.CheckpointError, match="truncated"):
        ckpt.load(c, torch.nn.Linear(1, 1))


def test_foreign_checkpoints_are_clear(tmp_path, saved):
    c = _copy(saved / "checkpoints" / "final", tmp_path / "c")
    meta = json.loads((c / "meta.json").read_text())
    (c / "meta.json").write_text(json.dumps({**meta, "format": "something-else"}))
    with pytest.raises(ckpt.CheckpointError, match="not an opengem checkpoint"):
        ckpt.read_meta(c)
    with pytest.raises(ckpt.CheckpointError, match="not an opengem checkpoint"):
        ckpt.read_meta(tmp_path)  # a folder without checkpoint files
    # a checkpoint of another model config: the fingerprint says so before any tensor is touched
    with pytest.raises(ckpt.CheckpointError, match="different model"):
        _load_into_tiny(saved / "checkpoints" / "final", ["model.embedding.d=8"])


def test_malicious_metadata_is_not_unpickled(tmp_path, saved):
    c = _copy(saved / "checkpoints" / "final", tmp_path / "c")
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    (c / ".metadata").write_bytes(pickle.dumps(Evil()))
    # refused by the digest recorded at save time, before any unpickling (test_checkpoint_security.py
    # also updates the digest, so that the restricted unpickler itself must refuse)
    with pytest.raises(ckpt.CheckpointError, match="sha256 is not the one recorded"):
        ckpt.load(c, torch.nn.Linear(1, 1))
    assert not marker.exists()


def test_split_join_roundtrip():
    state = {"state": {3: {"step": torch.tensor(2.0), "m": torch.ones(2)}}, "param_groups": [{"lr": 0.1,
             "betas": (0.9, 0.99), "params": ["a", "b"]}]}
    flat, skel = ckpt.split_tensors(state, "x")
    back = ckpt.join_tensors(json.loads(json.dumps(skel)), flat)
    assert set(flat) == {"x.state.3.step", "x.state.3.m"}
    assert back["state"][3]["m"] is flat["x.state.3.m"] and back["param_groups"][0]["betas"] == [0.9, 0.99]
    with pytest.raises(ckpt.CheckpointError, match="neither a tensor nor JSON"):
        ckpt.split_tensors({"a": object()}, "x")


# --------------------------------------------------------------------------- SIGKILL (subprocesses)
def _descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from /proc), children before their parents' parents."""
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    out, frontier = [], [pid]
    while frontier:
        kids = [c for c, p in parent.items() if p in frontier]
        out = kids + out
        frontier = kids
    return out


def _kill_after_checkpoint(cmd: list[str], run: Path, step: int, timeout: float = 300) -> None:
    proc = subprocess.Popen(cmd, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    target = run / "checkpoints" / f"step-{step:08d}" / "meta.json"
    t0 = time.time()
    try:
        while not target.exists():
            assert proc.poll() is None, "the run ended before the checkpoint appeared"
            assert time.time() - t0 < timeout
            time.sleep(0.05)
    finally:
        # torchrun starts each worker in a session of its own, so killing torchrun's process group would
        # leave the workers training on: kill every descendant, as a lost host would.
        for pid in [*_descendants(proc.pid), proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
    assert not (run / "checkpoints" / "final").exists(), "killed too late"


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
def test_sigkill_and_resume_matches_uninterrupted(tmp_path, data, nproc):
    aligned = aligned_dataset(Path(data), tmp_path / "aligned", 32)
    args = ["train.steps=60", "train.checkpoint_every=10", "train.log_every=10", "data.batch_size=32",
            "train.final_eval=true"]
    ref = run_train(nproc, tmp_path / "ref", aligned, args)
    _kill_after_checkpoint(train_cmd(nproc, tmp_path / "killed", aligned, args), tmp_path / "killed", 10)
    res = run_train(nproc, tmp_path / "killed", aligned, args, resume=True)
    assert res["resumed"] and 10 <= res["resumed"]["step"] < 60  # killed mid-way, every rank with it
    assert res["last_loss"] == ref["last_loss"]
    assert res["final_eval"] == ref["final_eval"]
    assert_same_params(tmp_path / "ref", tmp_path / "killed")


@pytest.mark.slow
def test_two_processes_checkpoint_loads_into_one(tmp_path, data):
    """2 -> 1: the 2-rank run's checkpoint resumes in one process and gives the same model (and metrics)."""
    aligned = aligned_dataset(Path(data), tmp_path / "aligned", 32)
    args = ["train.steps=10", "train.checkpoint_every=10", "data.batch_size=32"]
    two = run_train(2, tmp_path / "run", aligned, args)
    before = final_tensors(tmp_path / "run")
    one = run_train(1, tmp_path / "run", aligned, args, resume=True)  # nothing left to train: reload + save
    assert one["resumed"]["saved_world_size"] == 2 and one["world_size"] == 1
    assert any("the global batch goes from 64 to 32 rows" in w for w in one["warnings"])  # said, not silent
    after = final_tensors(tmp_path / "run")
    for k in before:
        assert torch.equal(before[k], after[k]), k
    for k, m in two["final_eval"].items():
        assert one["final_eval"][k]["auc"] == pytest.approx(m["auc"], abs=1e-6), k
    # and it keeps training in one process from there (a new batch size only when the user says so: recorded)
    more = run_train(1, tmp_path / "run", aligned, ["train.steps=14", "train.checkpoint_every=10",
                                                    "data.batch_size=64", "--allow-config-change"],
                     resume=True)
    assert more["steps"] == 14
    assert more["config_changes"] == {"data.batch_size": [32, 64]} and more["allow_config_change"]


def test_resume_falls_back_past_a_truncated_newest_checkpoint(tmp_path, data, capsys):
    """The README's promise, 'from its newest complete checkpoint': a final checkpoint whose data file is
    gone (a disk filled, a copy cut short) is passed over with a warning, and the periodic one before it
    resumes, exactly."""
    full = train(load_run_config(TINY, FAST + ["train.steps=12"]), tmp_path / "full", data)
    train(load_run_config(TINY, FAST + ["train.steps=10"]), tmp_path / "part", data)  # step 8, then final
    final = tmp_path / "part" / "checkpoints" / "final"
    next(final.glob("*.distcp")).unlink()
    res = train(load_run_config(TINY, FAST + ["train.steps=12"]), tmp_path / "part", data, resume=True)
    assert res["resumed"]["step"] == 8 and res["last_loss"] == full["last_loss"]
    assert "truncated checkpoint): resuming from the checkpoint before it" in capsys.readouterr().err
    assert_same_params(tmp_path / "full", tmp_path / "part")
