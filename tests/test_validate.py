from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from opengem.cli import main
from opengem.data.commit import mark_complete
from opengem.data.parquet import CanonicalWriter
from opengem.data.schema import FeatureSchema
from parquet_helpers import random_columns

TINY = Path(__file__).resolve().parents[1] / "configs" / "schemas" / "tiny.toml"


@pytest.fixture
def data(tmp_path) -> Path:
    schema = FeatureSchema.load(TINY)
    schema.save(tmp_path / "schema.toml")
    for day in range(2):
        part = tmp_path / f"day={day:03d}"
        part.mkdir()
        cols = random_columns(schema, 40, seed=day, first_id=100 * day)
        cols[schema.time_column] += 86400 * day  # each day later than the one before (validate checks it)
        with CanonicalWriter(schema, part / "part-00000.parquet", row_group_size=16) as w:
            w.write(cols)
    mark_complete(tmp_path)  # assembled by hand: marked, or every reader (and validate) refuses it
    return tmp_path


def test_valid_dataset_passes_with_one_line(data, capsys):
    assert main(["validate", "--data", str(data)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("OK: 2 file(s), 80 rows")


def test_every_problem_is_listed_with_file_column_row(data, capsys):
    path = data / "day=001" / "part-00000.parquet"
    t = pq.read_table(path)
    ids = t.column("ad_id").to_pylist()
    ids[3], ids[35] = -1, 999
    i = t.column_names.index("ad_id")
    t = t.set_column(i, t.schema.field(i), pa.array(ids, pa.int64()))
    pq.write_table(t, path, row_group_size=16)
    (data / "day=000" / "part-00001.parquet").write_bytes(b"PAR1 garbage")
    assert main(["validate", "--data", str(data)]) == 1
    out = capsys.readouterr().out
    assert "day=001/part-00000.parquet: column 'ad_id' row 3: negative id" in out
    assert "day=001/part-00000.parquet: column 'ad_id' row 35: id beyond vocabulary 50" in out
    assert "part-00001.parquet" in out and "corrupt or truncated" in out
    # the partition filter limits what is checked
    assert main(["validate", "--data", str(data), "--partitions", "day=000"]) == 1
    out = capsys.readouterr().out
    assert "day=001" not in out and "corrupt" in out


def test_max_problems_limits_listing_not_counting(data, capsys):
    path = data / "day=000" / "part-00000.parquet"
    t = pq.read_table(path)
    i = t.column_names.index("surface")
    t = t.set_column(i, t.schema.field(i), pa.array([7] * t.num_rows, pa.int32()))
    pq.write_table(t, path)
    assert main(["validate", "--data", str(data), "--max-problems", "5"]) == 1
    out = capsys.readouterr().out
    assert out.count("surface out of range") == 5 + 1  # five listed rows + the summary count line
    assert "35 more problem(s)" in out and ": 40" in out


def test_explicit_schema_and_missing_data(data, tmp_path, capsys):
    assert main(["validate", "--data", str(data), "--schema", str(TINY)]) == 0
    assert main(["validate", "--data", str(tmp_path / "nope")]) == 1  # a data error (issue 10 section 5)
    err = capsys.readouterr().err
    assert err.startswith("opengem validate: error: ") and "not found" in err
