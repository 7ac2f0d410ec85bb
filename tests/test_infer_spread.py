"""``--infer-schema`` proposes a history the log spreads over numbered columns (``hist_ad_0`` ..), with the
filler 0 as ``pad`` only where the sample lays it out as one, and leaves numbered columns that are not a
history alone (flags, floats, gaps, three columns); a filler in a numeric column is matched by value."""

from __future__ import annotations

import csv
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dmr_layout import COLUMNS, DATA, DMR, needs_dmr, real_event_counts
from opengem.cli import main as cli_main
from opengem.data.adapters.infer import SequenceSpec, SparseSpec, infer_share, load_spec
from opengem.data.adapters.infer_spread import find_spread
from opengem.data.adapters.vocab import gather_columns

WIDTH = 12  # more than 10, so that hist_ad_10 must sort after hist_ad_9
warnings.filterwarnings("ignore", category=FutureWarning)


def _text(values: list) -> pa.Array:
    return pa.array(["" if v is None else str(v) for v in values])


def test_numbered_id_columns_are_one_history_and_the_others_are_left_alone() -> None:
    n = 6
    cols: dict[str, list] = {}
    histories = [[5, 7], [], [3, 4, 8, 9, 2], [6]]
    for j in range(WIDTH):  # trailing filler 0
        cols[f"hist_ad_{j}"] = [h[j] if j < len(h) else 0 for h in histories]
    for j in range(n):  # flags, not ids
        cols[f"mask{j}"] = [int(j < len(h)) for h in histories]
    for j in range(1, n + 1):  # a week of spend
        cols[f"price_{j}"] = [1.5 * j] * len(histories)
    for j in (1, 2, 4, 5):  # a gap
        cols[f"x{j}"] = [j, j + 1, j + 2, j + 3]
    for j in range(1, 4):  # three columns
        cols[f"y{j}"] = [j, j + 1, j + 2, j + 3]
    for j in range(n):  # a real id 0 between two events: no filler to propose
        cols[f"z_{j}"] = [[4, 0, 5, 1, 2, 3][j], j + 1, j + 2, j + 3]
    for j in range(n):  # leading filler, under a name a column already has
        cols[f"brand{j}"] = [[0, 0, 0, 0, 8, 9][j], [0, 0, 0, 0, 0, 7][j], j + 10, j + 20]
    cols["brand"] = [8, 7, 10, 20]
    table = pa.table(cols)
    sample = pa.record_batch({k: _text(v.to_pylist()) for k, v in zip(table.column_names, table.columns)})
    found = {name: (columns, pad) for name, columns, pad in find_spread(table.schema, sample, {"brand"})}
    assert found == {"hist_ad": ([f"hist_ad_{j}" for j in range(WIDTH)], "0"),
                     "z": ([f"z_{j}" for j in range(n)], ""),
                     "brand_history": ([f"brand{j}" for j in range(n)], "0")}
    # without a sample (LIBSVM has none) the names and types decide, and no filler is proposed
    found = {name: pad for name, _, pad in find_spread(table.schema, None, set())}
    assert found == {"hist_ad": "", "mask": "", "z": "", "brand_history": ""}


def _write_log(path: Path) -> list[dict]:
    rng = np.random.default_rng(3)
    rows = []
    for i in range(600):
        history = [int(x) for x in rng.integers(1, 40, int(rng.integers(0, WIDTH + 1)))]
        row = {"ts": 1_700_000_000 + 60 * i, "user": f"u{int(rng.integers(0, 50))}",
               "ad": int(rng.integers(1, 40)), "click": int(rng.random() < 0.3)}
        row.update({f"hist_ad_{j}": history[j] if j < len(history) else 0 for j in range(WIDTH)})
        row["_history"] = history
        rows.append(row)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[k for k in rows[0] if k != "_history"], extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return rows


def test_an_inferred_spread_history_converts_to_the_logged_histories(tmp_path) -> None:
    src = tmp_path / "log.csv"
    rows = _write_log(src)
    out = tmp_path / "out"
    assert cli_main(["convert", "table", "--src", str(src), "--label", "click", "--time", "ts",
                     "--infer-schema", "--out", str(out), "--min-count", "1"]) == 0
    spec = load_spec(tmp_path / "out.import.toml")
    (q,) = spec.sequence
    assert (q.name, q.columns, q.pad, q.share, q.max_len) == (
        "hist_ad", [f"hist_ad_{j}" for j in range(WIDTH)], "0", "ad", WIDTH)
    assert {s.name for s in spec.sparse} == {"user", "ad"} and not spec.dense
    seen = 0
    for split in ("train", "valid", "test"):
        t = pq.read_table(out / split / "part-00000.parquet")
        by_id = dict(zip(t.column("example_id").to_pylist(), t.column("hist_ad__id").to_pylist()))
        ads = dict(zip(t.column("example_id").to_pylist(), t.column("ad").to_pylist()))
        for eid, events in by_id.items():
            assert len(events) == len(rows[eid]["_history"]), eid
            seen += 1
        # one vocabulary: a history event equal to the row's ad has the row's ad id
        for eid, events in by_id.items():
            for raw, enc in zip(rows[eid]["_history"], events):
                if raw == rows[eid]["ad"]:
                    assert enc == ads[eid]
    assert seen == len(rows)


def test_a_history_shares_a_feature_whose_few_sampled_values_are_among_its_many_events() -> None:
    """A long history holds more distinct values than a sample's ads: the overlap is a share of the
    smaller set, so every ad category among the events shares, though most events are not among the ads."""
    sample = pa.record_batch({"cate_id": ["1", "2", "1", "2"],
                              "cate_history": ["1^2^30^31^32", "33^34^35^1", "36^37^38", "39^2"]})
    got = infer_share(sample, SequenceSpec("cate_history", separator="^"), [SparseSpec("cate_id")])
    assert got == "cate_id"
    sample = pa.record_batch({"cate_id": ["1", "2", "1", "2"],
                              "cate_history": ["30^31^32", "33^34^35", "36^37^38", "39^40"]})
    assert infer_share(sample, SequenceSpec("cate_history", separator="^"), [SparseSpec("cate_id")]) == ""


@pytest.mark.parametrize("columns, pad, want", [
    ([pa.array([1.0, 0.0, None]), pa.array([0.0, 2.5, 3.0])], "0", [[1.0], [2.5], [3.0]]),  # 0.0 is 0
    ([pa.array([1, 0, None]), pa.array([0, 2, 3])], "0.0", [[1], [2], [3]]),
    ([pa.array([1, 0, None]), pa.array([0, 2, 3])], "x", [[1, 0], [0, 2], [3]]),  # no numeric cell is "x"
    ([pa.array([1, 0], pa.uint8()), pa.array([0, 2], pa.uint8())], "-1", [[1, 0], [0, 2]]),  # out of range
    ([pa.array(["1", " 0"]), pa.array(["0", "2"])], "0", [["1"], ["2"]]),
])
def test_the_filler_is_matched_by_value_in_a_numeric_column(columns, pad, want) -> None:
    assert gather_columns(columns, pad).to_pylist() == want


@needs_dmr
def test_the_taobao_dmr_sample_infers_its_spread_histories(tmp_path) -> None:
    names = COLUMNS
    out = tmp_path / "dmr"
    assert cli_main(["convert", "table", "--src", str(DMR), "--format", "csv", "--columns", ",".join(names),
                     "--label", "label", "--surface", "pid", "--infer-schema", "--out", str(out),
                     "--min-count", "1", "--no-shuffle"]) == 0
    spec = load_spec(tmp_path / "dmr.import.toml")
    got = {q.name: (q.columns, q.pad, q.share) for q in spec.sequence}
    assert got == {"btag": (names[0:50], "0", ""), "cate": (names[50:100], "0", "cate_id"),
                   "brand_history": (names[100:150], "0", "brand")}
    assert {f"mask{j}" for j in range(50)} <= {s.name for s in spec.sparse}  # flags stay features
    # the three are attributes of the same events (0 in the same slots): one group, headed by the category
    assert {q.name: q.group for q in spec.sequence} == {"btag": "cate", "cate": "", "brand_history": "cate"}
    real = real_event_counts()
    for split in ("train", "valid", "test"):
        t = pq.read_table(out / split / "part-00000.parquet")
        for eid, cate, brand in zip(t.column("example_id").to_pylist(), t.column("cate__id").to_pylist(),
                                    t.column("cate__brand_history").to_pylist()):
            assert len(cate) == len(brand) == real[eid], eid


def test_numbered_separate_fields_are_not_a_history() -> None:
    """Criteo's layout: counts I1..I13 and categorical fields C1..C26, each its own feature. Their cells are
    empty here and there inside a row, and the C fields' values come from separate vocabularies, so no
    history is proposed; the same columns with each row's values in one run of columns and shared values
    (a history, shorter ones padded at the end) are one."""
    rng = np.random.default_rng(0)
    rows, n = 200, 8
    counts = rng.integers(0, 50, (rows, n)).astype(str).astype(object)
    counts[rng.random((rows, n)) < 0.3] = ""  # missing counts, anywhere in the row
    fields = np.array([[f"{k:02d}{rng.integers(1 << 30):08x}" for k in range(n)] for _ in range(rows)])
    cols = {f"I{k + 1}": counts[:, k].tolist() for k in range(n)}
    cols |= {f"C{k + 1}": fields[:, k].tolist() for k in range(n)}
    lengths = rng.integers(0, n + 1, rows)
    items = rng.integers(1, 400, (rows, n))
    cols |= {f"h{k + 1}": [str(items[r, k]) if k < lengths[r] else "" for r in range(rows)] for k in range(n)}
    table = pa.table({k: pa.array(v, pa.string()) for k, v in cols.items()})
    found = {name: columns for name, columns, _ in find_spread(table.schema, table.to_batches()[0], set())}
    assert found == {"h": [f"h{k + 1}" for k in range(n)]}


CRITEO = DATA / "criteo_kaggle_head" / "dev.tsv"


@pytest.mark.skipif(not CRITEO.exists(), reason=f"real data not found at {CRITEO} (set $OPENGEM_DATA or "
                                                 "provide ../shared/data)")
def test_the_criteo_head_infers_no_history(tmp_path) -> None:
    names = ["label", *(f"I{k}" for k in range(1, 14)), *(f"C{k}" for k in range(1, 27))]
    assert cli_main(["convert", "table", "--src", str(CRITEO), "--columns", ",".join(names), "--label",
                     "label", "--infer-schema", "--split", "random", "--out", str(tmp_path / "c")]) == 0
    spec = load_spec(tmp_path / "c.import.toml")
    assert spec.sequence == [] and {s.name for s in spec.sparse} >= {f"C{k}" for k in range(1, 27)}
