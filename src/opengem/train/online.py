"""Continuous (online) training: time-ordered partitions, one pass, progressive validation, versions.

For each new partition (a *window*: ``day=003``, ``hour=0017``, ... in name order) the model is first
evaluated on the window it has never seen (progressive validation: the metrics a served model would have
had), then trained on it once, then published as ``RUN/versions/vNNNN`` (a DCP checkpoint of model and
optimizers) with ``manifest.json``: version, window, ``trained_through_ts`` (max ts of the rows it trained
on), step, rows and time of publishing. Knowledge generation picks, for an example at time ts, the newest
version with ``trained_through_ts < ts`` (``version_for_ts``), so an FM version never saw the example.

New partitions are picked up while the trainer polls the data folder (``train.online_poll_s``); a partition
is taken when its Parquet footers are readable (writers should write to a temp name and rename). The run
stops on a ``STOP`` file in the run folder, SIGTERM/SIGINT, after ``train.online_until``'s window, or after
``train.online_max_idle_s`` without a new partition. A restart with the same run folder resumes after the
newest published version.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import torch

from opengem.data.dataset import Dataset
from opengem.train import checkpoint as ckpt
from opengem.train.config import RunConfig

VERSIONS = "versions"
MANIFEST = "manifest.json"
STOP_FILE = "STOP"


def version_dir(run_dir: str | Path, version: int) -> Path:
    return Path(run_dir) / VERSIONS / f"v{version:04d}"


def list_versions(run_dir: str | Path) -> list[dict[str, Any]]:
    """Manifests of the published versions (published = its manifest exists), oldest first."""
    root = Path(run_dir) / VERSIONS
    out = []
    for d in sorted(root.glob("v[0-9]*")) if root.is_dir() else []:
        m = d / MANIFEST
        if m.exists():
            out.append({**json.loads(m.read_text()), "path": str(d)})
    return out


def version_for_ts(run_dir: str | Path, ts: int) -> dict[str, Any] | None:
    """The newest published version trained only on rows older than ``ts`` (None: no such version)."""
    ok = [v for v in list_versions(run_dir)
          if v["trained_through_ts"] is not None and v["trained_through_ts"] < ts]
    return ok[-1] if ok else None


def partition_ready(ds: Dataset, part: str) -> bool:
    """Every Parquet file of the partition has a readable footer (a file still being written has none)."""
    files = sorted((ds.root / part).glob("*.parquet"))
    try:
        return bool(files) and all(pq.read_metadata(f) is not None for f in files)
    except Exception:  # noqa: BLE001 - any unreadable footer means "not yet"
        return False


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


def _publish(run_dir: Path, version: int, window: str, model: Any, opt: Any, fused: Any, sched: Any,
             step: int, info: dict[str, Any]) -> dict[str, Any]:
    path = version_dir(run_dir, version)
    manifest = {"version": version, "window": window, **info, "step": step,
                "published_at": datetime.now(UTC).isoformat(timespec="seconds"),
                "published_unix": time.time()}
    ckpt.save(path, step, model, dense_opt=opt, sparse_opt=fused, scheduler=sched, extra=manifest)
    tmp = path / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2))
    os.replace(tmp, path / MANIFEST)  # the manifest appears last and whole: the version is published
    latest = run_dir / VERSIONS / "LATEST"
    (run_dir / VERSIONS / "LATEST.tmp").write_text(path.name + "\n")
    os.replace(run_dir / VERSIONS / "LATEST.tmp", latest)
    return {**manifest, "path": str(path)}


def train_online(cfg: RunConfig, run_dir: str | Path, data_dir: str | Path | None = None, *,
                 stop_event: threading.Event | None = None, timer: Any | None = None) -> dict[str, Any]:
    """Consume partitions in time order until told to stop; returns the summary (RUN/online_summary.json)."""
    import torch.distributed as dist

    from opengem.config import save_config
    from opengem.data.loader import ParquetLoader
    from opengem.train.evaluate import evaluate_model
    from opengem.train.optim import build_optimizers
    from opengem.train.startup import StartupTimer
    from opengem.train.step import forward_loss, optimizer_step
    from opengem.train.trainer import (
        RunLog,
        TrainError,
        _short,
        build_run_model,
        cpu_threads,
        prepare_compile,
        prepare_data,
        process_group,
        resolve_device,
        task_weights,
    )

    timer = timer or StartupTimer()
    cfg.validate()
    t = cfg.train
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    device = resolve_device(t.device)
    stop = StopFlag(run_dir, stop_event)
    (run_dir / STOP_FILE).unlink(missing_ok=True)  # a STOP left by the previous run must not end this one
    try:
        with process_group(device, t.dist_timeout_s) as pg, cpu_threads(t.threads):
            if dist.get_world_size() != 1:
                raise TrainError("opengem train --online runs in one process (not under torchrun)")
            data_path = prepare_data(cfg.data, run_dir, data_dir)
            cfg.data.path = str(data_path)
            ds = Dataset(data_path)
            schema = ds.schema
            compile_info = prepare_compile(cfg)
            save_config(cfg, run_dir / "config.toml")
            model, _ = build_run_model(schema, cfg, device, pg, timer)
            dense_list, opt, sched, fused = build_optimizers(model, t)
            weights = task_weights(schema, device)
            log = RunLog(run_dir)

            published = list_versions(run_dir)
            step, done_windows = 0, [v["window"] for v in published]
            if published:  # resume after the newest published version
                meta = ckpt.load(published[-1]["path"], model, dense_opt=opt, sparse_opt=fused,
                                 scheduler=sched)
                step = int(meta["step"])
            version = len(published)
            last = done_windows[-1] if done_windows else None
            windows: list[dict[str, Any]] = []
            idle_since = time.monotonic()
            reason = ""
            while not reason:
                todo = [p for p in ds.partitions() if (last is None or p > last) and p != "."
                        and (not t.online_first or p >= t.online_first)]
                part = todo[0] if todo and partition_ready(ds, todo[0]) else None
                if part is None:
                    if stop():
                        reason = stop.reason
                    elif time.monotonic() - idle_since >= t.online_max_idle_s:
                        reason = f"idle {t.online_max_idle_s:g}s without a new partition"
                    else:
                        time.sleep(t.online_poll_s)
                    continue
                files = sorted((ds.root / part).glob("*.parquet"))
                # 1. progressive validation: the model before it sees this window
                ev_loader = ParquetLoader(files, schema, cfg.data.eval_batch_size or cfg.data.batch_size,
                                          on_error=cfg.data.on_error or None)
                ev = evaluate_model(model, ev_loader, schema, device)
                log.write({"kind": "online_eval", "window": part, "version_evaluated": version,
                           "rows": ev["rows"], **_short(ev)}, step)
                # 2. one pass over the window
                loader = ParquetLoader(files, schema, cfg.data.batch_size, on_error=cfg.data.on_error or None,
                                       drop_last=t.compile, shuffle_units=cfg.data.shuffle,
                                       seed=t.seed + version)
                model.train()
                loss_sum, n_steps, rows, max_ts, t0 = 0.0, 0, 0, None, time.perf_counter()
                for batch in loader:
                    batch = batch.to(device)
                    loss = forward_loss(model, batch, weights, t, device)
                    if not torch.isfinite(loss):
                        raise TrainError(f"window {part}, step {step}: loss is {loss.item()}")
                    optimizer_step(loss, opt, sched, dense_list, t.grad_clip)
                    step += 1
                    n_steps += 1
                    rows += batch.batch_size
                    loss_sum += float(loss.detach())
                    bmax = int(batch.ts.max())
                    max_ts = bmax if max_ts is None else max(max_ts, bmax)
                secs = time.perf_counter() - t0
                # 3. publish
                version += 1
                man = _publish(run_dir, version, part, model, opt, fused, sched, step,
                               {"trained_through_ts": max_ts, "rows": rows, "steps": n_steps})
                rec = {"kind": "online_train", "window": part, "version": version, "steps": n_steps,
                       "rows": rows, "loss": loss_sum / max(n_steps, 1), "trained_through_ts": max_ts,
                       "examples_per_s": rows / max(secs, 1e-9), "eval": _short(ev)["metrics"]}
                log.write(rec, step)
                windows.append({**rec, "eval_rows": ev["rows"], "published_at": man["published_at"]})
                last = part
                idle_since = time.monotonic()
                if t.online_until and part >= t.online_until:
                    reason = f"reached train.online_until = {t.online_until}"
                elif stop():
                    reason = stop.reason
            log.close()
            summary = {"windows": windows, "versions": len(list_versions(run_dir)), "steps": step,
                       "stopped": reason, "compile": compile_info or None,
                       "startup": timer.summary()}
            (run_dir / "online_summary.json").write_text(json.dumps(summary, indent=2))
            return summary
    finally:
        stop.restore()
