"""Continuous (online) training: time-ordered partitions, one pass, progressive validation, versions.

For each new partition (a *window*: ``day=003``, ``hour=0017``, ... in name order) the model is first
evaluated on the window it has never seen (progressive validation: the metrics a served model would have
had), then trained on it once, then published as ``RUN/versions/vNNNN`` (a DCP checkpoint of model and
optimizers) with ``manifest.json``: version, window, ``trained_through_ts`` (max ts of every row this
version and the ones before it trained on), ``window_max_ts``, ``late``, step, rows and time of publishing.
Knowledge generation picks, for an example at time ts, the newest version with ``trained_through_ts < ts``
(``version_for_ts``), so an FM version never saw the example.

New partitions are picked up while the trainer polls the data folder (``train.online_poll_s``), in name
order among those that are ready (:class:`PartitionWatch`), so one that is not ready never holds back the
others:

- **ready**: the partition's writer committed it (its own ``_COMPLETE`` marker, or the dataset marker
  lists it: see ``data/commit.py``) and every file passes the footer checks; or, for a writer that writes
  no marker, every file passes them and nothing in the folder has changed for ``settle_s`` seconds (a
  file still being copied in is left alone until it is quiet).
- **quarantined**: committed but unreadable, or quiet for ``settle_s`` and still unreadable (no Parquet
  footer: a half-written file; wrong columns; no rows), or progressive validation could not read it. It
  is skipped with the reason logged (metrics.jsonl ``online_quarantine``, stderr, ``online_summary.json``
  ``quarantined``) and not looked at again until something in its folder changes.
- **late**: a partition that sorts before the newest one trained (it arrived out of order) is trained in
  the next window like any other, logged with ``"late": true``; a version's ``trained_through_ts`` is
  the newest ts of every row trained so far, so ``version_for_ts`` stays right.

Partitions still not ready when the run stops are logged as ``online_pending`` (and on stderr), with
why, and listed in the summary: nothing is skipped silently. The run stops on a ``STOP`` file in the run
folder, SIGTERM/SIGINT, after ``train.online_until``'s window (later partitions are left alone), or after
``train.online_max_idle_s`` without a partition to train (the command exits 143 / 130 after SIGTERM /
SIGINT, 0 otherwise). A restart with the same run folder resumes after the newest published version and
trains every partition no version has trained; with a config that changes what is computed (learning rate,
batch, model, data) it is refused, naming the change, before anything in the run folder is touched.
"""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from opengem.config import save_config
from opengem.data.commit import MARKER, atomic_write_text
from opengem.data.dataset import Dataset
from opengem.data.loader import ParquetLoader
from opengem.data.parquet import DataError, inspect_file
from opengem.errors import DatasetError, TrainError
from opengem.train import checkpoint as ckpt
from opengem.train.config import RunConfig
from opengem.train.data import prepare_data
from opengem.train.published import VERSIONS, version_dir
from opengem.train.run_dir import CONFIG_FILE, ResumeConfigError, saved_config_changes, shown_changes
from opengem.train.run_log import RunLog, short_metrics
from opengem.train.startup import StartupTimer
from opengem.train.trainer import Trainer

MANIFEST = "manifest.json"
STOP_FILE = "STOP"


def list_versions(run_dir: str | Path) -> list[dict[str, Any]]:
    """Manifests of the published versions (published = its manifest exists), oldest first."""
    root = Path(run_dir) / VERSIONS
    out = []
    for d in sorted(root.glob("v[0-9]*")) if root.is_dir() else []:
        if not re.fullmatch(r"v\d+", d.name):  # e.g. a version folder moved aside
            continue
        m = d / MANIFEST
        if m.exists():
            out.append({**json.loads(m.read_text()), "path": str(d)})
    return out


def version_for_ts(run_dir: str | Path, ts: int) -> dict[str, Any] | None:
    """The newest published version trained only on rows older than ``ts`` (None: no such version)."""
    ok = [v for v in list_versions(run_dir)
          if v["trained_through_ts"] is not None and v["trained_through_ts"] < ts]
    return ok[-1] if ok else None


SETTLE_S = 10.0  # a partition without a marker is taken (or quarantined) once quiet this long
READY, PENDING, BAD = "ready", "pending", "bad"


def folder_signature(folder: Path) -> tuple[tuple[str, int, int], ...]:
    """(name, size, mtime_ns) of every entry of ``folder``: changes whenever anything in it is written."""
    out = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return ()
    for e in entries:
        try:
            st = e.stat()
        except OSError:  # removed meanwhile (a writer renaming its temporary file)
            continue
        out.append((e.name, st.st_size, st.st_mtime_ns))
    return tuple(sorted(out))


class PartitionWatch:
    """Which partition of a growing dataset to train next; see the module docstring for the rules.

    ``done``: partitions already trained (a restart: the published versions' windows). ``first`` and
    ``until`` bound the partitions considered (name order, "" = no bound). ``on_quarantine(part, reason)``
    is called once per quarantine. ``clock``: wall-clock seconds, comparable with file mtimes.
    """

    def __init__(self, ds: Dataset, done: Iterable[str] = (), *, first: str = "", until: str = "",
                 settle_s: float = SETTLE_S, on_quarantine: Callable[[str, str], None] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.ds, self.first, self.until, self.settle_s, self.clock = ds, first, until, settle_s, clock
        self.done = set(done)
        self.newest = max(self.done) if self.done else None  # the newest partition trained (name order)
        self.quarantined: dict[str, dict[str, Any]] = {}  # part -> {"reason", "signature"}
        self.on_quarantine = on_quarantine

    def candidates(self) -> list[str]:
        """Partitions in bounds that are neither trained nor quarantined-and-unchanged, in name order."""
        out = []
        for part in self.ds.partitions():
            if part in self.done or (self.first and part < self.first) or (self.until and part > self.until):
                continue
            q = self.quarantined.get(part)
            if q is not None and q["signature"] == folder_signature(self.ds.root / part):
                continue  # quarantined and untouched since: never retried in a loop
            out.append(part)
        return out

    def check(self, part: str) -> tuple[str, str]:
        """(READY | PENDING | BAD, why) for one partition."""
        folder = self.ds.root / part
        sig = folder_signature(folder)
        try:
            marked = self.ds.partition_complete(part)
        except DatasetError as e:  # a marker that is not one
            return BAD, str(e)
        files = self.ds.partition_files(part)
        age = self.clock() - max((m / 1e9 for _, _, m in sig), default=self.clock())
        settled = marked or age >= self.settle_s
        if not files:
            return (BAD, f"{folder}: marked complete but holds no Parquet file") if marked \
                else (PENDING, f"{folder}: no Parquet file yet")
        for f in files:
            try:
                inspect_file(f, self.ds.schema)
            except DataError as e:
                if settled:
                    why = "" if marked else f" after {age:.0f}s without a change and no {MARKER} marker"
                    return BAD, f"{e}{why}"
                return PENDING, f"{e} (still being written? changed {age:.0f}s ago)"
        if not settled:
            return PENDING, (f"{folder}: no {MARKER} marker and changed {age:.1f}s ago: taken once unchanged "
                             f"for {self.settle_s:g}s")
        return READY, ""

    def wait_next(self, stop: StopFlag, idle_since: float, max_idle_s: float, poll_s: float
                  ) -> tuple[str | None, str]:
        """The next ready partition, polling every ``poll_s``; or None and why the wait ended: ``stop`` was
        requested (its ``reason``), or ``max_idle_s`` passed since ``idle_since`` without a new partition."""
        while True:
            part = self.next_ready()
            if part is not None:
                return part, ""
            if stop():
                return None, stop.reason
            if time.monotonic() - idle_since >= max_idle_s:
                return None, f"idle {max_idle_s:g}s without a new partition"
            time.sleep(poll_s)

    def next_ready(self) -> str | None:
        """The first ready partition in name order (quarantining the bad ones met on the way), or None."""
        for part in self.candidates():
            state, why = self.check(part)
            if state == READY:
                return part
            if state == BAD:
                self.quarantine(part, why)
        return None

    def quarantine(self, part: str, reason: str) -> None:
        self.quarantined[part] = {"reason": reason, "signature": folder_signature(self.ds.root / part)}
        if self.on_quarantine is not None:
            self.on_quarantine(part, reason)

    def is_late(self, part: str) -> bool:
        """It sorts before a partition already trained: it arrived out of order."""
        return self.newest is not None and part < self.newest

    def trained(self, part: str) -> None:
        self.done.add(part)
        self.quarantined.pop(part, None)
        self.newest = part if self.newest is None else max(self.newest, part)

    def untrained(self) -> list[dict[str, str]]:
        """Every partition in bounds that is neither trained nor quarantined, with why (at the stop)."""
        out = []
        for part in self.candidates():
            state, why = self.check(part)
            if state == BAD:
                self.quarantine(part, why)
            else:
                out.append({"window": part, "reason": why or "ready, but the run stopped before training it"})
        return out


class StopFlag:
    """Set by SIGTERM/SIGINT (main thread only), a STOP file in the run folder, or an Event (tests)."""

    def __init__(self, run_dir: Path, event: threading.Event | None = None) -> None:
        self.run_dir, self.event, self.reason = run_dir, event, ""
        self._old: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:  # noqa: ARG002
        self.reason = signal.Signals(signum).name

    def __call__(self) -> bool:
        if not self.reason and (self.run_dir / STOP_FILE).exists():
            self.reason = "STOP file"
        if not self.reason and self.event is not None and self.event.is_set():
            self.reason = "stop event"
        return bool(self.reason)

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _publish(run_dir: Path, version: int, window: str, trainer: Trainer, step: int,
             info: dict[str, Any]) -> dict[str, Any]:
    path = version_dir(run_dir, version)
    manifest = {"version": version, "window": window, **info, "step": step,
                "published_at": datetime.now(UTC).isoformat(timespec="seconds"),
                "published_unix": time.time()}
    o = trainer.optimizers
    ckpt.save(path, step, trainer.model, dense_opt=o.dense_opt, sparse_opt=o.sparse, scheduler=o.scheduler,
              extra=manifest)
    # the manifest appears last and whole: the version is published
    atomic_write_text(path / MANIFEST, json.dumps(manifest, indent=2))
    atomic_write_text(run_dir / VERSIONS / "LATEST", path.name + "\n")
    return {**manifest, "path": str(path)}


def _warn(message: str) -> None:
    print(f"opengem train: warning: {message}", file=sys.stderr, flush=True)


def _check_restart_config(run_dir: Path, cfg: RunConfig, data_path: Path) -> None:
    """A restart of a run with published versions continues them, so it must compute what they did: a
    changed setting (learning rate, batch, model, data) is refused naming it, as ``--resume`` refuses it
    (the operational ``train.online_*``, threads and logging keys may change)."""
    new = copy.deepcopy(cfg)
    new.data.path = str(data_path)  # as config.toml records it
    changes = saved_config_changes(run_dir, new)
    if changes:
        raise ResumeConfigError(f"{run_dir / CONFIG_FILE}: a restart of an online run with a changed config "
                                f"({shown_changes(changes)}); its published versions were trained with the "
                                "saved settings: restart with them, or train a new run folder")


def train_online(cfg: RunConfig, run_dir: str | Path, data_dir: str | Path | None = None, *,
                 stop_event: threading.Event | None = None, timer: StartupTimer | None = None,
                 settle_s: float = SETTLE_S) -> dict[str, Any]:
    """Consume partitions as they become ready until told to stop; returns the summary
    (RUN/online_summary.json). ``settle_s``: see :class:`PartitionWatch`."""
    timer = timer or StartupTimer()
    cfg.validate()
    t = cfg.train
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    stop = StopFlag(run_dir, stop_event)
    (run_dir / STOP_FILE).unlink(missing_ok=True)  # a STOP left by the previous run must not end this one
    try:
        if "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) != 1:
            raise TrainError("opengem train --online runs in one process (not under torchrun)")
        if t.pipeline != "none":
            _warn(f"train.pipeline = {t.pipeline!r} is not used by --online: it steps batch by batch, "
                  "reading each window's timestamps and checkpointing per window")
        data_path = prepare_data(cfg.data, run_dir, data_dir)
        # no run folder for the trainer: this loop owns RUN (config, log, versions); the CLI holds its lock
        published = list_versions(run_dir)
        if published:
            _check_restart_config(run_dir, cfg, data_path)
        with Trainer(cfg, None, data_path, timer=timer) as trainer:
            ds, schema = trainer.ds, trainer.schema
            compile_info = trainer.compile_info
            o = trainer.optimizers
            step, trained_through = 0, None
            if published:  # resume after the newest published version
                meta = ckpt.load(published[-1]["path"], trainer.model, dense_opt=o.dense_opt,
                                 sparse_opt=o.sparse, scheduler=o.scheduler)
                step = trainer.step = int(meta["step"])
                trained_through = max((v["trained_through_ts"] for v in published
                                       if v["trained_through_ts"] is not None), default=None)
            # only now: a restart that fails leaves config.toml naming the model the versions hold
            save_config(cfg, run_dir / "config.toml")
            log = RunLog(run_dir)
            version = len(published)
            quarantined: list[dict[str, Any]] = []

            def on_quarantine(part: str, reason: str) -> None:
                quarantined.append({"window": part, "reason": reason})
                log.write({"kind": "online_quarantine", "window": part, "reason": reason}, step)
                _warn(f"{part}: quarantined, skipped until its folder changes: {reason}")

            watch = PartitionWatch(ds, [v["window"] for v in published], first=t.online_first,
                                   until=t.online_until, settle_s=settle_s, on_quarantine=on_quarantine)
            windows: list[dict[str, Any]] = []
            idle_since = time.monotonic()
            reason = ""
            while not reason:
                part, reason = watch.wait_next(stop, idle_since, t.online_max_idle_s, t.online_poll_s)
                if part is None:
                    continue
                files = ds.partition_files(part)
                late = watch.is_late(part)
                if late:
                    _warn(f"{part} arrived after {watch.newest} was trained: training it now, logged as late")
                # 1. progressive validation: the model before it sees this window (it reads every row, so
                # a partition that cannot be read is quarantined here, before any training on it)
                try:
                    ev_loader = ParquetLoader(files, schema, cfg.data.eval_batch_size or cfg.data.batch_size,
                                              on_error=cfg.data.on_error or None)
                    ev = trainer.evaluate(batches=ev_loader)
                except (DataError, DatasetError) as e:
                    watch.quarantine(part, f"progressive validation could not use it: {e}")
                    continue
                log.write({"kind": "online_eval", "window": part, "version_evaluated": version, "late": late,
                           "rows": ev["rows"], **short_metrics(ev)}, step)
                # 2. one pass over the window
                loader = ParquetLoader(files, schema, cfg.data.batch_size, on_error=cfg.data.on_error or None,
                                       drop_last=t.compile, shuffle_units=cfg.data.shuffle,
                                       seed=t.seed + version)
                loss_sum, n_steps, rows, max_ts, t0 = 0.0, 0, 0, None, time.perf_counter()
                try:
                    for batch in loader:
                        try:
                            loss_sum += trainer.train_step(batch)
                        except TrainError as e:
                            raise TrainError(f"window {part}, {e}") from None
                        step = trainer.step
                        n_steps += 1
                        rows += batch.batch_size
                        bmax = int(batch.ts.max())
                        max_ts = bmax if max_ts is None else max(max_ts, bmax)
                except DataError as e:
                    raise TrainError(f"window {part}: {e}; it was readable a moment ago, so it changed while "
                                     f"training: restart to resume from version v{version:04d}") from None
                secs = time.perf_counter() - t0
                # 3. publish: trained_through_ts covers every row trained so far (a late window's are older)
                if max_ts is not None:
                    trained_through = max_ts if trained_through is None else max(trained_through, max_ts)
                version += 1
                man = _publish(run_dir, version, part, trainer, step,
                               {"trained_through_ts": trained_through, "window_max_ts": max_ts, "late": late,
                                "rows": rows, "steps": n_steps})
                rec = {"kind": "online_train", "window": part, "version": version, "late": late,
                       "steps": n_steps, "rows": rows, "loss": loss_sum / max(n_steps, 1),
                       "trained_through_ts": trained_through, "examples_per_s": rows / max(secs, 1e-9),
                       "eval": short_metrics(ev)["metrics"]}
                log.write(rec, step)
                windows.append({**rec, "eval_rows": ev["rows"], "published_at": man["published_at"]})
                watch.trained(part)
                idle_since = time.monotonic()
                if t.online_until and part >= t.online_until:
                    reason = f"reached train.online_until = {t.online_until}"
                elif stop():
                    reason = stop.reason
            pending = watch.untrained()
            for p in pending:
                log.write({"kind": "online_pending", **p}, step)
                _warn(f"{p['window']}: not trained before the stop ({reason}): {p['reason']}")
            log.close()
            summary = {"windows": windows, "versions": len(list_versions(run_dir)), "steps": step,
                       "stopped": reason, "quarantined": quarantined, "pending": pending,
                       "compile": compile_info or None, "startup": timer.summary()}
            (run_dir / "online_summary.json").write_text(json.dumps(summary, indent=2))
            return summary
    finally:
        stop.restore()
