import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from opengem.data.dataset import arrow_schema
from opengem.data.parquet import CanonicalWriter, DataError, write_parquet
from opengem.data.schema import FeatureSchema
from parquet_helpers import random_columns, record_batch_to_batch

TINY = Path(__file__).resolve().parents[1] / "configs" / "schemas" / "tiny.toml"


@pytest.fixture(scope="module")
def schema() -> FeatureSchema:
    return FeatureSchema.load(TINY)


def test_writer_cuts_exact_row_groups_and_roundtrips(schema, tmp_path):
    path = tmp_path / "a.parquet"
    with CanonicalWriter(schema, path, row_group_size=40) as w:
        for i in range(3):  # pieces of 30 rows: row groups must still be 40, 40, 10
            w.write(random_columns(schema, 30, seed=i, first_id=30 * i))
    md = pq.ParquetFile(path).metadata
    assert [md.row_group(i).num_rows for i in range(md.num_row_groups)] == [40, 40, 10]
    t = pq.read_table(path)
    assert t.schema.equals(arrow_schema(schema))
    assert t.column("example_id").to_pylist() == list(range(90))
    assert w.rows_written == 90


def test_writer_is_atomic_on_error(schema, tmp_path):
    path = tmp_path / "a.parquet"
    write_parquet(schema, path, random_columns(schema, 10, first_id=0))
    before = path.read_bytes()
    with pytest.raises(RuntimeError, match="boom"):
        with CanonicalWriter(schema, path, row_group_size=4) as w:
            w.write(random_columns(schema, 10, first_id=100))  # two row groups already on disk (tmp)
            raise RuntimeError("boom")
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.parquet"]  # no temp file left behind


def test_writer_rejects_wrong_type_and_missing_column(schema, tmp_path):
    cols = random_columns(schema, 5)
    cols["ad_id"] = ["a", "b", "c", "d", "e"]
    with pytest.raises(DataError, match="column 'ad_id'.*wrong type string"):
        write_parquet(schema, tmp_path / "x.parquet", cols)
    cols = random_columns(schema, 5)
    del cols["user_activity"]
    with pytest.raises(DataError, match="column 'user_activity'.*missing"):
        write_parquet(schema, tmp_path / "x.parquet", cols)
    cols = random_columns(schema, 5)
    cols["surface"] = np.array([0, 1, 2, 3, 2**40])  # int64 that does not fit int32
    with pytest.raises(DataError, match="column 'surface'"):
        write_parquet(schema, tmp_path / "x.parquet", cols)
    assert not (tmp_path / "x.parquet").exists()


def test_writer_accepts_compatible_types(schema, tmp_path):
    cols = random_columns(schema, 6)
    cols["user_id"] = cols["user_id"].astype(np.int16)
    cols["ad_quality"] = np.arange(6)  # ints into a float column
    write_parquet(schema, tmp_path / "x.parquet", cols)
    t = pq.read_table(tmp_path / "x.parquet")
    assert t.schema.field("user_id").type == pa.int64()
    assert t.column("ad_quality").to_pylist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def _table(schema, rows):
    """A canonical table from a list of per-row dicts (missing keys -> null)."""
    target = arrow_schema(schema)
    return pa.table({f.name: pa.array([r.get(f.name) for r in rows], type=f.type) for f in target})


def _row(i, **kw):
    r = {"example_id": i, "ts": 10 * i, "surface": i % 3, "user_id": 7, "ad_id": 3, "ad_category": 1,
         "user_interests": [1, 2], "ad_quality": 0.5, "user_activity": -1.0,
         "hist__item": [4, 5, 6], "hist__action": [0, 1, 2], "hist__dt": [0.1, 0.2, 0.3],
         "click": 1.0, "conversion": None}
    r.update(kw)
    return r


def test_arrow_to_batch_layout(schema):
    rows = [_row(0), _row(1, ad_id=None, user_interests=[], hist__item=[], hist__action=[], hist__dt=[]),
            _row(2, user_interests=None, click=0.0, conversion=1.0)]
    b = record_batch_to_batch(_table(schema, rows).to_batches()[0], schema)
    kjt = b.sparse.to_dict()
    assert list(b.sparse.keys()) == schema.sparse_names
    assert kjt["ad_id"].lengths().tolist() == [1, 0, 1]  # null single-valued id -> length 0
    assert kjt["ad_id"].values().tolist() == [3, 3]
    assert kjt["user_interests"].lengths().tolist() == [2, 0, 0]
    h = b.sequences["hist"]
    assert h.lengths.tolist() == [3, 0, 3]
    assert h.ids["item"].tolist() == [4, 5, 6, 4, 5, 6]
    assert h.dense["dt"].dtype.is_floating_point and h.dense["dt"].shape == (6,)
    assert b.dense.shape == (3, 2) and b.dense[0].tolist() == [0.5, -1.0]
    assert b.labels.tolist() == [[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]
    assert b.label_mask.tolist() == [[True, False], [True, False], [True, True]]
    assert b.surface.tolist() == [0, 1, 2] and b.example_id.tolist() == [0, 1, 2]
    assert b.ts.tolist() == [0, 10, 20]


def test_sequence_truncate_keeps_most_recent_events(schema):
    d = schema.to_dict()
    d["sequence"][0].update(max_len=2, on_overflow="truncate")
    s2 = FeatureSchema.from_dict(d)
    rows = [_row(0), _row(1, hist__item=[9], hist__action=[4], hist__dt=[0.5])]
    b = record_batch_to_batch(_table(s2, rows), s2)
    h = b.sequences["hist"]
    assert h.lengths.tolist() == [2, 1]
    assert h.ids["item"].tolist() == [5, 6, 9]  # oldest first: row 0 keeps its last two
    assert h.ids["action"].tolist() == [1, 2, 4]
    np.testing.assert_allclose(h.dense["dt"].numpy(), [0.2, 0.3, 0.5], rtol=1e-6)


def test_data_error_keeps_its_fields_through_pickle():
    import pickle

    e = pickle.loads(pickle.dumps(DataError("f.parquet", "negative id", "ad_id", 7)))
    assert (e.file, e.column, e.row, e.what) == ("f.parquet", "ad_id", 7, "negative id")
    assert str(e) == "f.parquet: column 'ad_id', row 7: negative id"


def test_columns_gather_equals_row_by_row_slices(schema):
    """gather (the loader's row mixing) on jagged columns = concatenating one-row slices in that order."""
    from opengem.data.parquet import Columns

    rows = [_row(0), _row(1, user_interests=[], hist__item=[], hist__action=[], hist__dt=[]),
            _row(2, hist__item=[9], hist__action=[4], hist__dt=[0.5]), _row(3)]
    cols = Columns.from_arrow(_table(schema, rows), schema)
    idx = np.array([2, 0, 3, 1, 2])
    got = cols.gather(idx)
    want = Columns.concat([cols.slice(i, i + 1) for i in idx])
    assert got.n == want.n == 5 and got.rows.tolist() == want.rows.tolist() == [2, 0, 3, 1, 2]
    for k in cols.scalars:
        np.testing.assert_array_equal(got.scalars[k], want.scalars[k])
    for k in cols.lists:
        for a, b in zip(got.lists[k], want.lists[k], strict=True):
            np.testing.assert_array_equal(a, b)


def test_row_group_reads_reuse_the_inspected_footer_until_the_file_changes(schema, tmp_path, monkeypatch):
    """A row group's read opens the file with the footer inspect_file parsed (no second parse); a file
    rewritten since (another size or modification time) is opened afresh, so the rows read are the new
    file's."""
    from opengem.data import parquet

    path = tmp_path / "a.parquet"
    write_parquet(schema, path, random_columns(schema, 90, first_id=0), row_group_size=40)
    info = parquet.inspect_file(path, schema)
    assert info.footer is not None and info.stamp == (path.stat().st_size, path.stat().st_mtime_ns)
    given: list[object] = []
    real = pq.ParquetFile

    def opened(*args, **kwargs):
        given.append(kwargs.get("metadata"))
        return real(*args, **kwargs)

    monkeypatch.setattr(parquet.pq, "ParquetFile", opened)
    (piece, start), = parquet.iter_row_group(info, 1, schema)
    assert start == 0 and piece.column("example_id").to_pylist() == list(range(40, 80))
    assert parquet.read_row_group(info, 2, schema).column("example_id").to_pylist() == list(range(80, 90))
    assert given == [info.footer, info.footer]
    given.clear()
    write_parquet(schema, path, random_columns(schema, 100, first_id=1000), row_group_size=40)
    (piece, _), = parquet.iter_row_group(info, 1, schema)
    assert given == [None] and piece.column("example_id").to_pylist() == list(range(1040, 1080))
    info = parquet.inspect_file(path, schema)
    given.clear()
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1))  # the same size, touched
    parquet.read_row_group(info, 0, schema)
    assert given == [None]
    assert info == parquet.FileInfo(str(path), [40, 40, 20])  # the footer is not part of a file's identity
