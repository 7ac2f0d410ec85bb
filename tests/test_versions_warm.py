"""Warm-started FM versions (issue 15): version k continues version k-1's final checkpoint and trains only
the windows new since it. Pinned here: which rows each version trains on (and that every one is strictly
older than the windows the version labels), that the chain is one continuous training split at the
publication points, that an interrupted chain resumes exactly, the manifests' trained-through times, and
that a run folder of the other mode is refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from dist_helpers import TINY, final_tensors
from opengem.config import ConfigError
from opengem.data.dataset import Dataset
from opengem.data.sim_config import SimConfig
from opengem.data.simulate import simulate
from opengem.train.config import load_run_config
from opengem.train.distributed import INJECT_ENV
from opengem.train.trainer import train
from opengem.transfer import versions as versions_mod
from opengem.transfer.experiment_config import ExperimentConfig
from opengem.transfer.versions import VersionError, list_versions, select_versions, version_dir
from opengem.transfer.windows import published_versions, train_published_versions, version_for_window

# 5 one-day windows of 128 rows (4 batches of 32 each: no batch straddles a window boundary, so a chain
# cut at the windows reads the same batches as one run over them), published every 2 windows: v2, v4
SIM = ["data.sim.rows=640", "data.sim.days=5", "data.sim.users=100", "data.sim.ads=80"]
FAST = ["train.progress=false", "train.threads=1", "train.steps=0", "train.epochs=1", "train.warmup_steps=3",
        "train.log_every=1000", "data.batch_size=32", *SIM]
# what a continuous run and the chain may differ in by design: the output bias is initialised from the
# first version's windows only, and shuffling permutes each version's own windows (seeded by its epoch)
SAME_ORDER = ["train.init_output_bias=false", "data.shuffle=false"]
EVERY = 2


def fm_cfg(*extra: str):
    return load_run_config(TINY, [*FAST, *extra])


@pytest.fixture(scope="module")
def stream(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("warm") / "data"
    simulate(SimConfig.from_dict(dict(fm_cfg().data.sim)), out)
    return out


def window_ts(ds: Dataset, part: str) -> np.ndarray:
    return np.concatenate([pq.read_table(f, columns=["ts"]).column(0).to_numpy() for f in ds.files(part)])


def test_each_warm_version_trains_only_the_new_windows_all_older_than_its_use(stream, tmp_path):
    ds = Dataset(stream)
    parts = ds.partitions()
    vers = train_published_versions(fm_cfg(), stream, tmp_path / "fm", parts, EVERY, "warm")
    assert [v.version for v in vers] == published_versions(len(parts), EVERY) == [2, 4]
    v2, v4 = vers
    # the rows each version's own run trained on: exactly the windows since the previous version
    for v, new, init in ((v2, parts[0:2], None), (v4, parts[2:4], 2)):
        assert v.mode == "warm" and list(v.new_partitions) == new and v.init_from == init
        assert list(v.partitions) == parts[: v.version]  # what its weights have seen, through the chain
        assert load_run_config(v.path / "config.toml").data.train == ",".join(new)
        summary = json.loads((v.path / "train_summary.json").read_text())
        assert summary["examples"] == 2 * 128 and summary["epochs"] == 1
    # v4 continued v2's steps (and lr schedule): 8 + 8, not a fresh start
    assert json.loads((v4.path / "train_summary.json").read_text())["steps"] == 16
    # trained_through_ts: the newest ts of the whole chain, strictly older than the first window it labels
    for v in vers:
        assert v.trained_through_ts == max(int(window_ts(ds, p).max()) for p in parts[: v.version])
        assert v.trained_through_ts < int(window_ts(ds, parts[v.version]).min())
    tt = np.array([v.trained_through_ts for v in vers])
    for w in range(EVERY, len(parts)):
        ts = window_ts(ds, parts[w])
        idx = select_versions(tt, ts, 0)
        assert (idx >= 0).all() and (tt[idx] < ts).all()
        assert all(parts.index(p) < w for i in idx for p in vers[i].partitions)
        assert {vers[i].version for i in idx} == {version_for_window(w, EVERY, 0)}


def test_a_warm_chain_is_one_continuous_training_cut_at_the_publications(stream, tmp_path):
    """v4 of the chain v2 -> v4 == one run over windows 0-3 in order (bitwise), when both read the rows
    in the same order and start from the same output bias (SAME_ORDER)."""
    cfg = fm_cfg(*SAME_ORDER)
    parts = Dataset(stream).partitions()
    train_published_versions(cfg, stream, tmp_path / "fm", parts, EVERY, "warm")
    one = fm_cfg(*SAME_ORDER, "train.final_eval=false")
    one.data.train, one.data.eval = ",".join(parts[:4]), parts[4]
    summary = train(one, tmp_path / "continuous", stream)
    assert summary["steps"] == 16
    chain, ref = final_tensors(version_dir(tmp_path / "fm", 4)), final_tensors(tmp_path / "continuous")
    assert chain.keys() == ref.keys() and chain
    for k in ref:
        assert torch.equal(chain[k], ref[k]), k


def test_an_interrupted_warm_chain_resumes_to_the_same_versions(stream, tmp_path, monkeypatch):
    cfg = fm_cfg("train.checkpoint_every=2")
    parts = Dataset(stream).partitions()
    train_published_versions(cfg, stream, tmp_path / "ref", parts, EVERY, "warm")
    monkeypatch.setenv(INJECT_ENV, "0:12")  # v4's run dies at step 12, after its step-10 checkpoint
    with pytest.raises(RuntimeError, match="injected failure"):
        train_published_versions(cfg, stream, tmp_path / "cut", parts, EVERY, "warm")
    assert [v.version for v in list_versions(tmp_path / "cut")] == [2]  # v4 never published
    monkeypatch.delenv(INJECT_ENV)
    vers = train_published_versions(cfg, stream, tmp_path / "cut", parts, EVERY, "warm")
    assert [v.version for v in vers] == [2, 4]
    summary = json.loads((vers[1].path / "train_summary.json").read_text())
    assert summary["resumed"]["step"] == 10 and summary["steps"] == 16
    for k in (2, 4):
        a = final_tensors(version_dir(tmp_path / "ref", k))
        b = final_tensors(version_dir(tmp_path / "cut", k))
        assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a), k
        ma = json.loads((version_dir(tmp_path / "ref", k) / "manifest.json").read_text())
        mb = json.loads((version_dir(tmp_path / "cut", k) / "manifest.json").read_text())
        assert ma == mb
    # a second call reuses both published versions (nothing retrained)
    before = (vers[1].path / "train_summary.json").stat().st_mtime_ns
    train_published_versions(cfg, stream, tmp_path / "cut", parts, EVERY, "warm")
    assert (vers[1].path / "train_summary.json").stat().st_mtime_ns == before


def test_a_run_folder_of_the_other_mode_is_refused(stream, tmp_path, monkeypatch):
    def fake_train(cfg, run_dir, data_dir=None, **kw):
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        return {}

    monkeypatch.setattr(versions_mod, "train", fake_train)
    parts = Dataset(stream).partitions()
    train_published_versions(fm_cfg(), stream, tmp_path / "fm", parts, EVERY, "scratch")
    with pytest.raises(ConfigError, match=r"not trained fm_versions = 'warm'"):
        train_published_versions(fm_cfg(), stream, tmp_path / "fm", parts, EVERY, "warm")
    # and a warm version published from another predecessor is never taken as this chain's
    with pytest.raises(VersionError, match="published as a scratch version"):
        versions_mod.train_warm_versions(fm_cfg(), stream, tmp_path / "fm", parts, [2, 4])


def test_warm_versions_refuse_a_step_budget_and_unknown_modes():
    with pytest.raises(ConfigError, match="fm.train.steps = 5"):
        cfg = ExperimentConfig(fm_versions="warm")
        cfg.fm.train.steps = 5
        cfg.validate()
    with pytest.raises(ConfigError, match=r"fm_versions: warm \| scratch, got 'hot'"):
        ExperimentConfig(fm_versions="hot").validate()
    with pytest.raises(VersionError, match="must be 0"):
        versions_mod.train_warm_versions(fm_cfg("train.steps=5"), "unused", "unused", ["a", "b"], [1])


def test_versions_trained_with_another_fm_config_are_not_reused(stream, tmp_path):
    """An experiment re-run into the same folder with another FM recipe kept the old versions silently
    (and recorded the new recipe); now the version says what changed."""
    parts = Dataset(stream).partitions()
    versions_mod.train_fm_versions(fm_cfg(), stream, tmp_path / "fm", parts[:3])
    assert len(versions_mod.train_fm_versions(fm_cfg(), stream, tmp_path / "fm", parts[:3])) == 2  # reused
    with pytest.raises(VersionError, match=r"v0001: published by an FM trained with another config "
                                           r"\(train.lr 0.003 -> 0.0001\)"):
        versions_mod.train_fm_versions(fm_cfg("train.lr=1e-4"), stream, tmp_path / "fm", parts[:3])
    # how long a version trained is part of it (a resumed run may change it, a reused version may not): a
    # re-run with another fm.train.epochs reused the old versions and recorded the new length
    epochs = fm_cfg().train.epochs
    with pytest.raises(VersionError, match=rf"\(train.epochs {epochs} -> {epochs + 1}\)"):
        versions_mod.train_fm_versions(fm_cfg(f"train.epochs={epochs + 1}"), stream, tmp_path / "fm",
                                       parts[:3])


def test_an_experiment_stream_of_another_config_is_refused(tmp_path):
    from opengem.errors import UsageError
    from opengem.transfer.windows import prepare_data

    cfg = ExperimentConfig()
    cfg.data.kind, cfg.data.sim = "sim", {"rows": 300, "days": 2, "users": 40, "ads": 20, "topics": 10}
    out = prepare_data(cfg, 0, tmp_path)
    assert prepare_data(cfg, 0, tmp_path) == out  # the same stream: reused
    cfg.data.sim = {**cfg.data.sim, "rows": 400}
    with pytest.raises(UsageError, match=r"simulated with another config \(rows 300 -> 400\)"):
        prepare_data(cfg, 0, tmp_path)
