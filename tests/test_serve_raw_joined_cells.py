"""Raw serving of data whose log joins each list into one cell ("3^7^1"; the importer's ``separator``,
which ``--infer-schema`` finds in CSV and in Parquet text columns): a request gives such a value as the log
holds it, or as a list, and either scores as ``opengem predict`` does on the converted rows; a history
sharing an integer feature's vocabulary refuses a token that is not one."""

from __future__ import annotations

import csv
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from opengem.cli import main as cli_main
from opengem.serve.errors import BadRequest
from opengem.serve.predictor import Predictor

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.toml"
warnings.filterwarnings("ignore", category=FutureWarning)


def write_log(path: Path) -> list[dict[str, str]]:
    """A click log in CSV (every categorical column read as text) or Parquet (``ad`` an integer column, so
    the history sharing its vocabulary holds integers)."""
    rng = np.random.default_rng(2)
    rows = []
    for i in range(1200):
        history = rng.integers(0, 30, int(rng.integers(0, 6)))
        rows.append({"ts": str(1_700_000_000 + 60 * i), "user": f"u{int(rng.integers(0, 80))}",
                     "ad": str(int(rng.integers(0, 30))), "site": str(rng.choice(["news", "games", "shop"])),
                     "ad_history": "^".join(str(int(x)) for x in history),
                     "tags": " | ".join(rng.choice(["red", "blue", "big", "new"], int(rng.integers(0, 3)))),
                     "click": str(int(rng.random() < 0.3))})
    if path.suffix == ".parquet":
        ints = ("ts", "ad", "click")
        pq.write_table(pa.table({k: [int(r[k]) if k in ints else r[k] for r in rows] for k in rows[0]}), path)
        return rows
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return rows


@pytest.fixture(scope="module", params=["csv", "parquet"])
def served(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("joined")
    src = root / f"log.{request.param}"
    rows = write_log(src)
    data, run = root / "data", root / "run"
    assert cli_main(["convert", "table", "--src", str(src), "--label", "click", "--infer-schema",
                     "--time", "ts", "--split", "time", "--out", str(data)]) == 0
    assert cli_main(["train", "--config", str(TINY), "--data", str(data), "--out", str(run), "train.steps=4",
                     "train.progress=false", "train.final_eval=false", "train.threads=1"]) == 0
    assert cli_main(["predict", "--run", str(run), "--partitions", "@test", "--out",
                     str(root / "preds.parquet")]) == 0
    return rows, Predictor.load(run, "eager"), pq.read_table(root / "preds.parquet"), request.param


def _scores(p: Predictor, cands: list[dict]) -> np.ndarray:
    return np.asarray(p.score({"surface": "all", "candidates": cands})["scores"]["click"])


def test_joined_cells_score_as_predict_on_the_converted_rows(served):
    rows, p, preds, source = served
    spec = {s.name: s for s in p.encoder.table.spec.sequence}
    assert p.encoder.table.vocabs["ad"].values.type == (pa.int64() if source == "parquet" else pa.string())
    assert spec["ad_history"].separator == "^" and spec["ad_history"].share == "ad"  # an integer vocabulary
    assert spec["tags"].separator == "|" and not spec["tags"].share  # text
    raw = [rows[i] for i in preds["example_id"].to_pylist()]
    assert any(r["ad_history"] == "" for r in raw) and any("^" in r["ad_history"] for r in raw)
    joined = [{k: r[k] for k in ("user", "site", "ad_history", "tags")} | {"ad": int(r["ad"])} for r in raw]
    want = preds["click"].to_numpy()
    got = _scores(p, joined)
    assert got.shape == want.shape and np.abs(got - want).max() <= 1e-6
    # the same lists given as lists (ints or their text for the shared history) score the same
    as_lists = [c | {"ad_history": [int(x) for x in c["ad_history"].split("^") if x],
                     "tags": [t.strip() for t in c["tags"].split("|") if t.strip()]} for c in joined]
    assert np.abs(_scores(p, as_lists) - want).max() <= 1e-6
    as_text = [c | {"ad_history": [str(x) for x in c["ad_history"]]} for c in as_lists]
    assert np.abs(_scores(p, as_text) - want).max() <= 1e-6
    mixed = [c if i % 2 else joined[i] for i, c in enumerate(as_lists)]  # rows of both forms in one column
    assert np.abs(_scores(p, mixed) - want).max() <= 1e-6


def test_a_joined_token_is_read_as_the_shared_vocabulary_reads_its_values(served):
    """Text ids (CSV): a token the vocabulary lacks is out of vocabulary, as in the importer; integer ids
    (Parquet): a token that is not an integer is one line, as the importer refuses it."""
    _, p, _, source = served
    c = {"user": "u1", "ad": 3, "site": "news", "ad_history": "4^x7^1", "tags": "red"}
    if source == "csv":
        other = c | {"ad_history": "4^never^1"}
        assert len(set(_scores(p, [c, other]).tolist())) == 1
    else:
        with pytest.raises(BadRequest) as e:
            p.score({"surface": "all", "candidates": [c | {"ad_history": "2"}, c]})
        assert str(e.value) == ("feature 'ad_history': 'x7' in a joined cell (candidate 1) is not an "
                                "integer, as the values of 'ad', whose vocabulary it shares, are")
    with pytest.raises(BadRequest, match=r"feature 'tags' takes a list or a cell joined by '\|', got int"):
        p.score({"surface": "all", "candidates": [c | {"tags": 5}]})
