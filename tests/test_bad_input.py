"""Every class of bad input: a DataError naming file, column and row by default; skip/repair + counts else."""

import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from opengem.data.dataset import arrow_schema
from opengem.data.loader import ParquetLoader
from opengem.data.parquet import CanonicalWriter, DataError
from opengem.data.schema import FeatureSchema
from parquet_helpers import random_columns

TINY = Path(__file__).resolve().parents[1] / "configs" / "schemas" / "tiny.toml"
ROWS, BAD_ROW = 20, 13  # row groups of 8: the bad row sits in the second row group


@pytest.fixture(scope="module")
def schema() -> FeatureSchema:
    return FeatureSchema.load(TINY)


def with_policy(schema, **kw):
    """A copy of the schema with policies changed: sparse=<name>:<on_oov>, dense/seq likewise."""
    d = schema.to_dict()
    for s in d["sparse"]:
        s["on_oov"] = kw.get("on_oov", s["on_oov"])
    for s in d["dense"]:
        s["on_nan"] = kw.get("on_nan", s["on_nan"])
    for g in d["sequence"]:
        g["on_overflow"] = kw.get("on_overflow", g["on_overflow"])
        for f in g["fields"]:
            f["on_oov"] = kw.get("on_oov", f["on_oov"])
            f["on_nan"] = kw.get("on_nan", f["on_nan"])
    return FeatureSchema.from_dict(d)


def good_table(schema, rows=ROWS, first_id=0) -> pa.Table:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "t.parquet"
        with CanonicalWriter(schema, p) as w:
            w.write(random_columns(schema, rows, seed=first_id, first_id=first_id))
        return pq.read_table(p)


def set_cell(table: pa.Table, column: str, row: int, value) -> pa.Table:
    values = table.column(column).to_pylist()
    values[row] = value
    idx = table.column_names.index(column)
    return table.set_column(idx, table.schema.field(idx), pa.array(values, type=table.schema.field(idx).type))


def write(table: pa.Table, path: Path) -> Path:
    pq.write_table(table, path, row_group_size=8, write_page_checksum=True)
    return path


def dataset(tmp_path, schema, bad: pa.Table) -> list[Path]:
    """A good file, the bad one, another good file."""
    return [write(good_table(schema, first_id=100), tmp_path / "a.parquet"),
            write(bad, tmp_path / "b.parquet"),
            write(good_table(schema, first_id=200), tmp_path / "c.parquet")]


def read_all(files, schema, **kw):
    loader = ParquetLoader(files, schema, 8, **kw)
    ids = [i for b in loader for i in b.example_id.tolist()]
    return loader, ids


def expect_error(files, schema, column, row, needle):
    with pytest.raises(DataError) as e:
        read_all(files, schema)
    msg = str(e.value)
    assert "b.parquet" in msg and needle in msg, msg
    if column is not None:
        assert f"column {column!r}" in msg, msg
    if row is not None:
        assert f"row {row}" in msg, msg


def expect_skip(files, schema, column, needle, dropped=1, **kw):
    loader, ids = read_all(files, schema, on_error="skip", **kw)
    assert len(ids) == 3 * ROWS - dropped and len(set(ids)) == len(ids)
    assert BAD_ROW not in ids or dropped == 0
    counts = loader.problems.counts
    hits = [(k, n) for k, n in counts.items() if k[0].endswith("b.parquet") and needle in k[2]]
    assert hits and hits[0][0][1] == (column or ""), loader.problems.counts
    assert needle in loader.report()
    return loader, ids


# ------------------------------------------------------------------------------------------ per class
@pytest.mark.parametrize(
    "column, value, needle",
    [
        ("user_id", -3, "negative id"),
        ("user_interests", [1, -1], "negative id"),
        ("hist__item", [1, 2, -7], "negative id"),
        ("ad_id", 50, "id beyond vocabulary 50"),
        ("hist__action", [0, 9], "id beyond vocabulary 5"),
        ("ad_quality", float("nan"), "NaN/Inf"),
        ("user_activity", float("inf"), "NaN/Inf"),
        ("hist__dt", [0.1, float("nan")], "NaN/Inf"),
        ("surface", 3, "surface out of range"),
        ("surface", -1, "surface out of range"),
        ("click", 0.5, "label not in {0, 1, null}"),
        ("conversion", float("nan"), "label not in {0, 1, null}"),
    ],
)
def test_bad_value_errors_then_skips(schema, tmp_path, column, value, needle):
    bad = good_table(schema)
    if column.startswith("hist__"):  # keep the group aligned: give every field the same length
        n = len(value)
        for f in ("hist__item", "hist__action", "hist__dt"):
            bad = set_cell(bad, f, BAD_ROW, [0.1] * n if f == "hist__dt" else [1] * n)
    bad = set_cell(bad, column, BAD_ROW, value)
    files = dataset(tmp_path, schema, bad)
    expect_error(files, schema, column, BAD_ROW, needle)
    expect_skip(files, schema, column, needle)


def test_out_of_vocab_hash_and_clamp_repair(schema, tmp_path):
    bad = set_cell(good_table(schema), "ad_id", BAD_ROW, 53)
    bad = set_cell(bad, "user_id", 2, -1)
    files = [write(bad, tmp_path / "b.parquet")]
    for policy, ad, user in (("hash", 53 % 50, 99), ("clamp", 49, 0)):
        s = with_policy(schema, on_oov=policy)
        loader, _ = read_all(files, s)  # no error: the schema says repair
        b = next(iter(ParquetLoader(files, s, ROWS)))
        d = b.sparse.to_dict()
        assert d["ad_id"].values()[BAD_ROW].item() == ad
        assert d["user_id"].values()[2].item() == user
        assert loader.problems.counts[(str(files[0]), "ad_id", "id beyond vocabulary 50")] == 1


def test_nan_zero_repair(schema, tmp_path):
    bad = set_cell(good_table(schema), "ad_quality", BAD_ROW, float("nan"))
    bad = set_cell(bad, "hist__dt", 0, [float("inf")] * len(bad.column("hist__item")[0].as_py()))
    s = with_policy(schema, on_nan="zero")
    files = [write(bad, tmp_path / "b.parquet")]
    b = next(iter(ParquetLoader(files, s, ROWS)))
    assert b.dense[BAD_ROW, 0].item() == 0.0 and bool(b.dense.isfinite().all())
    assert bool(b.sequences["hist"].dense["dt"].isfinite().all())
    assert len(b) == ROWS


def test_sequence_too_long(schema, tmp_path):
    n = schema.sequence("hist").max_len + 3
    bad = good_table(schema)
    for f, v in (("hist__item", [1] * n), ("hist__action", [2] * n), ("hist__dt", [0.5] * n)):
        bad = set_cell(bad, f, BAD_ROW, v)
    files = dataset(tmp_path, schema, bad)
    expect_error(files, schema, "hist__item", BAD_ROW, "longer than max_len 12")
    expect_skip(files, schema, "hist__item", "longer than max_len 12")
    # schema says truncate: nothing dropped, the row keeps max_len events
    loader, ids = read_all(files, with_policy(schema, on_overflow="truncate"))
    assert len(ids) == 3 * ROWS and loader.problems.total == 1


def test_sequence_fields_of_unequal_length(schema, tmp_path):
    bad = set_cell(good_table(schema), "hist__action", BAD_ROW, [1] * 13)
    files = dataset(tmp_path, schema, bad)
    expect_error(files, schema, "hist__action", BAD_ROW, "length differs")
    expect_skip(files, schema, "hist__action", "length differs")


def test_null_in_required_column(schema, tmp_path):
    bad = good_table(schema)
    i = bad.column_names.index("ts")
    bad = bad.set_column(i, pa.field("ts", pa.int64()),
                         pa.array([None if r == BAD_ROW else r for r in range(ROWS)], pa.int64()))
    files = dataset(tmp_path, schema, bad)
    expect_error(files, schema, "ts", BAD_ROW, "null value")
    expect_skip(files, schema, "ts", "null value")


def test_missing_column(schema, tmp_path):
    files = dataset(tmp_path, schema, good_table(schema).drop_columns(["ad_category"]))
    expect_error(files, schema, "ad_category", None, "missing column")
    expect_skip(files, schema, "ad_category", "missing column", dropped=ROWS)


def test_wrong_column_type(schema, tmp_path):
    bad = good_table(schema)
    i = bad.column_names.index("user_id")
    bad = bad.set_column(i, pa.field("user_id", pa.string()), pa.array([str(r) for r in range(ROWS)]))
    files = dataset(tmp_path, schema, bad)
    expect_error(files, schema, "user_id", None, "wrong type string")
    expect_skip(files, schema, "user_id", "wrong type", dropped=ROWS)


def test_truncated_file(schema, tmp_path):
    files = dataset(tmp_path, schema, good_table(schema))
    data = files[1].read_bytes()
    files[1].write_bytes(data[: len(data) // 2])
    expect_error(files, schema, None, None, "corrupt or truncated")
    expect_skip(files, schema, None, "corrupt or truncated", dropped=ROWS)


def test_corrupt_page_is_detected_by_checksum(schema, tmp_path):
    files = dataset(tmp_path, schema, good_table(schema))
    data = bytearray(files[1].read_bytes())
    md = pq.ParquetFile(files[1]).metadata
    col = md.row_group(1).column(arrow_schema(schema).get_field_index("ad_quality"))
    start = col.dictionary_page_offset or col.data_page_offset
    for k in range(col.total_compressed_size - 8, col.total_compressed_size - 2):  # page body, not header
        data[start + k] ^= 0xFF
    files[1].write_bytes(bytes(data))
    expect_error(files, schema, None, 8, "corrupt row group 1")
    loader, ids = read_all(files, schema, on_error="skip")
    assert len(ids) == 3 * ROWS - 8  # only the corrupt row group is lost
    assert any("corrupt row group" in k[2] for k in loader.problems.counts)


@pytest.mark.parametrize("kind", ["zero_bytes", "zero_rows"])
def test_empty_file(schema, tmp_path, kind):
    files = dataset(tmp_path, schema, good_table(schema))
    if kind == "zero_bytes":
        files[1].write_bytes(b"")
        needle = "empty file (0 bytes)"
    else:
        pq.write_table(good_table(schema).slice(0, 0), files[1])
        needle = "empty file (0 rows)"
    expect_error(files, schema, None, None, needle)
    expect_skip(files, schema, None, needle, dropped=ROWS)


def test_schema_wide_skip_drops_and_counts(schema, tmp_path):
    d = schema.to_dict()
    d["on_error"] = "skip"
    for s in d["sparse"]:
        s.pop("on_oov")
    s2 = FeatureSchema.from_dict(d)
    bad = set_cell(good_table(schema), "ad_id", BAD_ROW, -5)
    loader, ids = read_all(dataset(tmp_path, schema, bad), s2)  # no caller override needed
    assert len(ids) == 3 * ROWS - 1 and BAD_ROW not in ids
    assert loader.problems.total == 1


def test_error_from_worker_process_is_a_clear_data_error(schema, tmp_path):
    bad = set_cell(good_table(schema), "ad_id", BAD_ROW, 77)
    files = dataset(tmp_path, schema, bad)
    with pytest.raises(DataError, match=r"b\.parquet: column 'ad_id', row 13: id beyond vocabulary 50"):
        read_all(files, schema, num_workers=2)
