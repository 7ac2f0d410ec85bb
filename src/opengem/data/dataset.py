"""A canonical dataset on disk: ``schema.toml`` plus Parquet files in named partitions.

Layout (written by the simulator and the adapters, read by the loader and the validator)::

    DIR/schema.toml
    DIR/<partition>/part-00000.parquet ...   partitions: day=000, day=001 ... or train/valid/test
    DIR/truth/<partition>/part-*.parquet     simulator only: true label probabilities, never a model input
    DIR/summary.json                         what the writer wants a reader to know (oracle NE, splits)

Partitions are selected with comma-separated fnmatch patterns (``day=00[0-4]``, ``train``) or the
tokens ``@all``, ``@last`` and ``@all_but_last`` (time-ordered partitions sort by name).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from opengem.data.schema import FeatureSchema
from opengem.data.splits import select_partitions
from opengem.errors import DatasetError

TRUTH_DIR = "truth"


def arrow_schema(schema: FeatureSchema) -> pa.Schema:
    """The Arrow schema of canonical Parquet for a FeatureSchema (column order = required_columns)."""
    fields = [
        pa.field(schema.example_id_column, pa.int64(), nullable=False),
        pa.field(schema.time_column, pa.int64(), nullable=False),
        pa.field(schema.surface_column, pa.int32(), nullable=False),
    ]
    for f in schema.sparse:
        fields.append(pa.field(f.name, pa.list_(pa.int64()) if f.multi_valued else pa.int64()))
    for f in schema.dense:
        fields.append(pa.field(f.name, pa.float32()))
    for g in schema.sequences:
        for f in g.fields:
            inner = pa.int64() if f.kind == "id" else pa.float32()
            fields.append(pa.field(g.column(f.name), pa.list_(inner)))
    for t in schema.tasks:
        fields.append(pa.field(t.label_column, pa.float32(), nullable=True))
    return pa.schema(fields)


class Dataset:
    def __init__(self, root: str | Path, schema: FeatureSchema | None = None) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise DatasetError(f"{self.root}: dataset folder not found")
        if schema is None:
            path = self.root / "schema.toml"
            if not path.exists():
                raise DatasetError(f"{self.root}: no schema.toml (pass --schema to name one)")
            schema = FeatureSchema.load(path)
        self.schema = schema

    def partitions(self) -> list[str]:
        parts = sorted(
            p.name
            for p in self.root.iterdir()
            if p.is_dir() and p.name != TRUTH_DIR and any(p.glob("*.parquet"))
        )
        if any(self.root.glob("*.parquet")):
            parts.insert(0, ".")
        return parts

    def select(self, spec: str = "@all") -> list[str]:
        return select_partitions(self.root, self.partitions(), spec)

    def files(self, spec: str = "@all") -> list[Path]:
        out: list[Path] = []
        for part in self.select(spec):
            out += sorted((self.root / part).glob("*.parquet"))
        return out

    def truth_files(self, spec: str = "@all") -> list[Path]:
        out: list[Path] = []
        for part in self.select(spec):
            out += sorted((self.root / TRUTH_DIR / part).glob("*.parquet"))
        return out
