"""A history the log spreads over one column per event (DMR's Taobao layout: ``cate_his`` in 50 columns, 0
where the history is shorter), read by the import spec's ``columns`` (and ``pad``): it converts to exactly
the data the same history joined into one cell converts to, a served request gives it as logged, and the spec
refuses what cannot be meant."""

from __future__ import annotations

import csv
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dmr_layout import COLUMNS, DMR, needs_dmr, real_event_counts
from opengem.cli import main as cli_main
from opengem.data.adapters.infer import load_spec
from opengem.data.schema import SchemaError
from opengem.serve.predictor import Predictor

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.toml"
WIDTH = 6
warnings.filterwarnings("ignore", category=FutureWarning)

SPEC = """name = "wide"
labels = ["click"]
time = "ts"
[[sparse]]
name = "user"
[[sparse]]
name = "ad"
[[sequence]]
name = "ad_history"
share = "ad"
match_recent = 2
{how}
"""
WIDE = "columns = [" + ", ".join(f'"h{j}"' for j in range(WIDTH)) + ']\npad = "0"'
JOINED = 'separator = "^"'


def write_log(path: Path) -> list[dict]:
    """Each row's history (ad ids 1..30, oldest first) both joined into ``ad_history`` and spread over
    h0..h5, the unused columns holding 0 (every third row instead leaves them empty, in CSV)."""
    rng = np.random.default_rng(5)
    rows = []
    for i in range(900):
        history = [int(x) for x in rng.integers(1, 31, int(rng.integers(0, WIDTH + 1)))]
        filler = "" if path.suffix == ".csv" and i % 3 == 0 else 0
        row = {"ts": 1_700_000_000 + 60 * i, "user": f"u{int(rng.integers(0, 60))}",
               "ad": int(rng.integers(1, 31)), "ad_history": "^".join(map(str, history)),
               "click": int(rng.random() < 0.3)}
        row.update({f"h{j}": history[j] if j < len(history) else filler for j in range(WIDTH)})
        rows.append(row)
    if path.suffix == ".parquet":
        pq.write_table(pa.table({k: [r[k] for r in rows] for k in rows[0]}), path)
    else:
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return rows


def convert(src: Path, how: str, out: Path) -> None:
    """Convert ``src`` with the spec reading the history ``how``; the other form's columns are ignored."""
    ignore = [f"h{j}" for j in range(WIDTH)] if how == JOINED else ["ad_history"]
    spec = out.with_suffix(".toml")
    spec.write_text(SPEC.replace('time = "ts"', f'time = "ts"\nignore = {toml_list(ignore)}').format(how=how))
    assert cli_main(["convert", "table", "--src", str(src), "--schema", str(spec), "--split", "time",
                     "--out", str(out)]) == 0


def toml_list(names: list[str]) -> str:
    return "[" + ", ".join(f'"{n}"' for n in names) + "]"


@pytest.fixture(scope="module", params=["csv", "parquet"])
def converted(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("wide")
    src = root / f"log.{request.param}"
    rows = write_log(src)
    convert(src, WIDE, root / "wide")
    convert(src, JOINED, root / "joined")
    return root, rows


def test_a_history_spread_over_columns_converts_as_the_same_history_joined(converted):
    root, rows = converted
    assert (root / "wide" / "schema.toml").read_text() == (root / "joined" / "schema.toml").read_text()
    for split in ("train", "valid", "test"):
        wide = pq.read_table(root / "wide" / split / "part-00000.parquet")
        joined = pq.read_table(root / "joined" / split / "part-00000.parquet")
        assert wide.num_rows and wide.equals(joined), split
    # and the events are the rows' histories: lengths as logged, empty and 0 cells not events
    test = pq.read_table(root / "wide" / "test" / "part-00000.parquet")
    lengths = [len(h) for h in test.column("ad_history__id").to_pylist()]
    want = [len(rows[i]["ad_history"].split("^")) if rows[i]["ad_history"] else 0
            for i in test.column("example_id").to_pylist()]
    assert lengths == want and 0 in lengths and WIDTH in lengths


def _trained(root: Path) -> Path:
    """A few steps of the tiny recipe on the wide conversion (once per source format)."""
    run = root / "run"
    if not run.exists():
        assert cli_main(["train", "--config", str(TINY), "--data", str(root / "wide"), "--out", str(run),
                         "train.steps=4", "train.progress=false", "train.final_eval=false",
                         "train.threads=1"]) == 0
    return run


def test_a_served_request_gives_the_spread_history_as_logged(converted):
    root, rows = converted
    run = _trained(root)
    assert cli_main(["predict", "--run", str(run), "--partitions", "@test", "--out",
                     str(root / "preds.parquet")]) == 0
    preds = pq.read_table(root / "preds.parquet")
    p = Predictor.load(run, "eager")
    raw = [rows[i] for i in preds["example_id"].to_pylist()]
    cands = [{k: r[k] for k in ("user", "ad", *(f"h{j}" for j in range(WIDTH)))} for r in raw]
    got = np.asarray(p.score({"surface": "all", "candidates": cands})["scores"]["click"])
    assert np.abs(got - preds["click"].to_numpy()).max() <= 1e-6
    # ... or as one list of its events under the history's name (a feature store's form), per candidate
    as_list = [{"user": r["user"], "ad": r["ad"], "ad_history": _events(r)} for r in raw]
    got = np.asarray(p.score({"surface": "all", "candidates": as_list})["scores"]["click"])
    assert np.abs(got - preds["click"].to_numpy()).max() <= 1e-6
    # ... or in the context, for all the candidates of one user
    r = raw[0]
    one = p.score({"surface": "all", "context": {"user": r["user"], "ad_history": _events(r)},
                   "candidates": [{"ad": r["ad"]}, {"ad": raw[1]["ad"]}]})["scores"]["click"]
    logged = {f"h{j}": r[f"h{j}"] for j in range(WIDTH)}
    spread = p.score({"surface": "all", "context": {"user": r["user"], **logged},
                      "candidates": [{"ad": r["ad"]}, {"ad": raw[1]["ad"]}]})["scores"]["click"]
    assert abs(one[0] - preds["click"].to_numpy()[0]) <= 1e-6 and np.allclose(one, spread, atol=1e-6)


def _events(row: dict) -> list:
    """A logged row's history as the list of its events (its joined cell split, ids as integers)."""
    return [int(x) for x in row["ad_history"].split("^")] if row["ad_history"] else []


def test_a_served_spread_history_is_given_one_way(converted):
    root, rows = converted
    run = _trained(root)
    from opengem.serve.errors import BadRequest

    p = Predictor.load(run, "eager")
    r = rows[0]
    with pytest.raises(BadRequest, match=r"history 'ad_history' is given as a list and as its column 'h0'"):
        p.score({"surface": "all", "context": {"ad_history": [1, 2]},
                 "candidates": [{"user": r["user"], "ad": r["ad"], "h0": 1}]})
    with pytest.raises(BadRequest, match=r"feature 'ad_history' takes a list"):
        p.score({"surface": "all", "candidates": [{"user": r["user"], "ad": r["ad"], "ad_history": 3}]})
    with pytest.raises(BadRequest, match=r"candidate 1: feature 'h0' gives 'ad_history' in the other form "
                                         r"than the context or candidate 0: give it one way"):
        p.score({"surface": "all", "candidates": [{"user": r["user"], "ad": r["ad"], "ad_history": [3]},
                                                  {"user": r["user"], "ad": r["ad"],
                                                   **{f"h{j}": 0 for j in range(WIDTH)}}]})


@pytest.mark.parametrize("how, error", [
    (WIDE + '\nseparator = "^"', r"sequence\[0\] \('ad_history'\) has both columns and a separator"),
    (JOINED + '\npad = "0"', r"sequence\[0\]\.pad: a string, and only with columns"),
    ('columns = ["h0", "user"]', r"column 'user' is used twice \(sparse and sequence\)"),
    ('columns = ["h0", ""]', r"sequence\[0\]\.columns must be a list of column names"),
])
def test_the_spec_refuses_what_a_spread_history_cannot_mean(tmp_path, how, error):
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC.format(how=how))
    with pytest.raises(SchemaError, match=error):
        load_spec(spec)
    spec.write_text(SPEC.replace('name = "ad_history"', 'name = "user"').format(how=WIDE))
    with pytest.raises(SchemaError, match=r"\('user'\) is spread over columns, so its name must not be a "
                                          r"column the spec reads"):
        load_spec(spec)


def test_a_missing_column_of_a_spread_history_is_named(tmp_path, capsys):
    src = tmp_path / "log.csv"
    write_log(src)
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC.format(how=WIDE.replace('"h5"', '"h9"')))
    out = tmp_path / "o"
    assert cli_main(["convert", "table", "--src", str(src), "--schema", str(spec), "--out", str(out)]) != 0
    err = capsys.readouterr().err
    assert "missing your column(s) h9 (sequence)" in err and "Traceback" not in err and not out.exists()


@needs_dmr
def test_the_taobao_dmr_sample_reads_its_fifty_column_histories(tmp_path):
    """The real layout: 267 headerless columns, the category and brand histories in columns 50-99 and
    100-149, their real slots marked by the mask columns 150-199 and the others holding 0."""
    names = COLUMNS
    spec = tmp_path / "dmr.toml"
    spec.write_text(f"""name = "taobao_dmr"
labels = ["label"]
surface = "pid"
ignore = {toml_list(names[:50] + names[150:250])}
[[sparse]]
name = "uid"
[[sparse]]
name = "cate_id"
[[sparse]]
name = "brand"
[[dense]]
name = "price"
[[sequence]]
name = "cate_his"
columns = {toml_list(names[50:100])}
pad = "0"
share = "cate_id"
match_recent = 8
[[sequence]]
name = "brand_his"
columns = {toml_list(names[100:150])}
pad = "0"
share = "brand"
""")
    out = tmp_path / "dmr"
    assert cli_main(["convert", "table", "--src", str(DMR), "--format", "csv", "--columns", ",".join(names),
                     "--schema", str(spec), "--out", str(out), "--min-count", "1", "--no-shuffle"]) == 0
    real = real_event_counts()
    seen = 0
    for split in ("train", "valid", "test"):
        t = pq.read_table(out / split / "part-00000.parquet")
        for eid, cate in zip(t.column("example_id").to_pylist(), t.column("cate_his__id").to_pylist()):
            assert len(cate) == real[eid], eid
            seen += 1
    assert seen == len(real) == 500 and min(real.values()) < 50 == max(real.values())


def test_columns_of_a_spread_history_whose_types_do_not_convert_are_one_line(tmp_path, capsys):
    """Parquet h0 holds integers, h1 text that is not one: one line naming the file and the columns."""
    src = tmp_path / "log.parquet"
    pq.write_table(pa.table({"user": ["u1", "u2"] * 20, "ad": [3, 4] * 20, "h0": [1, 2] * 20,
                             "h1": ["x", "5"] * 20, "click": [0, 1] * 20}), src)
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC.replace('time = "ts"\n', "").format(how='columns = ["h0", "h1"]'))
    out = tmp_path / "o"
    assert cli_main(["convert", "table", "--src", str(src), "--schema", str(spec), "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "log.parquet: columns h0, h1 (the history 'ad_history') hold values" in err[0]
    assert not out.exists()

