"""vm_history_windows: a VM also trains on windows before vm_first_window (a low-traffic surface's longer
recent log), never evaluated there; the FM must have a version for each of them at every lag."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from opengem.config import ConfigError
from opengem.transfer.experiment import run_experiment
from opengem.transfer.experiment_config import ExperimentConfig, load_experiment_config
from opengem.transfer.seed_run import SeedRun
from opengem.transfer.vm_train import ArmConfig
from opengem.transfer.windows import vm_start_window, vm_surfaces, vm_train_windows

PARTS = [f"day={i:03d}" for i in range(16)]


def _cfg(**kw: int) -> ExperimentConfig:
    cfg = ExperimentConfig()
    cfg.publish_every, cfg.vm_first_window, cfg.validation_windows = 1, 12, 2
    for k, v in kw.items():
        setattr(cfg, k, v)
    return cfg


@pytest.mark.parametrize("history", [0, 3, 10])
def test_the_vm_trains_from_history_windows_before_its_start(history):
    cfg = _cfg(vm_history_windows=history)
    start = vm_start_window(cfg, [1], len(PARTS))
    assert vm_train_windows(cfg, [1], PARTS, start) == PARTS[12 - history:]


def test_a_history_window_without_an_fm_version_at_every_lag_is_refused():
    cfg = _cfg(vm_history_windows=11)  # window 1: no version at lag 1 (the first is trained through window 0)
    want = r"vm_history_windows = 11: the VM would train from window 1, before window 2"
    with pytest.raises(ConfigError, match=want):
        vm_train_windows(cfg, [1], PARTS, 12)
    cfg = _cfg(vm_history_windows=4)
    with pytest.raises(ConfigError, match="lag 8"):
        vm_train_windows(cfg, [1, 8], PARTS, 12)


def test_history_windows_are_trained_on_and_never_predicted():
    seen: list[tuple[str, str]] = []

    class Student:
        steps, serving_flops, shared, ds = 0, 100, {}, None

        def predict(self, w):
            seen.append(("predict", w))
            n = 2
            return {"example_id": np.arange(n), "surface": np.zeros(n, np.int32),
                    "logits": np.zeros((n, 1)), "labels": np.zeros((n, 1)), "mask": np.ones((n, 1), bool)}

        def train_window(self, w, teacher):
            seen.append(("train", w))

    cfg = _cfg(vm_history_windows=3)
    windows = vm_train_windows(cfg, [1], PARTS, 12)
    fake = SimpleNamespace(cfg=cfg, windows_for=lambda s: windows, eval_windows=PARTS[13:],
                           student=lambda *a, **k: Student())
    SeedRun.run_arm(fake, ArmConfig("baseline"), None, None, SimpleNamespace(adapter=None), 0)
    assert [w for op, w in seen if op == "train"] == PARTS[9:15]  # 9-11 history, then 12-14
    assert [w for op, w in seen if op == "predict"] == PARTS[13:]


@pytest.mark.parametrize("bad", ["-1", "1.5"])
def test_bad_vm_history_windows_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="vm_history_windows"):
        load_experiment_config("configs/transfer-tiny.toml", [f"vm_history_windows={bad}"]).validate()


def test_surface_history_windows_set_each_surfaces_own_history():
    """One regime, per-surface history (calibration round 11: video and messaging 2, feed and stories 0)."""
    cfg = _cfg(vm_history_windows=1)
    cfg.surface_history_windows = {"video": 3, "feed": 0}
    assert vm_train_windows(cfg, [1], PARTS, 12, "video") == PARTS[9:]
    assert vm_train_windows(cfg, [1], PARTS, 12, "feed") == PARTS[12:]
    assert vm_train_windows(cfg, [1], PARTS, 12, "stories") == PARTS[11:]  # the default for the others
    cfg.surface_history_windows = {"video": 11}
    want = r"surface_history_windows.video = 11: the VM would train from window 1"
    with pytest.raises(ConfigError, match=want):
        vm_train_windows(cfg, [1], PARTS, 12, "video")


def test_each_surface_trains_on_its_own_windows_and_is_evaluated_on_the_same_ones():
    seen: dict[int, list[tuple[str, str]]] = {0: [], 1: []}

    def student(s):
        class Student:
            steps, serving_flops, shared, ds = 0, 100, {}, None

            def predict(self, w):
                seen[s].append(("predict", w))
                n = 2
                return {"example_id": np.arange(n), "surface": np.zeros(n, np.int32),
                        "logits": np.zeros((n, 1)), "labels": np.zeros((n, 1)), "mask": np.ones((n, 1), bool)}

            def train_window(self, w, teacher):
                seen[s].append(("train", w))
        return Student()

    cfg = _cfg()
    cfg.surface_history_windows = {"video": 2}
    per = {s: vm_train_windows(cfg, [1], PARTS, 12, name) for s, name in enumerate(["feed", "video"])}
    for s in (0, 1):
        fake = SimpleNamespace(cfg=cfg, windows_for=per.__getitem__, eval_windows=PARTS[13:],
                               student=lambda *a, s=s, **k: student(s))
        SeedRun.run_arm(fake, ArmConfig("baseline"), None, None, SimpleNamespace(adapter=None), s)
    assert [w for op, w in seen[0] if op == "train"] == PARTS[12:15]
    assert [w for op, w in seen[1] if op == "train"] == PARTS[10:15]
    for s in (0, 1):
        assert [w for op, w in seen[s] if op == "predict"] == PARTS[13:]


def test_a_misspelt_surface_in_surface_history_windows_is_refused():
    cfg = _cfg()
    cfg.surface_history_windows = {"vidoe": 2}
    want = r"surface_history_windows: \['vidoe'\] not in the dataset's surfaces"
    with pytest.raises(ConfigError, match=want):
        vm_surfaces(cfg, ["feed", "video"])
    cfg.surface_history_windows = {"video": 2}
    cfg.surfaces = ["feed"]  # a surface not run here may still carry its history (one regime file)
    assert vm_surfaces(cfg, ["feed", "video"]) == ["feed"]


@pytest.mark.parametrize("bad", ["-1", "1.5", "true"])
def test_bad_surface_history_windows_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="surface_history_windows"):
        over = [f"surface_history_windows.video={bad}"]
        load_experiment_config("configs/transfer-tiny.toml", over).validate()


@pytest.mark.slow
def test_a_whole_experiment_gives_each_surface_its_own_history(tmp_path):
    """Every arm (the hierarchical one too) end to end on two surfaces, one with a window of history
    (about a minute): each surface's VM trains on its own windows, recorded in transfer.json, and the
    FM/VM row ratio counts that surface's history rows."""
    over = ["data.sim.days=4", "vm_first_window=2", 'surfaces=["feed", "stories"]',
            "surface_history_windows.feed=1"]
    cfg = load_experiment_config("configs/transfer-tiny.toml", over)
    res = run_experiment(cfg, tmp_path / "run", log=lambda *a: None)
    per = res["windows"]["vm_per_surface"]
    assert per["feed"] == ["day=001", "day=002", "day=003"] and per["stories"] == ["day=002", "day=003"]
    assert res["windows"]["vm"] == per["feed"]
    for arm in cfg.arms:
        assert np.isfinite(res["arms"][arm]["feed/click"]["ne"])
        assert np.isfinite(res["arms"][arm]["stories/click"]["ne"])
    reg = res["regime"]["surfaces"]
    feed_rows = reg["feed"]["windows"][0]["vm_rows"]
    stories_rows = reg["stories"]["windows"][0]["vm_rows"]
    assert feed_rows > 0 and stories_rows > 0
    assert reg["feed"]["history_windows"] == 1 and reg["stories"]["history_windows"] == 0
    no_history = run_experiment(load_experiment_config("configs/transfer-tiny.toml", over[:3]),
                                tmp_path / "none", log=lambda *a: None)
    assert no_history["regime"]["surfaces"]["feed"]["windows"][0]["vm_rows"] < feed_rows
    assert no_history["regime"]["surfaces"]["stories"]["windows"][0]["vm_rows"] == stories_rows
