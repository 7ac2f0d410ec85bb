"""``opengem generate``: knowledge generation, the FM forward once per example into a side table.

Output: ``OUT/<partition>.parquet`` per input partition (written to a temp name, fsynced and renamed, so
a part that exists is complete and a rerun skips it: resumable), ``OUT/generate.json`` (the settings the
parts were made with, written before the first part), ``OUT/manifest.json`` (what the last run did) and,
last, ``OUT/_COMPLETE`` listing every part (see ``opengem.data.commit``). A run removes the marker
first, so an interrupted one leaves a folder that :func:`read_side_table` refuses. A rerun into an OUT
made with other settings (another FM run or pinned version, ``--lag``, ``--embeddings``, dataset, or FM
versions that change which version a generated row would use) is refused naming the difference: its
old parts would otherwise be mixed with new ones under the new settings. Columns:

- ``example_id``, ``ts``, ``surface``;
- ``fm_version`` (int32; -1 = no version is old enough for this example), ``fm_trained_through``;
- ``fm_logit_<task>``: the FM's logit for each task **of the example's own surface** (the head of the
  surface the example was shown on; soft label = sigmoid), NaN where no version applies;
- ``fm_user`` / ``fm_ad`` / ``fm_trunk``: the chosen FM embeddings from ``ModelOutput.extras``
  (list<float32>, zeros where no version applies).

Per example the version is the newest one whose trained-through ts is strictly older than the example,
stepped back ``--lag`` versions (see ``versions.select_versions``). Batches are streamed per partition;
a batch whose rows need different versions runs each version only on the whole batch once and keeps its
rows (the count of such extra forwards is reported).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from opengem.data.commit import (
    MARKER,
    OutputExistsError,
    atomic_write_text,
    clear_marker,
    fsync_file,
    pid_alive,
    read_marker,
    write_marker,
)
from opengem.data.dataset import Dataset
from opengem.data.loader import ParquetLoader
from opengem.errors import DatasetError, UsageError
from opengem.train import checkpoint as ckpt
from opengem.train.calibration import CALIBRATION, apply_run_calibration
from opengem.train.config import load_run_config
from opengem.train.distributed import process_group
from opengem.train.env import cpu_threads, resolve_device
from opengem.train.parallelize import build_run_model
from opengem.train.published import version_files
from opengem.transfer.fm_runs import fm_versions
from opengem.transfer.versions import (
    VERSIONS,
    FMVersion,
    VersionError,
    list_versions,
    parse_fm_spec,
    select_versions,
)

EMBEDDINGS = ("user", "ad", "trunk")
SETTINGS = "generate.json"
_FLAG = {"fm": "--fm", "pinned_version": "pinned version (--fm RUN@N)", "lag": "--lag",
         "embeddings": "--embeddings", "data": "--data", "data_written_at": "dataset rewritten: written at",
         "tasks": "dataset tasks", "calibration": "the FM's calibration (opengem calibrate; sha256)"}


def _settings(run: Path, pinned: int | None, versions: list[FMVersion], ds: Dataset, lag: int,
              embeddings: tuple[str, ...]) -> dict[str, Any]:
    """Everything that decides a side table's content (not batch size, device or threads)."""
    return {
        "fm": str(run.resolve()), "pinned_version": pinned, "lag": lag, "embeddings": list(embeddings),
        "data": str(ds.root.resolve()), "data_written_at": (ds.marker or {}).get("written_at"),
        "tasks": list(ds.schema.task_names),
        # a batch-trained run's calibration is folded into its version 0 (_load_version): part of the content
        "calibration": _calibration_digest(run) if not (run / VERSIONS).is_dir() else None,
        "versions": [{"version": v.version, "trained_through_ts": v.trained_through_ts,
                      "path": str(v.path.resolve())} for v in versions],
    }


def _calibration_digest(run: Path) -> str | None:
    path = run / CALIBRATION
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.is_file() else None


def _remove_dead_writes(out: Path) -> None:
    """Temporary parts of a generate that was killed (kill -9 leaves them): its process is gone."""
    for tmp in out.glob(".*.parquet.tmp-*"):
        pid = tmp.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not pid_alive(int(pid)):
            tmp.unlink(missing_ok=True)


def part_files(out: Path) -> list[Path]:
    """The finished parts in ``out`` (temporary names start with a dot)."""
    return sorted(p for p in out.glob("*.parquet") if not p.name.startswith("."))


def _show(value: Any) -> str:
    if value is None:
        return "(none)"
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def settings_diff(old: dict[str, Any], new: dict[str, Any], newest_ts: int | None) -> list[str]:
    """How ``new`` settings would change the content of parts made with ``old`` ("" parts: none).

    A version published since is harmless when it is not older than every generated row (no such row
    could have used it); any other change to the versions changes which version some rows get.
    """
    diffs = [f"{_FLAG[k]} {_show(old.get(k))} -> {_show(new[k])}" for k in _FLAG if old.get(k) != new[k]]
    before = {v["version"]: v for v in old.get("versions", [])}
    after = {v["version"]: v for v in new["versions"]}
    for k, v in before.items():
        if k not in after:
            diffs.append(f"FM version {k} is no longer published")
        elif after[k] != v:
            diffs.append(f"FM version {k} changed ({v['trained_through_ts']} at {v['path']} -> "
                         f"{after[k]['trained_through_ts']} at {after[k]['path']})")
    for k, v in after.items():
        if k not in before and newest_ts is not None and v["trained_through_ts"] < newest_ts:
            diffs.append(f"FM version {k} (trained through {v['trained_through_ts']}) was published since "
                         f"and applies to rows already generated (newest ts {newest_ts})")
    return diffs


def _newest_ts(parts: list[Path]) -> int | None:
    ts = [pq.read_table(f, columns=["ts"]).column(0).to_numpy() for f in parts]
    return max((int(t.max()) for t in ts if t.size), default=None)


def check_output(out: Path, settings: dict[str, Any]) -> None:
    """Refuse to add parts to ``out`` when its existing parts were made with other settings."""
    parts = part_files(out)
    if not parts:
        return
    path = out / SETTINGS
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise OutputExistsError(f"{out}: holds side-table parts ({parts[0].name}) but no {SETTINGS} "
                                "saying how they were made: choose a new --out, or delete them to "
                                "regenerate") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise OutputExistsError(f"{path}: unreadable ({e}): choose a new --out, or delete {out} "
                                "to regenerate") from None
    diffs = settings_diff(old, settings, _newest_ts(parts))
    if diffs:
        raise OutputExistsError(f"{out}: holds parts made with other settings ({'; '.join(diffs)}): "
                                f"choose a new --out, or delete {out} to regenerate with these")


def _load_version(v: FMVersion, schema: Any, device: torch.device, pg: Any) -> torch.nn.Module:
    """Rebuild and load one version. Two layouts: ours (the version folder is a training run with
    config.toml + checkpoints/) and the online trainer's (the version folder *is* the checkpoint and the
    run's config.toml sits two levels up, RUN/config.toml)."""

    cfg_path, path = version_files(v)
    if not cfg_path.exists():
        raise FileNotFoundError(f"{v.path}: no config.toml in the version folder or its run folder")
    cfg = load_run_config(cfg_path)
    with torch.enable_grad():  # in-backward optimizers are attached through autograd, even for inference
        model = build_run_model(schema, cfg, device, pg).model
    ckpt.load_model(model, path)
    if v.version == 0 and cfg_path.parent == v.path.parent.parent:
        # a batch-trained run's own checkpoint: its calibration (opengem calibrate), fitted on that
        # checkpoint, is folded in as every reader of the run does; published versions are used as trained
        apply_run_calibration(model, cfg_path.parent, path, list(schema.surfaces), schema.task_names,
                              who="opengem generate")
    model.eval()
    return model


def _extras(out: Any, names: tuple[str, ...], key: str = "--embeddings") -> dict[str, torch.Tensor]:
    """The FM outputs ``names`` asked for (``key``: the flag or config key that asked, for the error)."""
    ex = dict(out.extras)
    ex.setdefault("trunk", out.trunk)
    if "ad" not in ex and "target" in ex:
        ex["ad"] = ex["target"]
    missing = [n for n in names if n not in ex]
    if missing:
        raise UsageError(f"{key} {','.join(names)}: the FM's outputs have no {missing} (it has "
                         f"{', '.join(sorted(ex))})")
    return {n: ex[n] for n in names}


def _side_batch(batch: Any, model_for: Any, tt: np.ndarray, vnum: np.ndarray, pinned: int | None, lag: int,
                tasks: list[str], embeddings: tuple[str, ...], dev: torch.device,
                stats: dict[str, Any]) -> pa.Table:
    """The side-table rows of one batch: each row labelled by the version it may use (see module doc)."""
    ts = batch.ts.numpy()
    vidx = select_versions(tt, ts, lag) if pinned is None else np.where(ts > tt[0], 0, -1)
    B = batch.batch_size
    logits = np.full((B, len(tasks)), np.nan, dtype=np.float32)
    embs: dict[str, np.ndarray] = {}
    batch_dev = batch.to(dev)
    for i in np.unique(vidx[vidx >= 0]):
        rows = vidx == i
        t1 = time.perf_counter()
        o = model_for(int(i))(batch_dev)
        stats["forward_s"] += time.perf_counter() - t1
        stats["forward_rows"] += B
        logits[rows] = o.logits.float().cpu().numpy()[rows]
        for name, e in _extras(o, embeddings).items():
            e = e.float().cpu().numpy()
            embs.setdefault(name, np.zeros((B, e.shape[1]), dtype=np.float32))[rows] = e[rows]
    stats["rows"] += B
    stats["no_version_rows"] += int((vidx < 0).sum())
    cols: dict[str, pa.Array] = {
        "example_id": pa.array(batch.example_id.numpy()),
        "ts": pa.array(ts),
        "surface": pa.array(batch.surface.numpy().astype(np.int32)),
        "fm_version": pa.array(np.where(vidx >= 0, vnum[np.maximum(vidx, 0)], -1).astype(np.int32)),
        "fm_trained_through": pa.array(np.where(vidx >= 0, tt[np.maximum(vidx, 0)], -1)),
    }
    for t, name in enumerate(tasks):
        cols[f"fm_logit_{name}"] = pa.array(logits[:, t])
    for name in embeddings:
        e = embs.get(name)
        if e is None:  # no row had a version: width unknown, store empty lists
            cols[f"fm_{name}"] = pa.array([[] for _ in range(B)], pa.list_(pa.float32()))
        else:
            cols[f"fm_{name}"] = pa.ListArray.from_arrays(
                pa.array(np.arange(B + 1, dtype=np.int32) * e.shape[1]), pa.array(e.reshape(-1))
            )
    return pa.table(cols)


def generate(
    fm: str | Path,
    data: str | Path,
    out: str | Path,
    *,
    lag: int = 0,
    partitions: str = "@all",
    embeddings: tuple[str, ...] = EMBEDDINGS,
    batch_size: int = 1024,
    device: str = "cpu",
    threads: int = 1,
    max_models: int = 2,
    versions: list[FMVersion] | None = None,
) -> dict[str, Any]:
    """Write the side table for ``partitions`` of ``data``; returns (and writes) the manifest.

    ``versions``: the FM versions to choose from instead of RUN/versions (``opengem distill`` passes a
    batch-trained run's own checkpoint as its one version); the no-leakage rule is the same.
    """

    warnings.filterwarnings("ignore", category=FutureWarning)
    if lag < 0 or batch_size < 1:
        raise UsageError(f"--lag must be >= 0 and --batch-size >= 1 (got {lag}, {batch_size})")
    run, pinned = parse_fm_spec(str(fm))
    if versions is None and not (run / VERSIONS).is_dir():
        # a batch-trained run (opengem train): its own checkpoint is its one version, 0, as distill reads it
        _, versions = fm_versions(str(run))
    versions = list_versions(run) if versions is None else sorted(
        versions, key=lambda v: (v.trained_through_ts, v.version))
    if pinned is not None:
        have = versions
        versions = [v for v in versions if v.version == pinned]
        if not versions:
            raise VersionError(f"--fm {fm}: no version {pinned} of {run} (have: "
                               f"{', '.join(str(v.version) for v in have)})")
    ds = Dataset(data)
    schema = ds.schema
    tasks = schema.task_names
    tt = np.array([v.trained_through_ts for v in versions], dtype=np.int64)
    vnum = np.array([v.version for v in versions], dtype=np.int64)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise OutputExistsError(f"{out}: is a file, not a folder: choose a folder path for --out")
    settings = _settings(run, pinned, versions, ds, lag, embeddings)
    check_output(out, settings)
    out.mkdir(parents=True, exist_ok=True)
    clear_marker(out)  # from here on the folder is being changed: not complete until the end
    atomic_write_text(out / SETTINGS, json.dumps(settings, indent=2) + "\n")
    dev = resolve_device(device)
    cache: OrderedDict[int, torch.nn.Module] = OrderedDict()
    stats = {"rows": 0, "forward_rows": 0, "skipped_parts": 0, "forward_s": 0.0, "no_version_rows": 0}
    t0 = time.perf_counter()
    with process_group(dev) as pg, cpu_threads(threads), torch.no_grad():

        def model_for(i: int) -> torch.nn.Module:
            if i in cache:
                cache.move_to_end(i)
                return cache[i]
            if len(cache) >= max_models:
                cache.popitem(last=False)
            cache[i] = _load_version(versions[i], schema, dev, pg)
            return cache[i]

        _remove_dead_writes(out)
        for part in ds.select(partitions):
            dest = out / f"{part}.parquet"
            if dest.exists():
                stats["skipped_parts"] += 1
                continue
            tmp = out / f".{part}.parquet.tmp-{os.getpid()}"
            writer = None
            try:
                loader = ParquetLoader(ds.files(part), schema, batch_size, drop_last=False)
                for batch in loader:
                    table = _side_batch(batch, model_for, tt, vnum, pinned, lag, tasks, embeddings, dev,
                                        stats)
                    if writer is None:
                        writer = pq.ParquetWriter(tmp, table.schema)
                    writer.write_table(table.cast(writer.schema) if table.schema != writer.schema else table)
                if writer is not None:
                    writer.close()
                    fsync_file(tmp)
                    os.replace(tmp, dest)
            except BaseException:
                if writer is not None:
                    try:
                        writer.close()
                    except Exception:  # noqa: BLE001 - the part is discarded anyway
                        pass
                tmp.unlink(missing_ok=True)
                raise
    elapsed = time.perf_counter() - t0
    manifest = {
        "fm": str(fm),
        "data": str(Path(data).resolve()),
        "lag": lag,
        "embeddings": list(embeddings),
        "soft_labels": "per task, from the head of the example's own surface (fm_logit_<task>, logits)",
        "versions": [
            {"version": v.version, "trained_through_ts": v.trained_through_ts, "path": str(v.path)}
            for v in versions
        ],
        **stats,
        "seconds": elapsed,
        "examples_per_s": stats["rows"] / max(elapsed, 1e-9),
        "forward_examples_per_s": stats["forward_rows"] / max(stats["forward_s"], 1e-9),
    }
    atomic_write_text(out / "manifest.json", json.dumps(manifest, indent=2))
    parts = {f.stem: pq.read_metadata(f).num_rows for f in part_files(out)}
    write_marker(out, "opengem generate", rows=sum(parts.values()), parts=parts)
    return manifest


def read_side_table(out: str | Path, partitions: list[str] | None = None) -> pa.Table:
    """The side table (all parts, or the named partitions) as one Arrow table.

    Only a side table whose generation finished (``_COMPLETE``) is read, and only the parts it lists.
    """
    out = Path(out)
    marker = read_marker(out)
    if marker is None:
        raise DatasetError(f"side table {out}: no {MARKER} marker, so `opengem generate` did not finish "
                           "(interrupted, or still running): re-run it with the same settings (finished "
                           "parts are kept)")
    listed = marker.get("parts", {})
    wanted = sorted(listed) if partitions is None else list(partitions)
    missing = [p for p in wanted if p not in listed]
    if missing or not wanted:
        raise DatasetError(f"side table {out}: no part for {missing or '(none written)'} (has: "
                           f"{', '.join(sorted(listed)) or 'none'}): run `opengem generate` for them")
    tables = [pq.read_table(out / f"{p}.parquet") for p in wanted]
    return pa.concat_tables(tables, promote_options="permissive")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--fm", required=True,
        help="FM run folder: with versions/ (online), or a trained run (its checkpoint is version 0); RUN@N "
             "pins one")
    p.add_argument("--data", required=True, help="dataset folder (canonical Parquet + schema.toml)")
    p.add_argument("--out", required=True, help="side-table folder (resumable: existing parts are skipped)")
    p.add_argument("--partitions", default="@all", help="partition spec (default @all)")
    p.add_argument("--lag", type=int, default=0, help="staleness: use the version this many versions older")
    p.add_argument("--embeddings", default=",".join(EMBEDDINGS), help="extras to store (user,ad,trunk)")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda"])
    p.add_argument("--threads", type=int, default=1)


def run(args: argparse.Namespace) -> int:
    m = generate(
        args.fm,
        args.data,
        args.out,
        lag=args.lag,
        partitions=args.partitions,
        embeddings=tuple(e for e in args.embeddings.split(",") if e),
        batch_size=args.batch_size,
        device=args.device,
        threads=args.threads,
    )
    print(
        f"generated {m['rows']:,} rows ({m['skipped_parts']} parts already done) in {m['seconds']:.1f}s: "
        f"{m['examples_per_s']:,.0f} examples/s end to end, {m['forward_examples_per_s']:,.0f} in the FM "
        f"forward; {m['no_version_rows']:,} rows had no FM version old enough"
    )
    return 0
