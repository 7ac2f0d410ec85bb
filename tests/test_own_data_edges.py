"""Own data at its edges (found by a session-54 bug hunt): a compressed source cut short in its header is
one line naming the file; new rows encoded with ``convert table --encoders`` (a test split and an empty
valid one) are evaluated with ``--partitions @test``; an import spec's values have their declared types
(``hash = "no"`` is not true) and embedding widths a bound, named with the file and key; a served request's
integer surface that is also another surface's name is refused, not scored on the wrong surface."""

from __future__ import annotations

import dataclasses
import gzip
import json
import re
from pathlib import Path

import pytest

from cli_helpers import one_error_line, run_cli
from opengem.data.adapters.infer import load_spec
from opengem.data.schema import FeatureSchema, SchemaError
from opengem.serve.encode import RequestEncoder
from opengem.serve.errors import BadRequest
from serve_helpers import hashed_tiny_schema
from test_readme_own_data import write_clicks

ROOT = Path(__file__).resolve().parents[1]


def test_a_gzip_cut_short_in_its_header_is_one_line(tmp_path: Path, capsys) -> None:  # type: ignore
    rows = "ts,user,click\n" + "".join(f"{i},u{i % 7},{i % 2}\n" for i in range(2000))
    full = gzip.compress(rows.encode())
    (tmp_path / "cut.csv.gz").write_bytes(full[:2000])  # the first 64 KiB read for the header ends early
    rc, err = run_cli(capsys, ["convert", "table", "--src", str(tmp_path / "cut.csv.gz"), "--label", "click",
                               "--infer-schema", "--split", "random", "--out", str(tmp_path / "d")])
    line = one_error_line(err, "convert")
    assert rc == 1 and "cut.csv.gz" in line and "cut short or corrupt" in line, line


def test_new_rows_through_the_encoders_are_evaluated_on_their_test_split(tmp_path: Path, capsys) -> None:  # type: ignore
    write_clicks(tmp_path / "clicks.csv", rows=1200)
    write_clicks(tmp_path / "day8.csv", rows=300)
    data, new, run = tmp_path / "mine", tmp_path / "mine-day8", tmp_path / "run"
    assert run_cli(capsys, ["convert", "table", "--src", str(tmp_path / "clicks.csv"), "--label", "click",
                            "--infer-schema", "--time", "ts", "--split", "time", "--out", str(data)])[0] == 0
    assert run_cli(capsys, ["train", "--config", str(ROOT / "configs" / "own.toml"), "--data", str(data),
                            "--out", str(run), "model.name=dlrm", "train.steps=4", "train.threads=1",
                            "train.progress=false"])[0] == 0
    assert run_cli(capsys, ["convert", "table", "--src", str(tmp_path / "day8.csv"), "--encoders", str(data),
                            "--out", str(new)])[0] == 0
    assert run_cli(capsys, ["evaluate", "--run", str(run), "--partitions", "@test"])[0] == 0
    own_test = (run / "eval-test.json").read_text()
    before = (run / "eval.json").read_text() if (run / "eval.json").exists() else None
    rc, err = run_cli(capsys, ["evaluate", "--run", str(run), "--data", str(new), "--partitions", "@test"])
    assert rc == 0, err
    out = json.loads((run / "eval-mine-day8-test.json").read_text())  # named by the dataset it read
    assert out["rows"] == 300 and out["partitions"] == ["test"]
    assert (run / "eval-test.json").read_text() == own_test  # the run's own test result is kept
    after = (run / "eval.json").read_text() if (run / "eval.json").exists() else None
    assert after == before  # the run's own default evaluation is not overwritten by other data's test split


SPEC = """name = "g"
labels = ["click"]
time = "ts"

[[sparse]]
name = "user"

[[sparse]]
name = "ad"
{extra}
"""


@pytest.mark.parametrize("extra,why", [
    ('hash = "no"', r"sparse\[1\]\.hash: expected true/false, got 'no'"),
    ("multi_valued = 1", r"sparse\[1\]\.multi_valued: expected true/false, got 1"),
    ("dim = -3", r"sparse\[1\]\.dim: 0 \(chosen from the vocabulary size\) or an embedding width up to 8192"),
    ("dim = 100000000000", r"sparse\[1\]\.dim: .* got 100000000000"),
    ("vocab = -1", r"sparse\[1\]\.vocab: 0 \(fitted\) or the ids' range, got -1"),
    ("name = 5", r"sparse\[1\]\.name: expected a string, got 5"),
])
def test_an_import_spec_value_of_the_wrong_type_or_size_names_file_and_key(tmp_path: Path, extra: str,
                                                                             why: str) -> None:
    path = tmp_path / "g.import.toml"
    path.write_text(SPEC.format(extra=extra).replace('name = "ad"\nname = 5', "name = 5"))
    with pytest.raises(SchemaError, match=why) as e:
        load_spec(path)
    assert str(e.value).startswith(str(path)), e.value


def test_a_schema_embedding_width_past_the_bound_is_refused_by_key(tmp_path: Path) -> None:
    text = (ROOT / "configs" / "schemas" / "tiny.toml").read_text()
    path = tmp_path / "wide.toml"
    path.write_text(text.replace("dim = 8", "dim = 100000000000", 1))
    with pytest.raises(SchemaError, match=r"dim: an embedding width in \[1, 8192\], got 100000000000"):
        FeatureSchema.load(path)


def test_an_integer_surface_that_is_also_a_surface_name_elsewhere_is_refused() -> None:
    """Surfaces named by numbers (a log's slot column holding 1 and 2): a client replaying the logged value
    as a JSON number must not silently get another surface's score."""
    base = hashed_tiny_schema()
    numbered = RequestEncoder(dataclasses.replace(base, surfaces=("1", "2")))
    with pytest.raises(BadRequest, match=r"surface 1 is ambiguous: .* send the name as a string \('1'\)"):
        numbered.surface_index(1)
    with pytest.raises(BadRequest, match="surface 2 is ambiguous"):
        numbered.surface_index(2)
    assert numbered.surface_index("1") == 0 and numbered.surface_index("2") == 1
    assert numbered.surface_index(0) == 0  # no surface is named "0": an index
    same = RequestEncoder(dataclasses.replace(base, surfaces=("0", "1")))  # names and indices agree
    assert same.surface_index(1) == 1 and same.surface_index("1") == 1


@pytest.mark.parametrize("header,rows,why", [
    ("ts,user,ad,click", ["2023-11-14 22:13:20,u1,5,0", "2023-11-14 22:14:20,u2,6,1",
                          "2023-13-45 99:00:00,u1,5,0", "2023-11-14 22:16:20,u3,7,1"],
     r"line 4, column 'ts' \(time\): '2023-13-45 99:00:00' is not a date-time such as"),
    ("ts,user,ad,click", ["1700000000,u1,5,0", "1700000060,u2,6,1", "yesterday,u1,5,0", "1700000180,u3,7,1"],
     r"line 4, column 'ts' \(time\): 'yesterday' is not an integer"),
    ("ts,user,ad,price,click", ["1,u1,5,1.0,0", "2,u2,6,2.0,1", "3,u1,5,1e200,0", "4,u3,7,3.0,1"],
     r"line 4, column 'price' \(dense\): 1e\+200 is past the range of the float32 values"),
])
def test_a_bad_time_or_a_dense_value_past_float32_is_named_by_its_line(tmp_path: Path, capsys, header: str,
                                                                       rows: list[str], why: str) -> None:
    src = tmp_path / "b.csv"
    src.write_text("\n".join([header, *rows]) + "\n")
    rc, err = run_cli(capsys, ["convert", "table", "--src", str(src), "--label", "click", "--infer-schema",
                               "--time", "ts", "--split", "random", "--out", str(tmp_path / "d")])
    err = "\n".join(x for x in err.splitlines() if not x.startswith("convert table: "))
    line = one_error_line(err, "convert")
    assert rc == 1 and re.search(rf"b\.csv: {why}", line), line


def test_an_id_past_a_declared_vocab_is_named_by_its_line(tmp_path: Path, capsys) -> None:  # type: ignore
    src = tmp_path / "v.csv"
    src.write_text("ts,user,ad,click\n1,u1,1,0\n2,u2,2,1\n3,u1,24,0\n4,u3,3,1\n")
    spec = tmp_path / "v.import.toml"
    spec.write_text('name = "v"\nlabels = ["click"]\ntime = "ts"\n\n[[sparse]]\nname = "user"\n\n'
                    '[[sparse]]\nname = "ad"\nvocab = 5\n')
    rc, err = run_cli(capsys, ["convert", "table", "--src", str(src), "--schema", str(spec), "--split",
                               "random", "--out", str(tmp_path / "d")])
    line = one_error_line(err, "convert")
    assert rc == 1 and "v.csv: line 4, column 'ad': id 24 outside the declared vocab [0, 5)" in line, line


def test_a_wrong_label_writes_no_inferred_spec(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """The run fails before the spec is written, so the corrected command needs no --force."""
    src = tmp_path / "l.csv"
    src.write_text("ts,user,ad,click\n1,u1,5,0\n2,u2,6,1\n3,u1,5,0\n4,u3,7,1\n")
    argv = ["convert", "table", "--src", str(src), "--infer-schema", "--time", "ts", "--split", "random",
            "--out", str(tmp_path / "d")]
    rc, err = run_cli(capsys, [*argv, "--label", "clik"])
    assert rc == 1 and "missing your column(s) clik (label)" in one_error_line(err, "convert")
    assert not (tmp_path / "d.import.toml").exists()
    assert run_cli(capsys, [*argv, "--label", "click"])[0] == 0


def test_a_header_only_source_says_it_has_no_rows(tmp_path: Path, capsys) -> None:  # type: ignore
    src = tmp_path / "h.csv"
    src.write_text("ts,user,click\n")
    for split in ("random", "time"):
        rc, err = run_cli(capsys, ["convert", "table", "--src", str(src), "--label", "click",
                                   "--infer-schema", "--time", "ts", "--split", split,
                                   "--out", str(tmp_path / f"d{split}")])
        err = "\n".join(x for x in err.splitlines() if not x.startswith("convert table: "))
        assert rc == 1 and "h.csv: no data rows" in one_error_line(err, "convert")


def test_a_served_dense_value_past_float32_is_named_as_sent() -> None:
    enc = RequestEncoder(hashed_tiny_schema())
    row = {"user_id": 7, "ad_id": 3, "ad_category": 1, "user_interests": [1, 2], "ad_quality": 0.5,
           "user_activity": -1.0, "hist__item": [4, 5], "hist__action": [0, 1], "hist__dt": [0.1, 0.2]}
    for value in (1e308, -3e39):
        shown = re.escape(f"{value:g}")
        with pytest.raises(BadRequest, match=rf"candidate 1: feature 'ad_quality': {shown} is past the"):
            enc.batch([{"surface": 0, "candidates": [row, {**row, "ad_quality": value}]}])
        with pytest.raises(BadRequest, match=rf"context: feature 'ad_quality': {shown} is past the"):
            enc.batch([{"surface": 0, "context": {"ad_quality": value},
                        "candidates": [{k: v for k, v in row.items() if k != "ad_quality"}]}])
    batch, _ = enc.batch([{"surface": 0, "candidates": [{**row, "ad_quality": 3e38}]}])  # in range
    assert batch.dense.isfinite().all()


def test_evaluate_says_why_a_folder_is_not_a_run_it_can_read(tmp_path: Path, capsys) -> None:  # type: ignore
    """A folder that does not exist, a version that is not published (RUN@3: no manifest) and an online run
    with none published each get a line that says so, not 'no config.toml' or 'no checkpoint' about a
    folder that has one (a published version is evaluated: tests/test_evaluate_versions.py)."""
    online = tmp_path / "on"
    (online / "versions" / "v0003").mkdir(parents=True)
    (online / "config.toml").write_text((ROOT / "configs" / "tiny.toml").read_text())
    for run, why in ((tmp_path / "nope", "nope: no such folder"),
                     (f"{online}@3", "no published version 3"),
                     (online, "an online run keeps its models as published versions")):
        rc, err = run_cli(capsys, ["evaluate", str(run)])
        line = one_error_line(err, "evaluate")
        assert rc == 1 and why in line, line


def test_a_served_id_past_int64_is_named_with_its_candidate() -> None:
    enc = RequestEncoder(hashed_tiny_schema())
    row = {"user_id": 7, "ad_id": 3, "ad_category": 1, "user_interests": [1, 2], "ad_quality": 0.5,
           "user_activity": -1.0, "hist__item": [4, 5], "hist__action": [0, 1], "hist__dt": [0.1, 0.2]}
    for key, value, shown in (("user_id", 2**63, 2**63), ("hist__item", [1, 2**64], 2**64),
                              ("user_id", -(2**63) - 1, -(2**63) - 1)):
        with pytest.raises(BadRequest, match=rf"candidate 1: feature '{key}': id {shown} is past the range"):
            enc.batch([{"surface": 0, "candidates": [row, {**row, key: value}]}])


def test_an_infinite_learning_rate_is_refused_by_key(tmp_path: Path, capsys) -> None:  # type: ignore
    rc, err = run_cli(capsys, ["train", "--config", str(ROOT / "configs" / "tiny.toml"), "--out",
                               str(tmp_path / "r"), "train.lr=inf"])
    assert rc == 2 and "train.lr = inf: must be a finite number" in one_error_line(err, "train")
    assert not (tmp_path / "r").exists()


def test_an_export_folder_given_as_data_is_named_as_one(tmp_path: Path) -> None:
    """Not 'no _COMPLETE marker ... mark it with opengem validate --mark-complete', which would make an
    export folder look like data."""
    from opengem.data.dataset import Dataset
    from opengem.errors import DatasetError

    export = tmp_path / "export"
    export.mkdir()
    (export / "manifest.json").write_text("{}")
    (export / "schema.toml").write_text((ROOT / "configs" / "schemas" / "tiny.toml").read_text())
    with pytest.raises(DatasetError, match="an exported model .opengem export., not a dataset"):
        Dataset(export)
    (export / "manifest.json").unlink()
    with pytest.raises(DatasetError, match="no _COMPLETE marker"):
        Dataset(export)
