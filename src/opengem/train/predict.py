"""``opengem predict``: one row per example with the trained run's probability for every task -> Parquet.

Metrics summarise; a user comparing models on their own data, calibrating, or drawing reliability plots
needs the per-row scores. Columns: ``example_id`` (int64), ``surface`` (the surface's name), one float
column per task named after the task (the probability), and ``<task>_label`` (the observed label, null
where unobserved) so that the file alone is enough for a reliability curve (``opengem report`` reads it
as RUN/predictions.parquet). The model is rebuilt exactly as ``opengem evaluate`` does (early stopping's
best checkpoint when there is one). Batches are written as they come (bounded memory) to a temporary file
beside ``--out`` that is renamed into place at the end, so a reader never sees half a file.
"""

from __future__ import annotations

import argparse
import os
import warnings
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from opengem.errors import UsageError
from opengem.run_arg import add_run_argument, resolve_run
from opengem.train.calibration import describe_calibration
from opengem.train.data import make_loader
from opengem.train.distributed import world_size
from opengem.train.evaluate import EvalDataError, open_run

ROW_GROUP = 65_536  # rows per Parquet row group written


def predictions_schema(tasks: list[str]) -> pa.Schema:
    fields = [pa.field("example_id", pa.int64()), pa.field("surface", pa.string())]
    fields += [pa.field(t, pa.float32()) for t in tasks]
    fields += [pa.field(f"{t}_label", pa.float32()) for t in tasks]
    return pa.schema(fields)


def predict_run(run_dir: str | Path, out: str | Path, data_dir: str | Path | None = None,
                partitions: str | None = None, device: str | None = None, force: bool = False,
                spread_rows: int = 0) -> dict[str, Any]:
    """Score every row of ``partitions`` (default: the run's ``data.eval``) and write ``out``; returns
    what was written (rows, file, checkpoint). ``spread_rows`` > 0: only that many rows, whole row groups
    spread evenly over the partitions (``data.loader.spread_units``; the rows a study scores a run on)."""
    out = Path(out)
    if out.suffix != ".parquet":
        raise UsageError(f"--out {out}: the predictions file must end in .parquet")
    if out.exists() and not force:
        raise UsageError(f"--out {out}: exists (choose another file or pass --force to replace it)")
    if not out.parent.is_dir():
        raise UsageError(f"--out {out}: folder {out.parent} does not exist")
    if world_size() > 1:
        raise UsageError("opengem predict runs in one process (not under torchrun with several ranks)")
    with open_run(run_dir, data_dir, device) as r:
        spec = partitions or r.cfg.data.eval
        chosen = r.ds.select(spec)
        tasks, surfaces = r.ds.schema.task_names, list(r.ds.schema.surfaces)
        schema = predictions_schema(tasks)
        tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
        rows = 0
        try:
            with pq.ParquetWriter(tmp, schema) as writer, torch.no_grad():
                buf: list[pa.RecordBatch] = []
                buffered = 0
                r.model.eval()
                for batch in make_loader(r.ds, spec, r.cfg.data, train=False, spread_rows=spread_rows):
                    batch = batch.to(r.device)
                    probs = torch.sigmoid(r.model(batch).logits.float()).cpu()
                    buf.append(_record_batch(batch, probs, tasks, surfaces, schema))
                    buffered += batch.batch_size
                    rows += batch.batch_size
                    if buffered >= ROW_GROUP:
                        writer.write_table(pa.Table.from_batches(buf, schema))
                        buf, buffered = [], 0
                if buf:
                    writer.write_table(pa.Table.from_batches(buf, schema))
            if rows == 0:
                raise EvalDataError(f"{r.data_path}: partitions {', '.join(chosen) or spec}: "
                                    "no rows to score")
            os.replace(tmp, out)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return {"out": str(out), "rows": rows, "partitions": chosen, "checkpoint": str(r.checkpoint),
                "checkpoint_kind": r.checkpoint_kind, "step": r.step, "version": r.version,
                "calibration": r.calibration}


def _record_batch(batch: Any, probs: torch.Tensor, tasks: list[str], surfaces: list[str],
                  schema: pa.Schema) -> pa.RecordBatch:
    surface = batch.surface.cpu().numpy()
    labels = batch.labels.float().cpu().numpy()
    observed = batch.label_mask.bool().cpu().numpy()
    cols: list[pa.Array] = [pa.array(batch.example_id.cpu().numpy(), pa.int64()),
                            pa.array([surfaces[s] for s in surface], pa.string())]
    cols += [pa.array(probs[:, j].numpy(), pa.float32()) for j in range(len(tasks))]
    cols += [pa.array(labels[:, j], pa.float32(), mask=~observed[:, j]) for j in range(len(tasks))]
    return pa.RecordBatch.from_arrays(cols, schema=schema)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_run_argument(p, help="training run folder (config.toml and checkpoints/), or RUN@N: published "
                             "version N of an online run")
    p.add_argument("--data", default=None, help="dataset folder (default: the one the run trained on)")
    p.add_argument("--partitions", default=None, help="partition spec (default: the run's data.eval)")
    p.add_argument("--out", required=True, help="predictions file to write (FILE.parquet)")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.add_argument("--device", default=None, choices=["auto", "cpu", "cuda"])


def run(args: argparse.Namespace) -> int:
    warnings.filterwarnings("ignore", category=FutureWarning)  # TorchRec/DCP deprecation notices
    resolve_run(args)
    res = predict_run(args.run, args.out, args.data, args.partitions, args.device, force=args.force)
    cal_note = describe_calibration(res["calibration"])
    print(f"wrote {res['out']}: {res['rows']} rows of {', '.join(res['partitions'])} "
          f"(checkpoint {res['checkpoint']}, step {res['step']}, {res['checkpoint_kind']}{cal_note})")
    return 0
