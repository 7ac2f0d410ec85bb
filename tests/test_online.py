"""Online training over the tiny simulator's days: progressive metrics per window, versions published in
order with their trained-through time, a partition that appears while the trainer polls is picked up, and
the STOP file ends the run."""

import json
import shutil
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from opengem.data.sim_config import SimConfig
from opengem.data.simulate import simulate
from opengem.train.config import load_run_config
from opengem.train.online import STOP_FILE, list_versions, train_online, version_for_ts

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.toml"


@pytest.fixture(scope="module")
def online_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("online")
    data, held = root / "data", root / "held"
    cfg = load_run_config(TINY, ["train.progress=false", "data.sim.rows=900", "train.online_poll_s=0.2",
                                 "train.online_max_idle_s=120", "train.warmup_steps=2"])
    simulate(SimConfig.from_dict(dict(cfg.data.sim)), data)
    held.mkdir()
    shutil.move(str(data / "day=002"), str(held / "day=002"))  # "tomorrow": not there yet
    run_dir = root / "run"

    def producer():
        # wait until the trainer has published the two available days and is polling, then land day=002
        # atomically (write elsewhere, rename), then ask the trainer to stop once it has published it
        deadline = time.monotonic() + 300
        while len(list_versions(run_dir)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
        shutil.move(str(held / "day=002"), str(data / "day=002"))
        while len(list_versions(run_dir)) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        (run_dir / STOP_FILE).write_text("")

    th = threading.Thread(target=producer, daemon=True)
    th.start()
    summary = train_online(cfg, run_dir, data)
    th.join(timeout=5)
    return run_dir, data, summary


def _min_max_ts(part_dir):
    ts = pq.read_table(sorted(part_dir.glob("*.parquet"))[0], columns=["ts"]).column("ts").to_pylist()
    return min(ts), max(ts)


@pytest.mark.slow
def test_windows_in_order_and_late_partition_picked_up(online_run):
    run_dir, _, summary = online_run
    assert [w["window"] for w in summary["windows"]] == ["day=000", "day=001", "day=002"]
    assert summary["stopped"] == "STOP file"


@pytest.mark.slow
def test_progressive_metrics_per_window(online_run):
    run_dir, _, _ = online_run
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in recs if r["kind"] == "online_eval"]
    assert [r["window"] for r in evals] == ["day=000", "day=001", "day=002"]
    # evaluated BEFORE training on the window: by the previous version
    assert [r["version_evaluated"] for r in evals] == [0, 1, 2]
    for r in evals:
        assert r["rows"] > 0
        keys = set(r["metrics"])
        assert {"all/click", "all/conversion"} <= keys and any(k.count("/") == 1 and not k.startswith("all")
                                                               for k in keys)
        assert all(set(v) == {"ne", "auc"} for v in r["metrics"].values())
    order = [(r["kind"], r["window"]) for r in recs if r["kind"] in ("online_eval", "online_train")]
    assert order[:2] == [("online_eval", "day=000"), ("online_train", "day=000")]


@pytest.mark.slow
def test_versions_published_with_trained_through_ts(online_run):
    run_dir, data, _ = online_run
    vs = list_versions(run_dir)
    assert [v["version"] for v in vs] == [1, 2, 3]
    assert [Path(v["path"]).name for v in vs] == ["v0001", "v0002", "v0003"]
    assert (run_dir / "versions" / "LATEST").read_text().strip() == "v0003"
    for v in vs:
        assert (Path(v["path"]) / ".metadata").exists() and v["published_at"]
        lo, hi = _min_max_ts(data / v["window"])
        assert v["trained_through_ts"] == hi  # max ts of the rows it trained on
    assert [v["published_unix"] for v in vs] == sorted(v["published_unix"] for v in vs)
    for v, nxt in zip(vs, vs[1:]):
        lo_next, _ = _min_max_ts(data / nxt["window"])
        assert v["trained_through_ts"] < lo_next  # an FM version is older than the next window's rows
        assert version_for_ts(run_dir, lo_next)["version"] == v["version"]
    assert version_for_ts(run_dir, _min_max_ts(data / "day=000")[0]) is None
