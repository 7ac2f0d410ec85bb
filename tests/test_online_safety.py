"""Online training on a dataset that grows badly: a half-written or unreadable partition is quarantined
(reason logged in metrics.jsonl, on stderr and in the summary) and never blocks the partitions after it;
a partition that arrives out of order is trained in the next window and logged as late; versions'
trained_through_ts covers every row trained so far, so knowledge generation never picks a version that
saw the example."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from opengem.data.commit import mark_complete, write_marker
from opengem.data.dataset import Dataset
from opengem.data.parquet import CanonicalWriter
from opengem.data.schema import FeatureSchema
from opengem.data.sim_config import SimConfig
from opengem.data.simulate import simulate
from opengem.train.config import load_run_config
from opengem.train.online import (
    BAD,
    PENDING,
    READY,
    PartitionWatch,
    list_versions,
    train_online,
    version_for_ts,
)
from opengem.train.run_dir import ResumeConfigError
from parquet_helpers import random_columns

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.toml"
SCHEMA = ROOT / "configs" / "schemas" / "tiny.toml"


# ------------------------------------------------------------------------------ PartitionWatch
def _part(root: Path, schema: FeatureSchema, name: str, first_id: int, marked: bool = True) -> Path:
    folder = root / name
    folder.mkdir()
    with CanonicalWriter(schema, folder / "part-00000.parquet", row_group_size=20) as w:
        w.write(random_columns(schema, 40, seed=first_id, first_id=first_id))
    if marked:
        write_marker(folder, "test", rows=40)
    return folder


def _truncate(path: Path, age_s: float = 0.0) -> None:
    """Cut a Parquet file in half (no footer: what a writer killed mid-file leaves), ``age_s`` old."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    if age_s:
        t = time.time() - age_s
        os.utime(path, (t, t))


@pytest.fixture()
def growing(tmp_path) -> tuple[Path, FeatureSchema]:
    """A committed dataset of day=000; later days are added by each test as a producer would."""
    schema = FeatureSchema.load(SCHEMA)
    root = tmp_path / "ds"
    root.mkdir()
    schema.save(root / "schema.toml")
    _part(root, schema, "day=000", 0, marked=False)
    mark_complete(root, "test")
    return root, schema


def test_half_written_partition_never_blocks_and_is_quarantined_once(growing):
    root, schema = growing
    _part(root, schema, "day=001", 100, marked=False)
    _truncate(root / "day=001" / "part-00000.parquet")  # just written: maybe still being written
    _part(root, schema, "day=002", 200)
    seen: list[tuple[str, str]] = []
    now = [time.time()]
    watch = PartitionWatch(Dataset(root), on_quarantine=lambda p, r: seen.append((p, r)), settle_s=10,
                           clock=lambda: now[0])
    assert watch.next_ready() == "day=000"
    watch.trained("day=000")
    assert watch.check("day=001")[0] == PENDING
    assert watch.next_ready() == "day=002"  # before: day=001 blocked every later partition, forever
    watch.trained("day=002")
    assert seen == []
    now[0] += 11  # quiet for longer than settle_s and still no footer: quarantined, with the file named
    assert watch.next_ready() is None
    assert [p for p, _ in seen] == ["day=001"]
    assert "day=001/part-00000.parquet" in seen[0][1] and "no _COMPLETE marker" in seen[0][1]
    for _ in range(3):  # not retried (nor logged again) while its folder is unchanged
        assert watch.next_ready() is None
    assert len(seen) == 1 and watch.untrained() == []
    # its writer finishes the file: re-examined, taken, and it is late (day=002 was trained already)
    (root / "day=001" / "part-00000.parquet").unlink()
    _part(root, schema, "day=001b", 100, marked=False)
    shutil.move(str(root / "day=001b" / "part-00000.parquet"), str(root / "day=001" / "part-00000.parquet"))
    write_marker(root / "day=001", "test", rows=40)
    assert watch.next_ready() == "day=001" and watch.is_late("day=001")


def test_committed_partition_that_cannot_be_read_is_quarantined_at_once(growing):
    root, schema = growing
    _part(root, schema, "day=001", 100)  # marked complete ...
    _truncate(root / "day=001" / "part-00000.parquet")  # ... then damaged
    state, why = PartitionWatch(Dataset(root)).check("day=001")
    assert state == BAD and "part-00000.parquet" in why
    (root / "day=002").mkdir()
    write_marker(root / "day=002", "test", rows=0)
    state, why = PartitionWatch(Dataset(root)).check("day=002")
    assert state == BAD and "no Parquet file" in why


def test_unmarked_partition_is_taken_once_quiet(growing):
    """A writer that writes no marker: readable footers are not enough while files may still arrive."""
    root, schema = growing
    _part(root, schema, "day=001", 100, marked=False)
    now = [time.time()]
    watch = PartitionWatch(Dataset(root), settle_s=5, clock=lambda: now[0])
    assert watch.check("day=001")[0] == PENDING
    now[0] += 6
    assert watch.check("day=001") == (READY, "")
    (root / "day=002").mkdir()  # a folder whose files have not arrived yet: pending, not bad
    assert watch.check("day=002")[0] == PENDING
    assert [p["window"] for p in watch.untrained()] == ["day=000", "day=001", "day=002"]


def test_bounds_leave_partitions_outside_alone(growing):
    root, schema = growing
    for i in (1, 2, 3):
        _part(root, schema, f"day=00{i}", 100 * i)
    watch = PartitionWatch(Dataset(root), ["day=001"], first="day=001", until="day=002")
    assert watch.candidates() == ["day=002"]
    assert not watch.is_late("day=002") and watch.is_late("day=000")


# ------------------------------------------------------------------------------ train --online
def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _ts(part: Path) -> list[int]:
    return pq.read_table(sorted(part.glob("*.parquet"))[0], columns=["ts"]).column("ts").to_pylist()


def test_online_quarantines_a_broken_day_and_trains_a_late_one(tmp_path, capsys):
    """Before: the broken day=001 blocked day=003 and the run ended with exit 0 after day=000; on the
    restart day=002, which arrived late, sorted before the newest trained day and was ignored forever."""
    cfg = load_run_config(TINY, ["train.progress=false", "data.sim.rows=400", "data.sim.days=4",
                                 "train.online_poll_s=0.05", "train.online_max_idle_s=0",
                                 "train.warmup_steps=2", "data.batch_size=64"])
    data, held, run = tmp_path / "data", tmp_path / "held", tmp_path / "run"
    simulate(SimConfig.from_dict(dict(cfg.data.sim)), data)
    _truncate(next((data / "day=001").glob("*.parquet")))  # committed, then damaged
    held.mkdir()
    shutil.move(str(data / "day=002"), str(held / "day=002"))  # not there yet

    first = train_online(cfg, run, data)
    assert [w["window"] for w in first["windows"]] == ["day=000", "day=003"]
    assert [q["window"] for q in first["quarantined"]] == ["day=001"] and first["pending"] == []
    assert "day=001/part-00000.parquet" in first["quarantined"][0]["reason"]
    quarantine = [r for r in _records(run) if r["kind"] == "online_quarantine"]
    assert [r["window"] for r in quarantine] == ["day=001"]
    assert "day=001: quarantined" in capsys.readouterr().err

    shutil.move(str(held / "day=002"), str(data / "day=002"))  # arrives after day=003 was trained
    second = train_online(cfg, run, data)
    assert [(w["window"], w["late"]) for w in second["windows"]] == [("day=002", True)]
    assert "day=002 arrived after day=003" in capsys.readouterr().err
    assert [r["late"] for r in _records(run) if r["kind"] == "online_train"] == [False, False, True]
    v = list_versions(run)
    assert [x["window"] for x in v] == ["day=000", "day=003", "day=002"]
    newest = max(_ts(data / "day=003"))
    assert v[2]["trained_through_ts"] == v[1]["trained_through_ts"] == newest  # v3 has seen day=003
    assert v[2]["window_max_ts"] == max(_ts(data / "day=002"))
    assert version_for_ts(run, newest)["version"] == 1  # never a version that trained on the row


def test_a_restart_with_a_changed_config_is_refused_and_leaves_the_run_as_it_was(tmp_path):
    """A restart continues the published versions, so a changed model or learning rate is refused naming
    it, before config.toml is touched (it was rewritten first: every version then failed to load as
    'saved by a different model', served or exported); operational keys may change."""
    base = ["train.progress=false", "data.sim.rows=300", "data.sim.days=2", "train.online_poll_s=0.05",
            "train.online_max_idle_s=0", "train.warmup_steps=2", "data.batch_size=64"]
    cfg = load_run_config(TINY, base)
    data, run = tmp_path / "data", tmp_path / "run"
    simulate(SimConfig.from_dict(dict(cfg.data.sim)), data)
    train_online(cfg, run, data)
    saved = (run / "config.toml").read_text()
    for change, key in (("model.embedding.d=8", "model.embedding.d 16 -> 8"), ("train.lr=0.1", "train.lr")):
        with pytest.raises(ResumeConfigError, match=key):
            train_online(load_run_config(TINY, [*base, change]), run, data)
        assert (run / "config.toml").read_text() == saved
    again = train_online(load_run_config(TINY, [*base, "train.online_max_idle_s=1", "train.threads=1"]), run,
                         data)
    assert again["windows"] == [] and len(list_versions(run)) == 2


@pytest.mark.parametrize("stopped,code", [("SIGTERM", 143), ("SIGINT", 130), ("idle 1s", 0),
                                          ("STOP file", 0)])
def test_online_stopped_by_a_signal_exits_as_an_offline_run_does(tmp_path, monkeypatch, capsys, stopped,
                                                                 code):
    """A supervisor tells a stop by SIGTERM (143) or SIGINT (130) from an end (idle, online_until, a STOP
    file: 0), as for an offline run; the online loop exited 0 after a signal."""
    from opengem.cli import main
    from opengem.train import online

    done = {"windows": [], "stopped": stopped, "versions": 2, "quarantined": [], "pending": []}
    monkeypatch.setattr(online, "train_online", lambda *a, **k: done)
    assert main(["train", "--config", str(TINY), "--online", "--out", str(tmp_path / "run")]) == code
    assert f"stopped: {stopped}" in capsys.readouterr().out
