"""``opengem simulate``: the built-in ads-platform simulator, the embedded default dataset.

It exists so every command runs on a fresh machine with no data, and because it knows the true
probability of every label it can report the oracle NE, the floor no model can beat. The world model
lives in ``sim_core.py``; the knobs and the schema in ``sim_config.py``; this module streams chunks to
canonical Parquet (one folder per day), truth files and ``summary.json``. The dataset is built in a
temporary sibling folder and renamed into place with its completion markers (``commit.staged_dir``): an
interrupted run leaves no half-written day that a reader could take for a finished one.

Python API::

    cfg = SimConfig(rows=100_000, seed=1)
    summary = simulate(cfg, "/tmp/sim")            # writes the dataset, returns summary.json's dict
    for sb in iter_batches(cfg): sb.data, sb.truth # pyarrow RecordBatches, never the whole dataset
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from opengem.data.commit import check_target, staged_dir
from opengem.data.dataset import TRUTH_DIR, arrow_schema
from opengem.data.oracle import NEAccumulator, format_table
from opengem.data.schema import FeatureSchema
from opengem.data.sim_config import SimConfig, SimConfigError, sim_schema
from opengem.data.sim_core import Chunk, World, chunk_plan, generate_chunk

__all__ = ["SimConfig", "SimBatch", "sim_schema", "truth_schema", "iter_batches", "iter_record_batches",
           "simulate", "add_arguments", "run"]


def truth_schema(schema: FeatureSchema) -> pa.Schema:
    return pa.schema([pa.field(schema.example_id_column, pa.int64(), nullable=False)]
                     + [pa.field(f"p_{t.name}", pa.float64(), nullable=False) for t in schema.tasks])


@dataclass
class SimBatch:
    """One chunk of simulated rows: the model-visible data and the true probabilities, same row order."""

    day: int
    data: pa.RecordBatch
    truth: pa.RecordBatch
    chunk: Chunk


def _to_record_batch(chunk: Chunk, aschema: pa.Schema) -> pa.RecordBatch:
    arrays = []
    for f in aschema:
        name = f.name
        if name == "click":
            arrays.append(pa.array(chunk.click.astype(np.float32)))
        elif name == "conversion":
            arrays.append(pa.array(chunk.conversion.astype(np.float32), mask=~chunk.conv_observed))
        elif pa.types.is_list(f.type):
            off = chunk.offsets[name]
            if off[-1] < 0 or len(chunk.columns[name]) >= 2**31:
                raise SimConfigError(f"chunk_rows: a chunk of {len(chunk.click)} rows is too large for list "
                                     f"column {name}: lower chunk_rows")
            arrays.append(pa.ListArray.from_arrays(pa.array(off, pa.int32()),
                                                   pa.array(chunk.columns[name], f.type.value_type)))
        else:
            arrays.append(pa.array(chunk.columns[name], f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=aschema)


def iter_batches(cfg: SimConfig) -> Iterator[SimBatch]:
    """Stream the dataset chunk by chunk (time order); memory is one chunk whatever ``cfg.rows``."""
    world = World(cfg)
    schema = sim_schema(cfg)
    aschema, tschema = arrow_schema(schema), truth_schema(schema)
    for i, (day, r0, r1) in enumerate(chunk_plan(cfg)):
        ch = generate_chunk(world, day, r0, r1, i)
        data = _to_record_batch(ch, aschema)
        truth = pa.RecordBatch.from_arrays(
            [pa.array(ch.columns["example_id"]), pa.array(ch.p_click), pa.array(ch.p_conversion)],
            schema=tschema)
        yield SimBatch(day=day, data=data, truth=truth, chunk=ch)


def iter_record_batches(cfg: SimConfig) -> Iterator[pa.RecordBatch]:
    """Only the model-visible RecordBatches (schema ``arrow_schema(sim_schema(cfg))``)."""
    for sb in iter_batches(cfg):
        yield sb.data


def _day_dir(day: int) -> str:
    return f"day={day:03d}"


def simulate(cfg: SimConfig, out_dir: str | Path, force: bool = False,
             progress: bool = False) -> dict[str, Any]:
    """Write the dataset to ``out_dir`` and return the summary (also written as summary.json).

    ``out_dir`` must be missing or empty unless ``force``, which replaces a dataset there (only once the
    new one is complete); a folder holding anything else is never replaced.
    """
    cfg.validate()
    check_target(out_dir, force)  # before any work: a refusal should be instant
    with staged_dir(out_dir, writer="opengem simulate", force=force) as st:
        summary = _write(cfg, st.path, progress)
        st.record["seed"] = cfg.seed
    return summary


def _write(cfg: SimConfig, out: Path, progress: bool) -> dict[str, Any]:
    """Write every file of the dataset into ``out`` (a staging folder) and return the summary."""
    schema = sim_schema(cfg)
    schema.save(out / "schema.toml")
    aschema, tschema = arrow_schema(schema), truth_schema(schema)
    acc = NEAccumulator()
    rows_day: dict[str, int] = {}
    rows_surface = np.zeros(cfg.surfaces, dtype=np.int64)
    seq_events = 0
    t0 = time.perf_counter()
    writer = twriter = None
    cur_day = -1
    plan_len = len(chunk_plan(cfg))
    try:
        for i, sb in enumerate(iter_batches(cfg)):
            if sb.day != cur_day:
                if writer is not None:
                    writer.close()
                    twriter.close()
                cur_day = sb.day
                (out / _day_dir(cur_day)).mkdir()
                (out / TRUTH_DIR / _day_dir(cur_day)).mkdir(parents=True)
                kw = dict(compression=cfg.compression, write_statistics=False)
                writer = pq.ParquetWriter(out / _day_dir(cur_day) / "part-00000.parquet", aschema, **kw)
                twriter = pq.ParquetWriter(out / TRUTH_DIR / _day_dir(cur_day) / "part-00000.parquet",
                                           tschema, **kw)
            writer.write_batch(sb.data)
            twriter.write_batch(sb.truth)
            ch = sb.chunk
            surf = ch.columns["surface"]
            rows_day[_day_dir(cur_day)] = rows_day.get(_day_dir(cur_day), 0) + len(surf)
            rows_surface += np.bincount(surf, minlength=cfg.surfaces)
            seq_events += len(ch.columns["hist__item"])
            for s, name in enumerate(cfg.surface_names):
                m = surf == s
                acc.update(f"{name}/click", ch.p_click[m], ch.click[m])
                acc.update(f"{name}/conversion", ch.p_conversion[m], ch.conversion[m], ch.conv_observed[m])
            if progress:
                el = time.perf_counter() - t0
                print(f"\rsimulate: chunk {i + 1}/{plan_len}  {sum(rows_day.values()):,} rows  "
                      f"{el:.0f}s", end="", flush=True)
    finally:
        if writer is not None:
            writer.close()
            twriter.close()
    if progress:
        print()
    elapsed = time.perf_counter() - t0
    click_all = sum(acc.rate(f"{s}/click") * acc.count(f"{s}/click") for s in cfg.surface_names) / cfg.rows
    summary = {
        "config": cfg.to_dict(),
        "rows": cfg.rows,
        "rows_per_day": rows_day,
        "rows_per_surface": dict(zip(cfg.surface_names, rows_surface.tolist())),
        "mean_seq_len": seq_events / cfg.rows,
        "click_rate": click_all,
        "label_rates": {r["key"]: r["rate"] for r in acc.table()},
        "mean_p": {r["key"]: r["mean_p"] for r in acc.table()},
        "observed_rows": {r["key"]: r["rows"] for r in acc.table()},
        "oracle_ne": acc.results(),
        "oracle_table": acc.table(),
        "base_rate_ne": 1.0,
        "ne_base_rate": "empirical positive rate of each surface x task over its observed labels",
        "seconds": round(elapsed, 2),
        "rows_per_s": round(cfg.rows / elapsed, 1),
    }
    summary = _json_safe(summary)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n")
    return summary


def _json_safe(x: Any) -> Any:
    """NaN (NE of a surface x task with no positive yet) becomes null: summary.json stays strict JSON."""
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_json_safe(v) for v in x]
    if isinstance(x, float) and x != x:
        return None
    return x


# --------------------------------------------------------------------------- CLI
_FLAGS = {  # flag -> SimConfig field (help comes from the field name and default)
    "rows": "rows", "seed": "seed", "days": "days", "surfaces": "surfaces", "users": "users", "ads": "ads",
    "advertisers": "advertisers", "topics": "topics", "seq-mean": "seq_mean", "seq-max": "seq_max",
    "recent-k": "recent_k", "latent-dim": "latent_dim", "emb-dim": "emb_dim", "chunk-rows": "chunk_rows",
    "conv-window-hours": "conv_window_hours", "drift-rad-per-day": "drift_rad_per_day",
    "click-scale": "click_scale", "zipf-users": "zipf_users", "zipf-ads": "zipf_ads",
    "gap-mean-s": "gap_mean_s", "compression": "compression", "start-ts": "start_ts",
    "ad-lifetime-days": "ad_lifetime_days", "new-advertiser-frac": "new_advertiser_frac",
    "interest-period-days": "interest_period_days", "hour-rate-amp": "hour_rate_amp",
    "weekly-rate-amp": "weekly_rate_amp", "traffic-cycle-amp": "traffic_cycle_amp",
    "surface-signal-contrast": "surface_signal_contrast",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="output dataset folder")
    defaults = SimConfig()
    for flag, field in _FLAGS.items():
        default = getattr(defaults, field)
        parser.add_argument(f"--{flag}", dest=field, type=type(default), default=default,
                            help=f"(default {default})")
    parser.add_argument("--force", action="store_true", help="replace a dataset already in --out")
    parser.add_argument("--quiet", action="store_true", help="no progress line")


def run(args: argparse.Namespace) -> int:
    cfg = SimConfig(**{f: getattr(args, f) for f in _FLAGS.values()})
    # the progress line rewrites itself with \r: only on a terminal (a log got every chunk's, run together)
    summary = simulate(cfg, args.out, force=args.force, progress=not args.quiet and sys.stdout.isatty())
    print(f"wrote {cfg.rows:,} rows over {cfg.days} days to {args.out} in {summary['seconds']:.1f}s "
          f"({summary['rows_per_s']:,.0f} rows/s, mean history {summary['mean_seq_len']:.1f} events)")
    title = "oracle NE (true probabilities as predictions; base rate = observed rate of that surface x task)"
    print(format_table(summary["oracle_table"], title))
    return 0
