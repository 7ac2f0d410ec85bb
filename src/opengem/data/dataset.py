"""A canonical dataset on disk: ``schema.toml`` plus Parquet files in named partitions.

Layout (written by the simulator and the adapters, read by the loader and the validator)::

    DIR/schema.toml
    DIR/<partition>/part-00000.parquet ...   partitions: day=000, day=001 ... or train/valid/test
    DIR/<partition>/_COMPLETE                the partition was committed whole (see commit.py)
    DIR/truth/<partition>/part-*.parquet     simulator only: true label probabilities, never a model input
    DIR/summary.json                         what the writer wants a reader to know (oracle NE, splits)
    DIR/_COMPLETE                            written last: the dataset is finished (rows per partition)

Every folder under DIR is a partition except ``truth`` and names starting with ``.`` or ``_`` (temporary
and bookkeeping folders, as in Spark/Hive). A reader refuses, with one line naming the path:

- a folder without ``_COMPLETE`` (an interrupted or still running writer; a dataset assembled by hand is
  marked with ``opengem validate --data DIR --mark-complete``);
- a selected partition without its own marker that the dataset marker does not list either (one being
  written into a growing dataset);
- a Parquet file directly in DIR (it would belong to no partition);
- a selected partition with no Parquet file, or only 0-row files (emptied: rows would vanish silently).

Partitions are selected with specs (``@train``, ``day=00[0-4]``, ...): see :mod:`opengem.data.splits`.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from opengem.data.commit import (
    MARK_HINT,
    MARKER,
    TRUTH_DIR,
    leftovers,
    partition_files,
    partition_names,
    read_marker,
)
from opengem.data.schema import FeatureSchema
from opengem.data.splits import select_partitions
from opengem.errors import DatasetError


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
    """A dataset folder; ``require_complete=False`` only for tools that inspect or mark a dataset that
    is not (yet) marked complete (``opengem validate --mark-complete``)."""

    def __init__(self, root: str | Path, schema: FeatureSchema | None = None, *,
                 require_complete: bool = True) -> None:
        self.root = Path(root)
        self.require_complete = require_complete
        if not self.root.is_dir():
            unfinished = leftovers(self.root, dead_only=False)
            if unfinished:
                raise DatasetError(f"{self.root}: dataset folder not found; {unfinished[0]} is an unfinished "
                                   "write of it (interrupted, or still running): re-run the writer")
            if self.root.exists():
                raise DatasetError(f"{self.root}: is a file, not a dataset folder")
            raise DatasetError(f"{self.root}: dataset folder not found")
        try:
            self.marker = read_marker(self.root)
        except DatasetError:
            if require_complete:
                raise
            self.marker = None  # an unreadable marker is about to be rewritten (mark_complete)
        if self.marker is None and require_complete and (self.root / "manifest.json").is_file() \
                and (self.root / "schema.toml").is_file():  # an `opengem export` folder, not data
            raise DatasetError(f"{self.root}: an exported model (opengem export), not a dataset: give --data "
                               "the folder of rows to read (the run's data, or one made by opengem convert)")
        if self.marker is None and require_complete and schema is None \
                and not (self.root / "schema.toml").exists():  # not data at all (a run folder, a file's)
            what = ("a training run folder (config.toml), not a dataset: its data is the run's data.path"
                    if (self.root / "config.toml").is_file() else "not a dataset (no schema.toml)")
            raise DatasetError(f"{self.root}: {what}")
        if self.marker is None and require_complete:
            raise DatasetError(f"{self.root}: no {MARKER} marker, so the writer did not finish (interrupted, "
                               "or still running): re-run it; for a dataset assembled by hand, check and "
                               f"mark it with `{MARK_HINT.format(path=self.root)}`")
        if schema is None:
            path = self.root / "schema.toml"
            if not path.exists():
                raise DatasetError(f"{self.root}: no schema.toml (pass --schema to name one)")
            schema = FeatureSchema.load(path)
        self.schema = schema

    def partitions(self) -> list[str]:
        """Every partition folder, sorted by name; a Parquet file outside any partition is an error."""
        return partition_names(self.root)

    def partition_complete(self, part: str) -> bool:
        """The partition was committed whole: it holds its own marker, or the dataset marker lists it."""
        if read_marker(self.root / part) is not None:
            return True
        return self.marker is not None and part in self.marker.get("partitions", {})

    def partition_files(self, part: str) -> list[Path]:
        return partition_files(self.root / part)

    def check_partition(self, part: str) -> None:
        """Raise a DatasetError when ``part`` is not committed or holds no rows (see the module doc)."""
        path = self.root / part
        if self.require_complete and not self.partition_complete(part):
            raise DatasetError(f"{path}: partition has no {MARKER} marker and {self.root / MARKER} does not "
                               "list it: it is still being written (or was interrupted); wait for or re-run "
                               f"its writer, or check and mark the dataset with "
                               f"`{MARK_HINT.format(path=self.root)}`")
        files = self.partition_files(part)
        if not files:
            raise DatasetError(f"{path}: partition holds no Parquet file: restore its files, or remove the "
                               "folder (and re-mark the dataset) if it should not exist")
        for f in files:
            try:
                if pq.read_metadata(f).num_rows > 0:
                    return
            except Exception:  # noqa: BLE001 - a corrupt file is the loader's to report, naming it
                return
        raise DatasetError(f"{path}: partition holds only empty (0-row) Parquet files: restore its rows, or "
                           "remove the folder (and re-mark the dataset) if it should not exist")

    def select(self, spec: str = "@all") -> list[str]:
        """The partitions ``spec`` selects; each must be committed and hold rows."""
        chosen = select_partitions(self.root, self.partitions(), spec)
        for part in chosen:
            self.check_partition(part)
        return chosen

    def files(self, spec: str = "@all") -> list[Path]:
        out: list[Path] = []
        for part in self.select(spec):
            out += self.partition_files(part)
        return out

    def truth_files(self, spec: str = "@all") -> list[Path]:
        out: list[Path] = []
        for part in self.select(spec):
            out += sorted((self.root / TRUTH_DIR / part).glob("*.parquet"))
        return out
