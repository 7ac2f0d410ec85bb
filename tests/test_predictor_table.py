"""Serving a dataset made by ``opengem convert table``: raw source values (strings, missing prices, long
histories, unseen categories) through the Predictor equal the converted rows the loader reads."""

from __future__ import annotations

import tomllib
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch

from opengem.cli import main as cli_main
from opengem.config import from_dict
from opengem.data.adapters import table as table_adapter
from opengem.data.dataset import Dataset
from opengem.data.loader import ParquetLoader
from opengem.model.registry import ModelConfig, build_model
from opengem.serve.errors import BadRequest
from opengem.serve.export import export_model
from opengem.serve.predictor import Predictor
from opengem.serve.table_codec import encoders_to_json

ROOT = Path(__file__).resolve().parents[1]
warnings.filterwarnings("ignore", category=FutureWarning)


def _convert_and_export(root: Path, args: list[str]):
    """Convert with the importer (its fitted encoders captured), build a tiny-recipe model on the dataset
    and export it with those encoders; returns the dataset, the model and the artifact's Predictor."""
    captured = {}
    real_fit = table_adapter.fit

    def spy(job, bad):
        enc, counts = real_fit(job, bad)
        captured["enc"] = enc
        return enc, counts

    mp = pytest.MonkeyPatch()
    mp.setattr(table_adapter, "fit", spy)
    try:
        assert cli_main(["convert", "table", *args, "--infer-schema", "--out", str(root / "data")]) == 0
    finally:
        mp.undo()
    ds = Dataset(root / "data")
    cfg = from_dict(ModelConfig, tomllib.loads((ROOT / "configs" / "tiny.toml").read_text())["model"])
    torch.manual_seed(0)
    model = build_model(ds.schema, cfg).eval()
    out = root / "art"
    export_model(model, ds.schema, cfg, out, backend="eager", encoding=encoders_to_json(captured["enc"]))
    return ds, model, Predictor.load(out, backend="eager")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A Parquet click log converted by the importer, with the exact encoders the importer fitted."""
    root = tmp_path_factory.mktemp("table")
    rng = np.random.default_rng(0)
    n = 1500
    src = pa.table({
        "user": [f"u{int(rng.zipf(1.4)) % 400}" for _ in range(n)],  # many seen once: out of vocabulary
        "ad": [f"ad{int(rng.integers(0, 40))}" for _ in range(n)],
        "price": [None if rng.random() < 0.1 else float(rng.normal(5, 2)) for _ in range(n)],
        "hist": [[int(x) for x in rng.integers(0, 30, int(rng.integers(0, 70)))] for _ in range(n)],
        "place": [["feed", "story"][int(rng.integers(0, 2))] for _ in range(n)],
        "click": rng.integers(0, 2, n).astype(np.float64),
        "t": rng.permutation(n).astype(np.int64) * 7,
    })
    pq.write_table(src, root / "log.parquet")
    ds, model, p = _convert_and_export(root, ["--src", str(root / "log.parquet"), "--format", "parquet",
                                              "--label", "click", "--time", "t", "--surface", "place"])
    return src, ds, model, p, root


def test_raw_source_rows_equal_the_converted_rows(converted):
    src, ds, model, p, root = converted
    valid = pq.read_table(ds.files("@valid"))
    valid = valid.filter(pc.equal(valid["surface"], 0)).slice(0, 40)
    pq.write_table(valid, root / "rows.parquet")
    loader_batch = next(iter(ParquetLoader([root / "rows.parquet"], ds.schema, 40, drop_last=False)))
    raw = src.take(pa.array(valid["example_id"].to_numpy()))  # example_id = the source row number
    assert raw["price"].null_count > 0 and max(len(h) for h in raw["hist"].to_pylist()) > 50
    assert 0 in valid["user"].to_pylist()  # some users are out of vocabulary (id 0)
    req = {"surface": ds.schema.surfaces[0], "context": {},
           "candidates": [{k: r[k] for k in ("user", "ad", "price", "hist")} for r in raw.to_pylist()]}
    served, _ = p.encode([req])
    assert torch.equal(served.dense, loader_batch.dense)
    sa, sb = served.sparse.to_dict(), loader_batch.sparse.to_dict()
    for f in ds.schema.sparse_names:
        assert torch.equal(sa[f].values(), sb[f].values()) and torch.equal(sa[f].lengths(), sb[f].lengths())
    for g in ds.schema.sequences:
        assert torch.equal(served.sequences[g.name].lengths, loader_batch.sequences[g.name].lengths)
        assert torch.equal(served.sequences[g.name].ids["id"], loader_batch.sequences[g.name].ids["id"])
    with torch.no_grad():
        want = torch.sigmoid(model(loader_batch).logits)[:, 0].tolist()
    assert p.score(req)["scores"]["click"] == want


def test_raw_values_of_the_wrong_kind_are_bad_requests(converted):
    src, ds, _, p, _ = converted
    row = {k: src[k][0].as_py() for k in ("user", "ad", "price", "hist")}
    for key, value in (("price", "cheap"), ("user", 1.5), ("hist", "abc"), ("ad", True), ("hist", [1.5])):
        with pytest.raises(BadRequest) as e:
            p.score({"surface": "feed", "candidates": [{**row, key: value}]})
        assert "\n" not in str(e.value)
    unseen = p.score({"surface": "feed", "candidates": [{**row, "user": "never-seen"}, {**row, "user": 123}]})
    assert unseen["scores"]["click"][0] == unseen["scores"]["click"][1]  # both out of vocabulary: id 0
    # a missing categorical: null (a Parquet row replayed as it is) scores as an empty cell and as unseen
    missing = p.score({"surface": "feed", "candidates": [{**row, "user": None}, {**row, "user": ""}]})
    assert missing["scores"]["click"] == [unseen["scores"]["click"][0]] * 2


def test_joined_history_cells_served_as_lists_equal_the_converted_rows(tmp_path):
    """A CSV whose history cells join ad ids with '^' (shared with the ad's vocabulary and table) and whose
    tags join with '|': a request gives each as a list, and the served ids are the converted rows'."""
    rng = np.random.default_rng(1)
    lines = ["ad_id,hist_ad_id,tags,click"]
    for _ in range(400):
        hist = "^".join(str(int(x)) for x in rng.integers(0, 25, int(rng.integers(0, 6))))
        tags = "|".join(rng.choice(["x", "y", "z"], int(rng.integers(0, 3)), replace=False))
        lines.append(f"{int(rng.integers(0, 25))},{hist},{tags},{int(rng.random() < 0.3)}")
    (tmp_path / "h.csv").write_text("\n".join(lines) + "\n")
    ds, model, p = _convert_and_export(tmp_path, ["--src", str(tmp_path / "h.csv"), "--label", "click"])
    assert {g.name: g.fields[0].table_name for g in ds.schema.sequences} == {"hist_ad_id": "ad_id",
                                                                             "tags": "tags__id"}
    valid = pq.read_table(ds.files("@valid")).slice(0, 30)
    pq.write_table(valid, tmp_path / "rows.parquet")
    loader_batch = next(iter(ParquetLoader([tmp_path / "rows.parquet"], ds.schema, 30, drop_last=False)))
    rows = [lines[1 + r].split(",") for r in valid["example_id"].to_pylist()]
    req = {"surface": ds.schema.surfaces[0], "context": {},
           "candidates": [{"ad_id": int(a), "hist_ad_id": [int(x) for x in h.split("^") if x],
                           "tags": [x for x in t.split("|") if x]} for a, h, t, _ in rows]}
    served, _ = p.encode([req])
    sa, sb = served.sparse.to_dict(), loader_batch.sparse.to_dict()
    assert torch.equal(sa["ad_id"].values(), sb["ad_id"].values())
    for g in ds.schema.sequences:
        assert torch.equal(served.sequences[g.name].lengths, loader_batch.sequences[g.name].lengths)
        assert torch.equal(served.sequences[g.name].ids["id"], loader_batch.sequences[g.name].ids["id"])
    assert loader_batch.sequences["hist_ad_id"].lengths.sum() > 0
    with torch.no_grad():
        want = torch.sigmoid(model(loader_batch).logits)[:, 0].tolist()
    assert p.score(req)["scores"]["click"] == want
    # one surface ("all"): a request may leave it out, as a plain CTR model's client would
    assert list(ds.schema.surfaces) == ["all"]
    assert p.score({k: v for k, v in req.items() if k != "surface"}) == p.score(req)


def test_a_request_without_a_surface_is_refused_where_there_are_two(converted):
    src, ds, _, p, _ = converted
    row = {k: src[k][0].as_py() for k in ("user", "ad", "price", "hist")}
    with pytest.raises(BadRequest, match="missing 'surface'"):
        p.score({"candidates": [row]})
