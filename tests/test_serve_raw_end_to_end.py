"""Issue 16, end to end through the CLI: a CSV -> ``opengem convert table`` (which saves its fitted encoders)
-> ``opengem train`` -> ``opengem export`` -> ``Predictor.load(DIR)`` scoring the *raw* CSV rows equals
``opengem predict`` on the converted rows, unseen values and missing numbers included; a changed
vocabulary file is refused, in the artifact and in the dataset folder."""

from __future__ import annotations

import csv
import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from opengem.bench import serve_bench
from opengem.cli import main as cli_main
from opengem.data.adapters.common import AdapterError
from opengem.data.adapters.encoders_io import ENCODERS_FILE, VOCAB_DIR, read_encoders
from opengem.data.dataset import Dataset
from opengem.serve.artifact import MANIFEST
from opengem.serve.errors import ArtifactError
from opengem.serve.export import dataset_encoding
from opengem.serve.predictor import Predictor

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.toml"
ROWS = 1200
warnings.filterwarnings("ignore", category=FutureWarning)


def write_clicks(path: Path) -> list[dict[str, str]]:
    """A click log whose last rows (the time split's test part) bring users never seen in train, and
    whose prices are sometimes empty."""
    rng = np.random.default_rng(1)
    rows = []
    for i in range(ROWS):
        user = f"new{i}" if i >= ROWS - 60 and i % 3 == 0 else f"u{int(rng.integers(0, 80))}"
        price = "" if rng.random() < 0.15 else f"{rng.gamma(2.0, 1.0):.3f}"
        rows.append({"ts": str(1_700_000_000 + 60 * i), "user": user, "ad": f"ad{int(rng.integers(0, 30))}",
                     "site": str(rng.choice(["news", "games", "shop"])), "price": price,
                     "zip": str(int(rng.integers(10_000, 10_600))),  # > --hash-buckets values: hashed
                     "click": str(int(rng.random() < 0.3))})
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return rows


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    root = tmp_path_factory.mktemp("raw_e2e")
    rows = write_clicks(root / "clicks.csv")
    data, run, art = root / "data" / "mine", root / "runs" / "mine", root / "art"
    assert cli_main(["convert", "table", "--src", str(root / "clicks.csv"), "--format", "csv", "--label",
                     "click", "--infer-schema", "--time", "ts", "--split", "time", "--hash-buckets", "200",
                     "--out", str(data)]) == 0
    assert cli_main(["train", "--config", str(TINY), "--data", str(data), "--out", str(run), "train.steps=4",
                     "train.progress=false", "train.final_eval=false", "train.threads=1"]) == 0
    assert cli_main(["export", str(run), "--out", str(art), "--backend", "eager"]) == 0
    assert cli_main(["predict", "--run", str(run), "--partitions", "@test", "--out",
                     str(root / "preds.parquet")]) == 0
    return rows, data, art, pq.read_table(root / "preds.parquet"), run


def test_convert_writes_encoders_that_are_not_a_partition(pipeline):
    _, data, art, _, _ = pipeline
    record = json.loads((data / ENCODERS_FILE).read_text())
    assert record["kind"] == "table" and record["vocabs"]["user"]["file"] == f"{VOCAB_DIR}/user.parquet"
    assert "values" not in record["vocabs"]["user"]  # values live in Parquet, not JSON
    assert record["vocabs"]["zip"]["hashed"] and "zip" in record["text_columns"]  # CSV: hashed as text
    assert Dataset(data).partitions() == ["test", "train", "valid"]
    files = json.loads((art / MANIFEST).read_text())["files"]
    assert f"{VOCAB_DIR}/user.parquet" in files and f"{VOCAB_DIR}/ad.parquet" in files


def test_raw_csv_rows_score_as_opengem_predict_on_the_converted_rows(pipeline):
    rows, _, art, preds, run = pipeline
    p = Predictor.load(art)
    assert p.encoder.table is not None  # raw values go through the importer's Encoders.encode
    ids = preds["example_id"].to_pylist()  # generated from the CSV row number
    raw = [rows[i] for i in ids]
    assert any(r["user"].startswith("new") for r in raw) and any(r["price"] == "" for r in raw)
    cands = [{"user": r["user"], "ad": r["ad"], "site": r["site"], "zip": int(r["zip"]),  # a raw int
              "price": None if r["price"] == "" else float(r["price"])} for r in raw]
    got = np.asarray(p.score({"surface": "all", "candidates": cands})["scores"]["click"])
    want = preds["click"].to_numpy()
    assert got.shape == want.shape and np.abs(got - want).max() <= 1e-6
    # Predictor.load(RUN) exports in memory, reading the dataset's encoders itself: the same scores
    in_memory = Predictor.load(run, "eager").score({"surface": "all", "candidates": cands})["scores"]["click"]
    assert np.abs(np.asarray(in_memory) - want).max() <= 1e-6
    # an unseen user is the OOV row: any two unseen values score alike, a raw int alike too
    one = {**cands[0], "user": "never-seen"}
    unseen = [one, {**one, "user": "other-unseen"}, {**one, "user": 12345}]
    assert len(set(p.score({"surface": "all", "candidates": unseen})["scores"]["click"])) == 1


def test_a_changed_vocabulary_file_is_refused(pipeline, tmp_path):
    _, data, art, _, _ = pipeline
    bad_art = tmp_path / "art"
    shutil.copytree(art, bad_art)
    vocab = bad_art / VOCAB_DIR / "user.parquet"
    blob = bytearray(vocab.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    vocab.write_bytes(bytes(blob))
    with pytest.raises(ArtifactError, match="sha256"):
        Predictor.load(bad_art)
    bad_data = tmp_path / "data"
    shutil.copytree(data, bad_data)
    (bad_data / VOCAB_DIR / "ad.parquet").write_bytes((bad_data / VOCAB_DIR / "site.parquet").read_bytes())
    with pytest.raises(AdapterError, match="sha256"):
        read_encoders(bad_data)
    with pytest.raises(ArtifactError, match="sha256"):
        dataset_encoding(bad_data)  # what opengem export reads: refused, never served wrong


def test_bench_serve_sends_raw_source_rows_to_an_artifact_of_converted_data(pipeline):
    """``opengem bench serve --data`` against such an artifact reads the dataset's source rows (raw
    values), not its canonical Parquet: scored through the Predictor they equal ``opengem predict``."""
    rows, data, art, preds, _ = pipeline
    assert serve_bench.takes_raw_values(art, str(data))
    pool, surfaces, context = serve_bench.candidate_pool(str(data), None, limit=ROWS, raw=True)
    assert len(pool) == ROWS and context == {} and set(pool[0]) == {"user", "ad", "site", "zip", "price"}
    ids = preds["example_id"].to_pylist()
    req = {"surface": surfaces[0], "candidates": [pool[i] for i in ids]}
    got = np.asarray(Predictor.load(art).score(req)["scores"]["click"])
    assert np.abs(got - preds["click"].to_numpy()).max() <= 1e-6
    canonical, _, _ = serve_bench.candidate_pool(str(data), None, limit=8)  # what it sent before
    assert set(canonical[0]) != set(pool[0])
