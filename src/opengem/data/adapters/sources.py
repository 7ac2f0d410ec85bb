"""Streaming readers for ``opengem convert table``: CSV/TSV, Parquet and libsvm, batch by batch.

Nothing here reads a file whole: CSV through ``pyarrow.csv.open_csv`` (one block at a time, single-
threaded so that a malformed row is skipped and counted with its line number in :class:`BadRows`),
Parquet through ``ParquetFile.iter_batches``, libsvm as one text column per block parsed with Arrow
string kernels (``label idx:val idx:val ...`` -> ``label`` and a ``features`` list of the indices whose
value is non-zero). Memory is therefore bounded whatever the file size: Arrow's CSV reader reads up to
32 blocks ahead on its I/O thread (measured: 33 x BLOCK_BYTES allocated, about 270 MB at 8 MB blocks),
Parquet one row group at a time.

Several files (a glob, or one per split) are read in order as one stream. For headed CSV the first
file's header names the columns; a later file whose first line is that same header skips it, and one
whose first line differs is read as headerless data (Avazu ships ``dev.csv``/``test.csv`` without the
header of ``train.csv``). ``columns`` names headerless files' columns instead.
"""

from __future__ import annotations

import glob
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from opengem.data.adapters.common import AdapterError, BadRows
from opengem.errors import UsageError

FORMATS = ("csv", "tsv", "parquet", "libsvm")
BLOCK_BYTES = 8 << 20
SAMPLE_ROWS = 65536  # --infer-schema's look at a Parquet source
PARQUET_BATCH = 131_072
LIBSVM_SCHEMA = pa.schema([("label", pa.float64()), ("features", pa.list_(pa.int64()))])


SUFFIX_FORMATS = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".parquet": "parquet", ".pq": "parquet",
                  ".libsvm": "libsvm", ".svm": "libsvm"}
COMPRESSION_SUFFIXES = (".gz", ".bz2", ".zst", ".lz4")  # what pa.input_stream(compression="detect") reads


def format_from_names(paths: list[str]) -> str | None:
    """The one format every path's name says (``clicks.csv.gz`` -> csv), or None when a name says none or
    two names disagree: then the user names it with --format."""
    found = set()
    for path in paths:
        name = Path(path).name.lower()
        for ext in COMPRESSION_SUFFIXES:
            name = name.removesuffix(ext)
        found.add(SUFFIX_FORMATS.get(Path(name).suffix))
    return found.pop() if len(found) == 1 else None


def expand(pattern: str) -> list[Path]:
    """The files a ``--src`` path or glob names, sorted; none is a UsageError naming the pattern."""
    p = Path(pattern)
    if p.is_file():
        return [p]
    if p.is_dir():
        raise UsageError(f"--src {pattern}: is a folder; give a file or a glob such as '{p}/*.csv'")
    files = sorted(Path(f) for f in glob.glob(pattern) if Path(f).is_file())
    if not files:
        raise UsageError(f"--src {pattern}: no such file (and no file matches it as a glob)")
    return files


def _one_line(e: Exception, limit: int = 200) -> str:
    """An Arrow error as one printable line (a parse error quotes the raw row: binary bytes, newlines)."""
    text = " ".join(str(e).split())
    return text.encode("ascii", "backslashreplace").decode("ascii")[:limit]


_CONVERSION = re.compile(r"In CSV column #(\d+): Row #(\d+): CSV conversion error to (\w+): "
                         r"invalid value '(.*)'", re.DOTALL)
_READ_AS = {"double": "a number", "float": "a number", "int64": "an integer", "int32": "an integer",
            "bool": "true or false"}


def _first_line(path: Path) -> bytes:
    """The file's first line (its header), read through its compression; a file cut short or corrupt
    within its first 64 KiB is one AdapterError naming it."""
    try:
        with pa.input_stream(str(path), compression="detect") as f:
            return f.read(1 << 16).split(b"\n", 1)[0].rstrip(b"\r")
    except (OSError, EOFError, pa.ArrowException) as e:
        raise AdapterError(f"{path}: cannot read its first line (cut short or corrupt?): {_one_line(e)}"
                           ) from None


@dataclass
class Source:
    """One logical input: its files, format and column naming; opens streams of record batches."""

    files: list[Path]
    fmt: str
    columns: list[str] | None = None  # names for headerless CSV
    types: dict[str, pa.DataType] = field(default_factory=dict)  # CSV: column types to parse as
    header_file: Path | None = None  # CSV: the file whose first line is the header (default: files[0])
    limit: int | None = None  # read at most this many rows of each file (quick tests)

    def __post_init__(self) -> None:
        if self.fmt not in FORMATS:
            raise UsageError(f"--format {self.fmt}: not one of {', '.join(FORMATS)}")

    @property
    def delimiter(self) -> str:
        return "\t" if self.fmt == "tsv" else ","

    @property
    def _header_path(self) -> Path:
        return self.header_file or self.files[0]

    def header(self) -> bytes | None:
        return None if self.columns else _first_line(self._header_path)

    def header_lines(self, path: Path) -> int:
        """Lines of ``path`` above its first data row: the header file's header, and a later file's first
        line where it repeats that header (:meth:`_open_csv` skips it); 0 for headerless and libsvm."""
        if self.fmt not in ("csv", "tsv") or self.columns:
            return 0
        return 1 if path == self._header_path or _first_line(path) == self.header() else 0

    def schema(self) -> pa.Schema:
        """Column names and types as read (CSV: types inferred from the first block of the first file)."""
        if self.fmt == "libsvm":
            return LIBSVM_SCHEMA
        if self.fmt == "parquet":
            try:
                return pq.read_schema(self.files[0])
            except (pa.ArrowInvalid, OSError) as e:
                raise AdapterError(f"{self.files[0]}: not a readable Parquet file: {e}") from None
        reader = self._open_csv(self.files[0], BadRows(), infer=True)
        try:
            return reader.schema
        finally:
            reader.close()

    def sample(self) -> pa.RecordBatch | None:
        """The rows ``--infer-schema`` looks at. CSV: the first block with every column as text (to tell an
        integer id too large for int64, which Arrow parses as a float, from a real number, and a cell that
        joins a list); Parquet: its first SAMPLE_ROWS rows as stored (text cells that join lists, histories
        whose values are another column's); LIBSVM: None."""
        if self.fmt == "parquet":
            try:
                return next(pq.ParquetFile(self.files[0]).iter_batches(batch_size=SAMPLE_ROWS), None)
            except (pa.ArrowInvalid, OSError) as e:
                raise AdapterError(f"{self.files[0]}: not a readable Parquet file: {e}") from None
        if self.fmt not in ("csv", "tsv"):
            return None
        names = self.schema().names
        saved, self.types = self.types, {c: pa.string() for c in names}
        reader = self._open_csv(self.files[0], BadRows())
        try:
            return reader.read_next_batch()
        except StopIteration:
            return None
        finally:
            reader.close()
            self.types = saved

    def _open_csv(self, path: Path, bad: BadRows, infer: bool = False) -> pcsv.CSVStreamingReader:
        header = self.header()
        names, skip = self.columns, 0
        if header is not None:
            names = None if path == self._header_path else self._header_names()
            skip = 1 if path != self._header_path and _first_line(path) == header else 0
        read = pcsv.ReadOptions(column_names=names, skip_rows=skip, block_size=BLOCK_BYTES, use_threads=False)
        parse = pcsv.ParseOptions(delimiter=self.delimiter, invalid_row_handler=bad.handler(path))
        conv = pcsv.ConvertOptions(column_types={} if infer else self.types, strings_can_be_null=True)
        try:
            return pcsv.open_csv(path, read_options=read, parse_options=parse, convert_options=conv)
        except (pa.ArrowInvalid, OSError) as e:
            raise AdapterError(self._conversion_error(path, e)
                               or f"{path}: cannot read as {self.fmt.upper()}: {_one_line(e)}") from None

    def _conversion_error(self, path: Path, e: Exception) -> str | None:
        """Arrow's "In CSV column #2: Row #121: CSV conversion error to double: invalid value 'abc'" as the
        file, line and column NAME a user can find (Arrow's row number is the file's line, header included,
        when it reads with one thread, as here); None for any other error."""
        m = _CONVERSION.search(str(e))
        if m is None:
            return None
        col, line, to = int(m[1]), int(m[2]), m[3]
        names = self.columns or self._header_names()  # read only now: the header is opened again for it
        name = names[col] if col < len(names) else f"#{col}"
        value = m[4][:80].encode("ascii", "backslashreplace").decode("ascii")
        return (f"{path}: line {line}, column {name!r}: {value!r} is not {_READ_AS.get(to, to)} (the column "
                f"is read as {to}: fix or blank the cell, or read the column another way in the import spec)")

    def _header_names(self) -> list[str]:
        reader = self._open_csv(self._header_path, BadRows(), infer=True)
        try:
            return reader.schema.names
        finally:
            reader.close()

    def batches(self, bad: BadRows,
                columns: list[str] | None = None) -> Iterator[tuple[Path, pa.RecordBatch]]:
        """Every file's record batches in order (only ``columns`` where the format can skip the rest)."""
        for path in self.files:
            left = self.limit
            for batch in self._file_batches(path, bad, columns):
                if left is not None:
                    batch = batch.slice(0, left)
                    left -= batch.num_rows
                if batch.num_rows:
                    yield path, batch
                if left == 0:
                    break

    def _file_batches(self, path: Path, bad: BadRows,
                      columns: list[str] | None) -> Iterator[pa.RecordBatch]:
        if self.fmt == "parquet":
            yield from _parquet_batches(path, columns)
        elif self.fmt == "libsvm":
            yield from _libsvm_batches(path, bad)
        else:
            reader = self._open_csv(path, bad)
            try:
                while True:
                    try:
                        batch = reader.read_next_batch()
                    except StopIteration:
                        break
                    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
                        raise AdapterError(self._conversion_error(path, e)
                                           or f"{path}: {_one_line(e)} (a column's values changed type "
                                              "after the first block?)") from None
                    yield batch if columns is None else batch.select(
                        [c for c in columns if c in batch.schema.names])
            finally:
                reader.close()


def _parquet_batches(path: Path, columns: list[str] | None) -> Iterator[pa.RecordBatch]:
    try:
        pf = pq.ParquetFile(path)
        cols = None if columns is None else [c for c in columns if c in pf.schema_arrow.names]
        yield from pf.iter_batches(batch_size=PARQUET_BATCH, columns=cols)
    except (pa.ArrowInvalid, OSError) as e:
        raise AdapterError(f"{path}: not a readable Parquet file (cut short or corrupt?): {e}") from None


def _libsvm_batches(path: Path, bad: BadRows) -> Iterator[pa.RecordBatch]:
    read = pcsv.ReadOptions(column_names=["line"], block_size=BLOCK_BYTES, use_threads=False)
    parse = pcsv.ParseOptions(delimiter="\x1f", quote_char=False, escape_char=False,
                              invalid_row_handler=bad.handler(path))
    conv = pcsv.ConvertOptions(column_types={"line": pa.string()})
    reader = pcsv.open_csv(path, read_options=read, parse_options=parse, convert_options=conv)
    first = 1
    try:
        for batch in reader:
            yield parse_libsvm(batch.column(0), path, first)
            first += batch.num_rows
    finally:
        reader.close()


def parse_libsvm(lines: pa.Array, path: Path, first_line: int = 1) -> pa.RecordBatch:
    """``label idx:val ...`` lines -> (label float64, features list<int64> of indices with val != 0)."""
    tokens = pc.split_pattern_regex(pc.utf8_trim_whitespace(lines), r"\s+")
    try:
        label = pc.cast(pc.list_element(tokens, 0), pa.float64())
        feats = pc.list_flatten(pc.list_slice(tokens, 1))
        parent = pc.list_parent_indices(pc.list_slice(tokens, 1)).to_numpy()
        parts = pc.split_pattern(feats, ":")
        n_parts = pc.list_value_length(parts).to_numpy()
        if len(n_parts) and (n_parts != 2).any():
            j = int(np.flatnonzero(n_parts != 2)[0])
            raise AdapterError(f"{path}: line {first_line + int(parent[j])}: {feats[j].as_py()!r} is not "
                               "index:value (libffm field:index:value is not supported)")
        idx = pc.cast(pc.list_element(parts, 0), pa.int64()).to_numpy(zero_copy_only=False)
        val = pc.cast(pc.list_element(parts, 1), pa.float64()).to_numpy(zero_copy_only=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise AdapterError(f"{path}: lines {first_line}..{first_line + len(lines) - 1}: not libsvm "
                           f"(label idx:val ...): {e}") from None
    keep = val != 0
    counts = np.bincount(parent[keep], minlength=len(lines))
    offsets = np.zeros(len(lines) + 1, np.int32)
    np.cumsum(counts, out=offsets[1:])
    features = pa.ListArray.from_arrays(pa.array(offsets), pa.array(idx[keep], pa.int64()))
    return pa.RecordBatch.from_arrays([label, features], schema=LIBSVM_SCHEMA)
