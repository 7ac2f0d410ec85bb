"""A history's events with more than one attribute (a DIN log's ``hist_cate`` beside ``hist_item``; DMR's
brand and behaviour type beside the category), imported as one sequence group with one field per attribute
(the import spec's ``group``): each attribute converts as it would alone, a row whose attributes disagree on
the number of events is one line naming it, the spec refuses what a group cannot mean, and a served request
scores as ``opengem predict``."""

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
from opengem.data.adapters.infer import SequenceSpec, load_spec
from opengem.data.adapters.infer_group import infer_groups
from opengem.data.schema import FeatureSchema, SchemaError
from opengem.serve.errors import BadRequest
from opengem.serve.predictor import Predictor

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.toml"
warnings.filterwarnings("ignore", category=FutureWarning)

SPEC = """name = "din"
labels = ["click"]
time = "ts"
[[sparse]]
name = "user"
[[sparse]]
name = "item"
[[sparse]]
name = "cate"
[[sequence]]
name = "hist_item"
separator = "^"
share = "item"
match_recent = 2
[[sequence]]
name = "hist_cate"
separator = "^"
share = "cate"
match_recent = 2
{group}
"""


def write_log(path: Path, broken_row: int = -1) -> list[dict]:
    """A DIN-style log: each row's history of items and, aligned with it, the items' categories."""
    rng = np.random.default_rng(11)
    cate = {i: i % 7 + 1 for i in range(1, 41)}
    rows = []
    for i in range(800):
        h = [int(x) for x in rng.integers(1, 41, int(rng.integers(0, 7)))]
        ad = int(rng.integers(1, 41))
        cates = [cate[x] for x in h] + ([3] if i == broken_row else [])
        rows.append({"ts": 1_700_000_000 + 60 * i, "user": f"u{int(rng.integers(0, 50))}", "item": ad,
                     "cate": cate[ad], "hist_item": "^".join(map(str, h)),
                     "hist_cate": "^".join(map(str, cates)), "click": int(rng.random() < 0.3)})
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return rows


def convert(src: Path, spec_text: str, out: Path) -> int:
    spec = out.with_suffix(".toml")
    spec.write_text(spec_text)
    return cli_main(["convert", "table", "--src", str(src), "--schema", str(spec), "--split", "time",
                     "--out", str(out), "--min-count", "1"])


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("group")
    rows = write_log(root / "log.csv")
    assert convert(root / "log.csv", SPEC.format(group='group = "hist_item"'), root / "grouped") == 0
    assert convert(root / "log.csv", SPEC.format(group=""), root / "apart") == 0
    return root, rows


def test_a_grouped_history_is_one_group_whose_fields_convert_as_each_alone(converted):
    root, rows = converted
    schema = FeatureSchema.load(root / "grouped" / "schema.toml")
    (group,) = schema.sequences
    assert group.name == "hist_item" and [f.name for f in group.fields] == ["id", "hist_cate"]
    assert [f.table for f in group.fields] == ["item", "cate"]  # each attribute shares its feature's table
    assert [(m.sequence, m.field, m.feature) for m in schema.match_features] == [
        ("hist_item", "id", "item"), ("hist_item", "hist_cate", "cate")]
    for split in ("train", "valid", "test"):
        grouped = pq.read_table(root / "grouped" / split / "part-00000.parquet")
        apart = pq.read_table(root / "apart" / split / "part-00000.parquet")
        assert grouped.num_rows == apart.num_rows > 0
        assert grouped.column("hist_item__id").equals(apart.column("hist_item__id"))
        assert grouped.column("hist_item__hist_cate").equals(apart.column("hist_cate__id"))
        assert "hist_cate__id" not in grouped.column_names


def test_a_row_whose_attributes_disagree_on_its_events_is_named(tmp_path, capsys):
    write_log(tmp_path / "log.csv", broken_row=123)
    out = tmp_path / "o"
    assert convert(tmp_path / "log.csv", SPEC.format(group='group = "hist_item"'), out) == 1
    err = capsys.readouterr().err
    assert "log.csv: line 125, column 'hist_cate' (sequence in the group 'hist_item') holds" in err
    assert err.count("\n") == 1 and "Traceback" not in err and not out.exists()


@pytest.mark.parametrize("group, error", [
    ('group = "nope"', r"sequence\[1\]\.group: 'nope' is not the name of another \[\[sequence\]\] of the "
                       r"spec outside any group \(hist_item\)"),
    ('group = "hist_cate"', r"sequence\[1\]\.group: 'hist_cate' is not the name of another"),
    ('group = "user"', r"sequence\[1\]\.group: 'user' is not the name of another"),
])
def test_the_spec_refuses_a_group_it_cannot_mean(tmp_path, group, error):
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC.format(group=group))
    with pytest.raises(SchemaError, match=error):
        load_spec(spec)
    # a chain: a grouped history cannot head another group
    chain = SPEC.format(group='group = "hist_item"') + '[[sequence]]\nname = "hist_x"\ngroup = "hist_cate"\n'
    spec.write_text(chain)
    with pytest.raises(SchemaError, match=r"sequence\[2\]\.group: 'hist_cate' is not the name of another"):
        load_spec(spec)


def test_a_served_request_gives_each_attribute_as_logged(converted):
    root, rows = converted
    run = root / "run"
    assert cli_main(["train", "--config", str(TINY), "--data", str(root / "grouped"), "--out", str(run),
                     "train.steps=4", "train.progress=false", "train.final_eval=false",
                     "train.threads=1"]) == 0
    assert cli_main(["predict", "--run", str(run), "--partitions", "@test", "--out",
                     str(root / "preds.parquet")]) == 0
    preds = pq.read_table(root / "preds.parquet")
    p = Predictor.load(run, "eager")
    raw = [rows[i] for i in preds["example_id"].to_pylist()]
    cands = [{k: r[k] for k in ("user", "item", "cate", "hist_item", "hist_cate")} for r in raw]
    got = np.asarray(p.score({"surface": "all", "candidates": cands})["scores"]["click"])
    assert np.abs(got - preds["click"].to_numpy()).max() <= 1e-6
    # a candidate whose attributes disagree on its events is named as a candidate, not a file's row
    cands[2] = {**cands[2], "hist_cate": cands[2]["hist_cate"] + "^3" if cands[2]["hist_cate"] else "3"}
    with pytest.raises(BadRequest, match=r"^cannot encode the request's values: request: candidate 2, column "
                                         r"'hist_cate' \(sequence in the group 'hist_item'\) holds"):
        p.score({"surface": "all", "candidates": cands})


def test_inference_groups_histories_whose_event_counts_agree_row_for_row(tmp_path):
    write_log(tmp_path / "log.csv")
    out = tmp_path / "o"
    assert cli_main(["convert", "table", "--src", str(tmp_path / "log.csv"), "--label", "click", "--time",
                     "ts", "--infer-schema", "--out", str(out), "--min-count", "1"]) == 0
    spec = load_spec(tmp_path / "o.import.toml")
    assert {q.name: (q.share, q.group) for q in spec.sequence} == {"hist_item": ("item", ""),
                                                                   "hist_cate": ("cate", "hist_item")}
    assert [g.name for g in FeatureSchema.load(out / "schema.toml").sequences] == ["hist_item"]


@pytest.mark.parametrize("a, b, grouped", [
    (["1^2", "3", "", "4^5^6"], ["7^8", "9", "", "1^2^3"], True),
    (["1^2", "3", "", "4^5^6"], ["7^8", "9^1", "", "1^2^3"], False),  # one row disagrees
    (["1^2", "3^4", "5^6", "7^8"], ["7^8", "9^1", "2^3", "1^2"], False),  # always full: alignment untold
])
def test_inference_groups_only_what_the_sample_shows_aligned(a, b, grouped):
    sample = pa.record_batch({"hist_a": a, "hist_b": b})
    seqs = [SequenceSpec("hist_a", separator="^"), SequenceSpec("hist_b", separator="^")]
    infer_groups(sample, seqs)
    assert [q.group for q in seqs] == (["", "hist_a"] if grouped else ["", ""])


@needs_dmr
def test_the_taobao_dmr_sample_groups_category_brand_and_behaviour(tmp_path):
    """The real layout: category, brand and behaviour type of each event in columns 50-99, 100-149 and
    0-49, 0 in the same slots of all three where the history is shorter."""
    names = COLUMNS

    def cols(k: int) -> str:
        return "[" + ", ".join(f'"{n}"' for n in names[50 * k:50 * k + 50]) + "]"

    spec = tmp_path / "dmr.toml"
    spec.write_text(f"""name = "taobao_dmr"
labels = ["label"]
surface = "pid"
ignore = [{", ".join(f'"{n}"' for n in names[150:250])}]
[[sparse]]
name = "uid"
[[sparse]]
name = "cate_id"
[[sparse]]
name = "brand"
[[sequence]]
name = "behaviour"
columns = {cols(1)}
pad = "0"
share = "cate_id"
[[sequence]]
name = "brand_of_event"
columns = {cols(2)}
pad = "0"
share = "brand"
group = "behaviour"
[[sequence]]
name = "btag"
columns = {cols(0)}
pad = "0"
group = "behaviour"
""")
    out = tmp_path / "dmr"
    assert cli_main(["convert", "table", "--src", str(DMR), "--format", "csv", "--columns", ",".join(names),
                     "--schema", str(spec), "--out", str(out), "--min-count", "1", "--no-shuffle"]) == 0
    schema = FeatureSchema.load(out / "schema.toml")
    assert [(g.name, [f.name for f in g.fields]) for g in schema.sequences] == [
        ("behaviour", ["id", "brand_of_event", "btag"])]
    real = real_event_counts()
    for split in ("train", "valid", "test"):
        t = pq.read_table(out / split / "part-00000.parquet")
        for eid, *lists in zip(t.column("example_id").to_pylist(), t.column("behaviour__id").to_pylist(),
                               t.column("behaviour__brand_of_event").to_pylist(),
                               t.column("behaviour__btag").to_pylist()):
            assert [len(x) for x in lists] == [real[eid]] * 3, eid
