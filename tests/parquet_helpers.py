"""Test helpers for canonical Parquet: random valid rows, and one Arrow batch checked into a Batch."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from opengem.data.batch import Batch
from opengem.data.parquet import Columns, ProblemLog, check_columns, conform_table, to_batch
from opengem.data.schema import FeatureSchema


def record_batch_to_batch(rb: pa.RecordBatch | pa.Table, schema: FeatureSchema, file: str = "<memory>",
                          on_error: str | None = None, log: ProblemLog | None = None) -> Batch:
    """Check and convert one Arrow batch (rows = all of ``rb``) into a Batch."""
    table = pa.Table.from_batches([rb]) if isinstance(rb, pa.RecordBatch) else rb
    required = schema.required_columns()
    if set(required) <= set(table.column_names):
        table = table.select(required)
    table = conform_table(table, schema, file, check_nulls=False)
    cols = check_columns(Columns.from_arrow(table, schema), schema, file, log or ProblemLog(), on_error)
    return to_batch(cols, schema)


def random_columns(schema: FeatureSchema, rows: int, seed: int = 0, first_id: int = 0,
                   mean_seq_len: float | None = None, null_rate: float = 0.2) -> dict[str, Any]:
    """Valid canonical rows as a writer dict: ids in vocab, some null labels, jagged sequences.

    ``example_id`` runs ``first_id .. first_id+rows-1`` so tests can check exactly-once delivery.
    Sequence lengths are geometric with mean ``mean_seq_len`` (default max_len/2), capped at max_len.
    """
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {
        schema.example_id_column: np.arange(first_id, first_id + rows, dtype=np.int64),
        schema.time_column: np.sort(rng.integers(0, 86400, rows)).astype(np.int64),
        schema.surface_column: rng.integers(0, len(schema.surfaces), rows).astype(np.int32),
    }
    for f in schema.sparse:
        if f.multi_valued:
            ln = rng.integers(0, 4, rows)
            out[f.name] = (ln, rng.integers(0, f.vocab, int(ln.sum())))
        else:
            out[f.name] = rng.integers(0, f.vocab, rows)
    for f in schema.dense:
        out[f.name] = rng.standard_normal(rows).astype(np.float32)
    for g in schema.sequences:
        mean = mean_seq_len or g.max_len / 2
        ln = np.minimum(rng.geometric(1.0 / (mean + 1), rows) - 1, g.max_len)
        total = int(ln.sum())
        for f in g.fields:
            vals = rng.integers(0, f.vocab, total) if f.kind == "id" else rng.random(total).astype(np.float32)
            out[g.column(f.name)] = (ln, vals)
    for t in schema.tasks:
        lab = (rng.random(rows) < 0.3).astype(np.float32)
        observed = rng.random(rows) >= null_rate
        out[t.label_column] = pa.array(lab, mask=~observed, type=pa.float32())
    return out
