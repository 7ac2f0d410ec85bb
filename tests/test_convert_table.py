"""``opengem convert table``: one's own CSV/TSV/Parquet/libsvm -> canonical Parquet.

Pins: inference of kinds, generated example_id/ts, splits that never mix (time cuts, train-only
shuffle), every missing column listed at once, the OOV row (rare and unseen ids share row 0, which a
model then trains), hashing above the bucket count, the editable spec re-run, libsvm and list columns,
labels derived from a numeric column (``like=rating>=4``) and their spec round trip, the exact-count
holdout (``--exact-holdout``: counts, rows, spec round trip, frappe_x1 adapter's valid rows).
Expected values are computed here from the generated source, never read from the importer's output.
"""

from __future__ import annotations

import csv
import json
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from opengem.cli import main as cli_main
from opengem.data.adapters import vocab
from opengem.data.adapters.infer import (
    ImportSpec,
    SequenceSpec,
    SparseSpec,
    check_spec,
    infer_share,
    load_spec,
)
from opengem.data.adapters.labels import LabelRule, LabelSyntaxError, parse_label
from opengem.data.dataset import Dataset
from opengem.data.loader import ParquetLoader
from opengem.data.schema import SchemaError
from opengem.model.heads import masked_bce
from opengem.train.config import load_run_config
from opengem.train.data import make_loader
from opengem.train.distributed import process_group
from opengem.train.parallelize import build_run_model

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.toml"
SPLITS = ("train", "valid", "test")


def make_csv(path: Path, n: int = 2000, seed: int = 0) -> list[dict[str, str]]:
    """user: Zipf ids (many seen once); ad: 30 strings; price: floats with gaps; t: shuffled times."""
    rng = np.random.default_rng(seed)
    rows = []
    times = rng.permutation(n) * 7
    for i in range(n):
        rows.append({"user": str(int(rng.zipf(1.3)) % 5000), "ad": f"ad{rng.integers(0, 30)}",
                     "price": "" if rng.random() < 0.1 else f"{rng.normal(5, 2):.4f}",
                     "t": str(int(times[i])), "click": str(int(rng.random() < 0.2))})
    return write_csv(path, rows)


def write_csv(path: Path, rows: list[dict[str, str]]) -> list[dict[str, str]]:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return rows


def convert(*args: str) -> int:
    return cli_main(["convert", "table", *args])


def read(out: Path, split: str) -> pa.Table:
    return pq.read_table(out / split)


@pytest.fixture(scope="module")
def log_csv(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, str]]]:
    d = tmp_path_factory.mktemp("src")
    rows = make_csv(d / "log.csv")
    return d / "log.csv", rows


@pytest.fixture(scope="module")
def time_ds(log_csv, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("out") / "ds"
    assert convert("--src", str(log_csv[0]), "--format", "csv", "--label", "click", "--infer-schema",
                   "--time", "t", "--out", str(out)) == 0
    return out


def test_inferred_spec_and_dataset(time_ds: Path, log_csv) -> None:
    spec = load_spec(time_ds.with_name("ds.import.toml"))
    assert [s.name for s in spec.sparse] == ["user", "ad"]  # integer and string columns
    assert [d.name for d in spec.dense] == ["price"]  # the float column
    assert spec.time == "t" and spec.labels == ["click"] and spec.example_id == ""
    assert cli_main(["validate", "--data", str(time_ds)]) == 0
    ds = Dataset(time_ds)
    assert ds.schema.dense_names == ["price", "price_missing"]
    tables = {s: read(time_ds, s) for s in SPLITS}
    ids = np.concatenate([t["example_id"].to_numpy() for t in tables.values()])
    assert sorted(ids) == list(range(len(log_csv[1])))  # generated: the source row number
    summary = json.loads((time_ds / "summary.json").read_text())
    assert summary["generated"] == ["example_id"]
    # every row's label arrived with its row: compare against the source
    src = log_csv[1]
    for t in tables.values():
        for eid, y in zip(t["example_id"].to_pylist()[:50], t["click"].to_pylist()[:50]):
            assert y == float(src[eid]["click"])


def test_time_split_never_mixes_and_train_is_shuffled(time_ds: Path, log_csv) -> None:
    src = log_csv[1]
    tables = {s: read(time_ds, s) for s in SPLITS}
    ts = {s: t["ts"].to_numpy() for s, t in tables.items()}
    assert ts["train"].max() < ts["valid"].min() <= ts["valid"].max() < ts["test"].min()
    n = len(src)
    assert [len(ts[s]) for s in SPLITS] == [int(0.8 * n), int(0.1 * n), int(0.1 * n)]  # distinct times
    train_ids = tables["train"]["example_id"].to_numpy()
    assert not (np.diff(train_ids) > 0).all(), "train rows kept source order: not shuffled"
    valid_ids = tables["valid"]["example_id"].to_numpy()
    assert (np.diff(valid_ids) > 0).all(), "valid rows must stay in source order"


def test_random_split_shuffle_stays_within_splits(log_csv, tmp_path: Path) -> None:
    base = ["--src", str(log_csv[0]), "--format", "csv", "--label", "click", "--infer-schema",
            "--seed", "3", "--valid-frac", "0.2", "--test-frac", "0.1"]
    assert convert(*base, "--out", str(tmp_path / "a")) == 0
    assert convert(*base, "--no-shuffle", "--out", str(tmp_path / "b")) == 0
    for s in SPLITS:
        a, b = (read(tmp_path / x, s)["example_id"].to_numpy() for x in "ab")
        assert sorted(a) == list(b), s  # same rows per split, shuffled or not
    n = len(log_csv[1])
    assert abs(len(read(tmp_path / "a", "valid")) - 0.2 * n) < 0.05 * n


def test_oov_row_holds_rare_and_unseen_values(time_ds: Path, log_csv) -> None:
    src = log_csv[1]
    tables = {s: read(time_ds, s) for s in SPLITS}
    train_ids = set(tables["train"]["example_id"].to_pylist())
    counts = Counter(src[i]["user"] for i in train_ids)
    kept = sorted({v for v, c in counts.items() if c >= 2}, key=int)  # integers sort numerically
    summary = json.loads((time_ds / "summary.json").read_text())
    assert summary["vocab"]["user"] == len(kept) + 1
    for s, t in tables.items():
        for eid, uid in zip(t["example_id"].to_pylist(), t["user"].to_pylist()):
            value = src[eid]["user"]
            assert (uid == 0) == (value not in counts or counts[value] < 2), (s, eid, value, uid)
    # rare training values land on row 0, so training rows use it (and it is trained)
    assert (tables["train"]["user"].to_numpy() == 0).sum() == sum(1 for c in counts.values() if c < 2)
    assert summary["splits"]["test"]["oov_share"]["user"] > 0


def test_oov_row_is_trained(time_ds: Path) -> None:
    """A model trained on the converted rows moves row 0 of the user table (what OOV test rows read)."""
    cfg = load_run_config(TINY, ["train.progress=false", f"data.path={time_ds}", "data.batch_size=64"])
    ds = Dataset(time_ds)
    test_oov = (read(time_ds, "test")["user"].to_numpy() == 0).sum()
    assert test_oov > 0
    with process_group(torch.device("cpu")) as pg:
        model = build_run_model(ds.schema, cfg, torch.device("cpu"), pg).model

        def user_table() -> torch.Tensor:
            [w] = [v.local_shards()[0].tensor.clone() for k, v in model.state_dict().items()
                   if hasattr(v, "local_shards") and ".user." in k]
            return w

        before = user_table()
        for i, batch in enumerate(make_loader(ds, "@train", cfg.data, train=True)):
            out = model(batch)
            masked_bce(out.logits, batch.labels, batch.label_mask).backward()
            if i == 5:
                break
        after = user_table()
    assert not torch.equal(before[0], after[0]), "OOV row 0 still at its initial value after training"


def test_missing_columns_listed_at_once(log_csv, tmp_path: Path, capsys) -> None:
    spec = tmp_path / "s.toml"
    spec.write_text('name = "x"\nlabels = ["click", "conv"]\n[[sparse]]\nname = "user"\n'
                    '[[sparse]]\nname = "campaign"\n[[dense]]\nname = "price"\n')
    rc = convert("--src", str(log_csv[0]), "--format", "csv", "--schema", str(spec), "--out",
                 str(tmp_path / "o"))
    err = capsys.readouterr().err
    assert rc == 1
    assert "conv (label)" in err and "campaign (sparse)" in err  # both, in one message
    assert "example_id and ts are generated" in err
    assert not (tmp_path / "o").exists()


def test_bad_label_names_row(tmp_path: Path, capsys) -> None:
    (tmp_path / "l.csv").write_text("a,y\nx,0\ny,1\nz,2\n")
    assert convert("--src", str(tmp_path / "l.csv"), "--format", "csv", "--label", "y", "--infer-schema",
                   "--out", str(tmp_path / "o")) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'l.csv'}: line 4, column 'y' (label): value 2 is not 0 or 1" in err


def test_a_bad_row_is_named_by_its_file_and_line(tmp_path: Path, capsys) -> None:
    """Several files, a repeated header, rows skipped as malformed above the bad one: the message names
    the file and the line an editor shows (as Arrow numbers lines), not a row count over all files."""
    (tmp_path / "a.csv").write_text("a,y,t\nx,0,1\ny,1,2\nz,0,3\n")
    (tmp_path / "b.csv").write_text("a,y,t\nx,0,4\nmalformed\ny,1,5\nalso,malformed\nz,1,\nw,0,7\n")
    (tmp_path / "c.csv").write_text("x,7,8\n")  # no header: its first line is a row
    args = ["--format", "csv", "--label", "y", "--infer-schema"]
    assert convert("--src", str(tmp_path / "[ab].csv"), "--time", "t", *args, "--out",
                   str(tmp_path / "o1")) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'b.csv'}: line 6, column 't' (time): empty value" in err and err.count("\n") == 2
    (tmp_path / "b.csv").write_text("a,y,t\nx,0,4\n")
    assert convert("--src", str(tmp_path / "[abc].csv"), *args, "--out", str(tmp_path / "o2")) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'c.csv'}: line 1, column 'y' (label): value 7 is not 0 or 1" in err
    pq.write_table(pa.table({"a": ["x", "y", "z"], "y": [0.0, 1.0, 3.0]}), tmp_path / "p.parquet")
    assert convert("--src", str(tmp_path / "p.parquet"), "--label", "y", "--infer-schema", "--out",
                   str(tmp_path / "o3")) == 1
    assert f"{tmp_path / 'p.parquet'}: row 2 (from 0), column 'y' (label)" in capsys.readouterr().err
    assert not any((tmp_path / o).exists() for o in ("o1", "o2", "o3"))


def test_hashing_above_bucket_count_and_spec_rerun(log_csv, tmp_path: Path) -> None:
    out = tmp_path / "h"
    assert convert("--src", str(log_csv[0]), "--format", "csv", "--label", "click", "--infer-schema",
                   "--hash-buckets", "16", "--min-count", "1", "--out", str(out)) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert "user" in summary["hashed"] and "ad" in summary["hashed"]  # > 16 distinct values each
    ids = np.concatenate([read(out, s)["user"].to_numpy() for s in SPLITS])
    assert ids.min() >= 1 and ids.max() < 16 and len(np.unique(ids)) > 8
    # edit the written spec: price becomes log1p without indicator, ad is dropped; re-run with --schema
    spec_path = out.with_name("h.import.toml")
    text = spec_path.read_text().replace('transform = "standardize", missing_indicator = true',
                                         'transform = "log1p", missing_indicator = false')
    text = "".join(line for line in text.splitlines(keepends=True) if 'name = "ad"' not in line)
    spec_path.write_text(text)
    assert convert("--src", str(log_csv[0]), "--format", "csv", "--schema", str(spec_path),
                   "--hash-buckets", "100000", "--out", str(out), "--force") == 0
    ds = Dataset(out)
    assert ds.schema.sparse_names == ["user", "t"]  # without --time, t is an integer feature
    assert ds.schema.dense_names == ["price"]
    price = read(out, "train")["price"].to_numpy()
    assert price.min() >= 0  # log1p(max(x, 0))


def test_libsvm_source(tmp_path: Path) -> None:
    lines = ["1 3:1 7:1 9:0", "0 3:1 8:1", "0 2:1", "1 3:1 7:1", "0 7:1 8:1"] * 40
    (tmp_path / "a.libsvm").write_text("\n".join(lines) + "\n")
    out = tmp_path / "o"
    assert convert("--src", str(tmp_path / "a.libsvm"), "--format", "libsvm", "--label", "label",
                   "--infer-schema", "--out", str(out)) == 0
    ds = Dataset(out)
    [f] = ds.schema.sparse
    assert f.name == "features" and f.multi_valued
    t = pa.concat_tables(read(out, s) for s in SPLITS)
    assert t.num_rows == 200
    first = t.filter(pa.compute.equal(t["example_id"], 0))
    assert len(first["features"][0].as_py()) == 2  # 9:0 is not a feature


def test_parquet_list_column_becomes_sequence(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    hist = [[int(x) for x in rng.integers(0, 20, rng.integers(0, 70))] for _ in range(300)]
    pq.write_table(pa.table({"item": rng.integers(0, 20, 300), "hist": hist,
                             "y": rng.integers(0, 2, 300).astype(np.float64)}), tmp_path / "s.parquet")
    out = tmp_path / "o"
    assert convert("--src", str(tmp_path / "s.parquet"), "--format", "parquet", "--label", "y",
                   "--infer-schema", "--out", str(out)) == 0
    ds = Dataset(out)
    [g] = ds.schema.sequences
    assert g.name == "hist" and g.max_len == 50
    assert cli_main(["validate", "--data", str(out)]) == 0
    t = pa.concat_tables(read(out, s) for s in SPLITS)
    lens = [len(x) for x in t["hist__id"].to_pylist()]
    src_lens = [min(len(hist[i]), 50) for i in t["example_id"].to_pylist()]
    assert lens == src_lens  # truncated to the most recent 50


def test_split_per_file_with_headerless_later_files(tmp_path: Path) -> None:
    (tmp_path / "train.csv").write_text("a,y\n" + "".join(f"v{i % 7},{i % 2}\n" for i in range(100)))
    (tmp_path / "test.csv").write_text("".join(f"v{i % 9},{i % 2}\n" for i in range(30)))
    out = tmp_path / "o"
    assert convert("--src", f"train={tmp_path / 'train.csv'}", "--src", f"test={tmp_path / 'test.csv'}",
                   "--format", "csv", "--label", "y", "--infer-schema", "--valid-frac", "0.2",
                   "--out", str(out)) == 0
    rows = {s: read(out, s).num_rows for s in SPLITS}
    assert rows["test"] == 30 and rows["train"] + rows["valid"] == 100 and rows["valid"] > 5


def test_format_from_the_file_names(log_csv, tmp_path: Path, capsys) -> None:
    """Without --format the names say it (compressed too); names that say none or two formats are refused."""
    (tmp_path / "train.csv").write_text("a,y\n" + "".join(f"v{i % 7},{i % 2}\n" for i in range(100)))
    (tmp_path / "test.csv").write_text("".join(f"v{i % 9},{i % 2}\n" for i in range(30)))
    out = tmp_path / "o"
    assert convert("--src", f"train={tmp_path / 'train.csv'}", "--src", f"test={tmp_path / 'test.csv'}",
                   "--label", "y", "--infer-schema", "--valid-frac", "0.2", "--out", str(out)) == 0
    assert read(out, "test").num_rows == 30
    lines = ["1 3:1 7:1", "0 3:1 8:1", "0 2:1", "1 3:1 7:1"] * 40
    with pa.output_stream(str(tmp_path / "a.svm.gz"), compression="gzip") as f:
        f.write(("\n".join(lines) + "\n").encode())
    assert convert("--src", str(tmp_path / "a.svm.gz"), "--label", "label", "--infer-schema",
                   "--out", str(tmp_path / "svm")) == 0
    assert Dataset(tmp_path / "svm").schema.sparse[0].multi_valued
    capsys.readouterr()
    (tmp_path / "b.txt").write_text("a,y\nv,1\n")
    for srcs in ([str(tmp_path / "b.txt")], [str(log_csv[0]), str(tmp_path / "a.svm.gz")]):
        assert convert(*[a for s in srcs for a in ("--src", s)], "--label", "y", "--infer-schema",
                       "--out", str(tmp_path / "x")) == 2
        assert "--format csv|tsv|parquet|libsvm is required" in capsys.readouterr().err


def test_many_shuffle_buckets_keep_every_train_row(log_csv, tmp_path: Path, monkeypatch) -> None:
    """Train rows go through several seeded shuffle buckets (bounded memory) and all come back once."""
    monkeypatch.setattr("opengem.data.adapters.table.SHUFFLE_BUCKET_ROWS", 300)
    base = ["--src", str(log_csv[0]), "--format", "csv", "--label", "click", "--infer-schema"]
    assert convert(*base, "--out", str(tmp_path / "a")) == 0
    assert convert(*base, "--no-shuffle", "--out", str(tmp_path / "b")) == 0
    a, b = (read(tmp_path / x, "train")["example_id"].to_numpy() for x in "ab")
    assert sorted(a) == list(b) and not (np.diff(a) > 0).all()
    assert not any(p.name.startswith(".") for p in (tmp_path / "a").rglob("*"))  # buckets removed


def test_given_time_cuts_and_fixed_vocab(tmp_path: Path, capsys) -> None:
    (tmp_path / "s.csv").write_text("t,slot,y\n" + "".join(f"{i},{i % 5},{i % 2}\n" for i in range(100)))
    spec = tmp_path / "s.toml"
    spec.write_text('name = "x"\nlabels = ["y"]\ntime = "t"\n[[sparse]]\nname = "slot"\nvocab = 5\n')
    out = tmp_path / "o"
    args = ["--src", str(tmp_path / "s.csv"), "--format", "csv", "--schema", str(spec)]
    assert convert(*args, "--split", "time", "--time-cuts", "60,90", "--out", str(out)) == 0
    assert [read(out, s).num_rows for s in SPLITS] == [60, 30, 10]
    assert Dataset(out).schema.sparse_feature("slot").vocab == 5
    t = read(out, "valid")
    assert t["slot"].to_pylist() == [int(x) % 5 for x in t["ts"].to_pylist()]  # ids kept as they are
    spec.write_text(spec.read_text().replace("vocab = 5", "vocab = 4"))
    assert convert(*args, "--out", str(tmp_path / "o2")) == 1
    assert "id 4 outside the declared vocab [0, 4)" in capsys.readouterr().err


def test_table_options_refused_for_named_datasets(tmp_path: Path, capsys) -> None:
    assert cli_main(["convert", "criteo_kaggle_head", "--src", str(tmp_path), "--out", str(tmp_path / "o"),
                     "--min-count", "3"]) == 2
    assert "--min-count applies only to `opengem convert table`" in capsys.readouterr().err


def _data(name: str) -> Path:
    root = Path(os.environ.get("OPENGEM_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")
    if not (root / name).is_dir():
        pytest.skip(f"real data not found at {root / name} (set $OPENGEM_DATA or provide ../shared/data)")
    return root / name


@pytest.mark.realdata
def test_importer_matches_criteo_adapter(tmp_path: Path) -> None:
    """The generic importer from the raw Criteo head files: the adapter's rows and label rates per split."""
    src = _data("criteo_kaggle_head")
    cols = ",".join(["label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27))])
    assert convert("--src", f"train={src / 'train.tsv'}", "--src", f"valid={src / 'dev.tsv'}", "--src",
                   f"test={src / 'test.tsv'}", "--format", "tsv", "--columns", cols, "--label", "label",
                   "--infer-schema", "--out", str(tmp_path / "t")) == 0
    assert cli_main(["convert", "criteo_kaggle_head", "--src", str(src), "--out", str(tmp_path / "a")]) == 0
    t, a = (json.loads((tmp_path / x / "summary.json").read_text())["splits"] for x in "ta")
    assert {s: t[s]["rows"] for s in SPLITS} == {"train": 7200, "valid": 409, "test": 391}  # SOURCE.md
    for s in SPLITS:
        assert t[s]["rows"] == a[s]["rows"] and t[s]["label_rates"]["label"] == a[s]["label_rates"]["click"]


def test_surface_column_and_two_labels_with_unobserved(tmp_path: Path) -> None:
    def row(i: int) -> str:
        conv = "" if i % 2 == 0 else str(int(i % 4 == 1))  # observed on clicks only
        return f"{'feed' if i % 3 else 'search'},a{i % 4},{i % 2},{conv}"

    lines = ["place,ad,click,conv"] + [row(i) for i in range(90)]
    (tmp_path / "s.csv").write_text("\n".join(lines) + "\n")
    out = tmp_path / "o"
    assert convert("--src", str(tmp_path / "s.csv"), "--format", "csv", "--label", "click,conv",
                   "--surface", "place", "--infer-schema", "--out", str(out)) == 0
    ds = Dataset(out)
    assert ds.schema.surfaces == ("feed", "search") and ds.schema.task_names == ["click", "conv"]
    assert ds.schema.sparse_names == ["ad"]  # the surface column is a role, not a feature
    t = pa.concat_tables(read(out, s) for s in SPLITS)
    eid = t["example_id"].to_numpy()
    assert (t["surface"].to_numpy() == (eid % 3 == 0)).all()  # search (index 1) on every third row
    conv = t["conv"].to_numpy(zero_copy_only=False)
    assert np.isnan(conv[eid % 2 == 0]).all() and not np.isnan(conv[eid % 2 == 1]).any()
    assert t["conv"].null_count == int((eid % 2 == 0).sum())  # null, not NaN: the loader refuses NaN labels
    batch = next(iter(ParquetLoader(ds.files("@train"), ds.schema, 16, drop_last=False)))
    assert 0 < int(batch.label_mask[:, 1].sum()) < 16 and bool(batch.label_mask[:, 0].all())


def test_infer_never_overwrites_an_existing_spec(log_csv, tmp_path: Path, capsys) -> None:
    spec = tmp_path / "o.import.toml"
    spec.write_text("# my edits\n")
    assert convert("--src", str(log_csv[0]), "--format", "csv", "--label", "click", "--infer-schema",
                   "--out", str(tmp_path / "o")) == 2
    assert "already there" in capsys.readouterr().err and spec.read_text() == "# my edits\n"


def test_uint64_ids_stay_categorical_and_warn(tmp_path: Path, capsys) -> None:
    """Avazu-like ids above 2**63 parse as floats in Arrow; inference keeps them sparse and warns that
    every row then uses the OOV row (unique per row), rather than standardising them as numbers."""
    lines = ["id,price,y"] + [f"{10**19 + 7 * i},{i / 3:.3f},{i % 2}" for i in range(50)]
    (tmp_path / "s.csv").write_text("\n".join(lines) + "\n")
    assert convert("--src", str(tmp_path / "s.csv"), "--format", "csv", "--label", "y", "--infer-schema",
                   "--out", str(tmp_path / "o")) == 0
    spec = load_spec(tmp_path / "o.import.toml")
    assert [s.name for s in spec.sparse] == ["id"] and [d.name for d in spec.dense] == ["price"]
    assert "id: no value occurs 2+ times in train" in capsys.readouterr().err


def _price_csv(path: Path, n: int, odd: dict[int, str], header: bool = True) -> None:
    """user,price,y rows; ``odd`` puts a cell in the price column of those data rows (0-based)."""
    rows = [f"u{i % 7},{odd.get(i, f'{(i % 13) / 4:.2f}')},{i % 2}" for i in range(n)]
    path.write_text("\n".join((["user,price,y"] if header else []) + rows) + "\n")


def test_a_mostly_numeric_text_column_is_inferred_categorical_with_a_warning(tmp_path: Path, capsys) -> None:
    """One 'unknown' among 300 prices makes the column text: inference files it sparse and says why, naming
    the cell; an integer id column with a stray word (an id, however written) and a text column do not."""
    _price_csv(tmp_path / "p.csv", 300, {41: "unknown"})
    assert convert("--src", str(tmp_path / "p.csv"), "--label", "y", "--infer-schema",
                   "--out", str(tmp_path / "o")) == 0
    err = capsys.readouterr().err
    assert "price: 299 of 300 sampled values are numbers, but not 'unknown'" in err and "under dense" in err
    assert [s.name for s in load_spec(tmp_path / "o.import.toml").sparse] == ["user", "price"]
    lines = ["id,word,y"] + [f"{i if i != 5 else 'x'},{'abc'[i % 3]},{i % 2}" for i in range(100)]
    (tmp_path / "i.csv").write_text("\n".join(lines) + "\n")
    assert convert("--src", str(tmp_path / "i.csv"), "--label", "y", "--infer-schema",
                   "--out", str(tmp_path / "i")) == 0
    assert "sampled values are numbers" not in capsys.readouterr().err


def test_a_misspelt_spec_key_is_named_with_its_likely_fix(tmp_path: Path, capsys) -> None:
    _price_csv(tmp_path / "p.csv", 50, {})
    spec = tmp_path / "s.toml"
    spec.write_text('name = "p"\nlabels = ["y"]\n[[sparse]]\nname = "user"\nseparater = "|"\n')
    assert convert("--src", str(tmp_path / "p.csv"), "--schema", str(spec), "--out", str(tmp_path / "o")) == 1
    assert "unknown key 'separater' (did you mean 'separator'? allowed: " in capsys.readouterr().err


@pytest.mark.parametrize("block_bytes", [None, 1 << 10])  # the bad cell in the first block / a later one
@pytest.mark.parametrize("header", [True, False])
def test_a_dense_cell_that_is_not_a_number_names_its_line_and_column(tmp_path: Path, capsys, monkeypatch,
                                                                    block_bytes, header) -> None:
    if block_bytes:
        monkeypatch.setattr("opengem.data.adapters.sources.BLOCK_BYTES", block_bytes)
    _price_csv(tmp_path / "p.csv", 400, {300: "abc"}, header=header)
    spec = tmp_path / "s.toml"
    spec.write_text('name = "p"\nlabels = ["y"]\n[[sparse]]\nname = "user"\n[[dense]]\nname = "price"\n')
    names = [] if header else ["--columns", "user,price,y"]
    rc = convert("--src", str(tmp_path / "p.csv"), *names, "--schema", str(spec),
                 "--out", str(tmp_path / "o"))
    err = capsys.readouterr().err.strip()
    line = 302 if header else 301
    assert rc == 1 and err == (f"opengem convert: error: {tmp_path / 'p.csv'}: line {line}, column 'price': "
                               "'abc' is not a number (the column is read as double: fix or blank the cell, "
                               "or read the column another way in the import spec)")
    assert (tmp_path / "p.csv").read_text().splitlines()[line - 1] == "u6,abc,0"
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------------- derived labels
def test_label_grammar() -> None:
    assert parse_label("click") == LabelRule("click", "click")
    assert parse_label(" like = rating >= 4 ") == LabelRule("like", "rating", ">=", 4.0)
    assert parse_label("rating>3.5") == LabelRule("rating", "rating", ">", 3.5)
    assert parse_label("long=dwell_ms!=-1e3") == LabelRule("long", "dwell_ms", "!=", -1000.0)
    for text in ("like=rating>=4", "rating<2", "c", "x=y==0.25"):
        assert str(parse_label(text)) == text  # what the spec stores reads back the same
    x = np.array([1.0, 3.9, 4.0, 5.0, np.nan])
    for op, want in ((">=", [0, 0, 1, 1]), (">", [0, 0, 0, 1]), ("<=", [1, 1, 1, 0]), ("<", [1, 1, 0, 0]),
                     ("==", [0, 0, 1, 0]), ("!=", [1, 1, 0, 1])):
        y = parse_label(f"y=r{op}4").apply(x)
        assert y[:4].tolist() == want and np.isnan(y[4]), op  # empty stays "not observed"
    for bad in ("like=rating=>4", "like=rating>=four", "like=rating>=", "a=b>=inf", "=r>1", "r>>1"):
        with pytest.raises(LabelSyntaxError):
            parse_label(bad)


def _ratings_csv(path: Path, n: int = 600) -> list[dict[str, str]]:
    rng = np.random.default_rng(4)
    rows = [{"user": str(int(rng.integers(0, 40))), "item": f"m{rng.integers(0, 25)}",
             "rating": "" if i % 50 == 7 else f"{rng.integers(1, 11) / 2:g}", "t": str(i)} for i in range(n)]
    return write_csv(path, rows)


def test_derived_labels_from_a_rating_column_and_spec_round_trip(tmp_path: Path) -> None:
    src = _ratings_csv(tmp_path / "r.csv")
    out = tmp_path / "o"
    assert convert("--src", str(tmp_path / "r.csv"), "--format", "csv", "--label",
                   "like=rating>=4,hate=rating<2", "--time", "t", "--infer-schema", "--out", str(out)) == 0
    spec_path = tmp_path / "o.import.toml"
    spec = load_spec(spec_path)
    assert spec.labels == ["like=rating>=4", "hate=rating<2"]
    assert [s.name for s in spec.sparse] == ["user", "item"]  # rating is the labels' source, not a feature
    ds = Dataset(out)
    assert ds.schema.task_names == ["like", "hate"]
    t = pa.concat_tables(read(out, s) for s in SPLITS)
    ratings = [src[i]["rating"] for i in t["example_id"].to_pylist()]
    for task, keep in (("like", lambda r: r >= 4), ("hate", lambda r: r < 2)):
        want = [float(keep(float(r))) if r else None for r in ratings]
        got = [None if np.isnan(y) else y for y in t[task].to_numpy(zero_copy_only=False)]
        assert got == want, task
    summary = json.loads((out / "summary.json").read_text())
    train_ids = read(out, "train")["example_id"].to_pylist()
    seen = [float(src[i]["rating"]) for i in train_ids if src[i]["rating"]]
    assert summary["splits"]["train"]["label_rates"]["like"] == round(np.mean([r >= 4 for r in seen]), 6)
    # the written spec, re-read with --schema, gives the same dataset
    assert convert("--src", str(tmp_path / "r.csv"), "--format", "csv", "--schema", str(spec_path),
                   "--out", str(tmp_path / "o2")) == 0
    for s in SPLITS:
        a, b = read(out, s), read(tmp_path / "o2", s)
        assert a.schema == b.schema
        for c in a.column_names:  # column by column: NaN (not observed) equals NaN here
            np.testing.assert_array_equal(a[c].to_numpy(), b[c].to_numpy(), err_msg=f"{s}/{c}")


@pytest.mark.parametrize("label,rc,where", [
    ("like=rating=>4", 2, "--label like=rating=>4: 'like=rating=>4' is not"),
    ("a=rating>1,a=rating<1", 2, "task name 'a' given twice"),
    ("user=rating>=4", 1, "label 'user' has the name of a feature"),
])
def test_bad_label_expression_is_one_line(tmp_path: Path, capsys, label: str, rc: int, where: str) -> None:
    _ratings_csv(tmp_path / "r.csv", 40)
    got = convert("--src", str(tmp_path / "r.csv"), "--format", "csv", "--label", label, "--infer-schema",
                  "--out", str(tmp_path / "o"))
    err = capsys.readouterr().err
    assert got == rc and where in err and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists()


def test_bad_label_in_spec_names_the_key(tmp_path: Path, capsys) -> None:
    _ratings_csv(tmp_path / "r.csv", 40)
    (tmp_path / "s.toml").write_text('name = "x"\nlabels = ["click", "like=rating>=x"]\n')
    assert convert("--src", str(tmp_path / "r.csv"), "--format", "csv", "--schema", str(tmp_path / "s.toml"),
                   "--out", str(tmp_path / "o")) == 1
    err = capsys.readouterr().err
    assert "s.toml: labels[1]: 'like=rating>=x': 'x' is not a number" in err and err.count("\n") == 1


@pytest.mark.realdata
def test_importer_matches_movielens_100k_adapter(tmp_path: Path) -> None:
    """The adapter's label (rating >= 4) and time split (quantile positions floor(0.8 N), floor(0.9 N),
    ties later), derived by the importer from the raw u.data: same rows and label rates per split."""
    src = _data("movielens_100k")
    assert convert("--src", str(src / "u.data"), "--format", "tsv", "--columns", "user,item,rating,ts",
                   "--label", "like=rating>=4", "--time", "ts", "--split", "time", "--infer-schema",
                   "--out", str(tmp_path / "t")) == 0
    assert cli_main(["convert", "movielens_100k", "--src", str(src), "--out", str(tmp_path / "a")]) == 0
    t, a = (json.loads((tmp_path / x / "summary.json").read_text())["splits"] for x in "ta")
    assert sum(t[s]["rows"] for s in SPLITS) == 100_000  # SOURCE.md
    for s in SPLITS:
        assert t[s]["rows"] == a[s]["rows"] and t[s]["label_rates"] == a[s]["label_rates"], s


# --------------------------------------------------------------------------- bounded memory
_RSS_CHILD = """
import resource, sys
import opengem.data.adapters.sources as sources
import opengem.data.adapters.table as table
import opengem.data.adapters.vocab as vocab
# Every bounded buffer scaled down with the file, so that both sizes fill them: Arrow reads up to 32 CSV
# blocks ahead (8 MB blocks: a 64 MB source fits in the window; 128 kB: 4 MB), per-batch value counts
# wait for a merge (up to max(2 x hash_buckets, MERGE_ROWS) rows a feature), output row groups fill up.
sources.BLOCK_BYTES, vocab.MERGE_ROWS, table.ROW_GROUP_ROWS = 128 << 10, 4096, 4096
from opengem.cli import main
rc = main(["convert", "table", "--src", sys.argv[1], "--format", "tsv", "--columns", sys.argv[2],
           "--label", "label", "--infer-schema", "--no-shuffle", "--hash-buckets", "2000",
           "--out", sys.argv[3]])
import pyarrow as pa
print("RSS_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, rc, pa.default_memory_pool().max_memory())
"""


def _criteo_layout_tsv(path: Path, rows: int, seed: int = 0) -> list[str]:
    """Criteo's layout (label, 13 ints ~20 % empty, 26 hex categoricals from 1,000 values each)."""
    import pyarrow.csv as pcsv

    rng = np.random.default_rng(seed)
    names = ["label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27))]
    pool = pa.array([f"{(v * 2654435761) % 2**32:08x}" for v in range(1000)])
    opts = pcsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")
    with pcsv.CSVWriter(path, pa.schema([(c, pa.int64()) for c in names[:14]]
                                        + [(c, pa.string()) for c in names[14:]]), write_options=opts) as w:
        for start in range(0, rows, 100_000):
            n = min(100_000, rows - start)
            cols = {"label": pa.array(rng.integers(0, 2, n))}
            cols |= {c: pa.array(rng.geometric(0.05, n), mask=rng.random(n) < 0.2) for c in names[1:14]}
            cols |= {c: pool.take(pa.array(rng.zipf(1.3, n) % 1000)) for c in names[14:]}
            w.write_table(pa.table(cols))
    return names


@pytest.mark.slow
def test_peak_rss_stays_flat_as_rows_quadruple(tmp_path: Path) -> None:
    """Streaming, measured: 4x the rows (+~75 MB of source) leaves the peak of Arrow's memory pool (where
    source blocks, encoded tables and value counts live) flat and the converter's peak RSS within noise
    (ru_maxrss varied by 8-36 MB between identical runs here), where reading the file whole would add at
    least the extra source bytes (1.1-1.3x measured while a buffer below was still filling). Without the
    train shuffle, whose memory grows with the number of open buckets (up to MAX_BUCKETS, each buffering
    BUCKET_GROUP rows) and then with the bucket size: bounded for a given size, not flat."""
    import subprocess
    import sys

    peaks, sizes, arrow = [], [], []
    for rows in (100_000, 400_000):
        src = tmp_path / f"s{rows}.tsv"
        names = _criteo_layout_tsv(src, rows)
        sizes.append(src.stat().st_size)
        proc = subprocess.run([sys.executable, "-c", _RSS_CHILD, str(src), ",".join(names),
                               str(tmp_path / f"o{rows}")], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        line = [x for x in proc.stdout.splitlines() if x.startswith("RSS_KB")][0].split()
        assert line[2] == "0"
        peaks.append(int(line[1]) * 1024)
        arrow.append(int(line[3]))
        assert json.loads((tmp_path / f"o{rows}" / "summary.json").read_text())["rows"] == rows
        src.unlink()
    growth = peaks[1] - peaks[0]
    more = sizes[1] - sizes[0]
    print(f"peak RSS {peaks[0] / 2**20:.0f} -> {peaks[1] / 2**20:.0f} MB, Arrow pool peak "
          f"{arrow[0] / 2**20:.0f} -> {arrow[1] / 2**20:.0f} MB for source {sizes[0] / 2**20:.0f} -> "
          f"{sizes[1] / 2**20:.0f} MB")
    assert arrow[1] - arrow[0] < 0.05 * more, (arrow, sizes)
    assert growth < 0.6 * more, (peaks, sizes)


# --------------------------------------------------------------------------- --exact-holdout
M64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """splitmix64 on plain Python integers, so that the expected splits do not reuse the importer's code."""
    z = (x + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def _ids(out: Path) -> dict[str, list[int]]:
    return {s: sorted(read(out, s)["example_id"].to_pylist()) for s in SPLITS}


@pytest.mark.parametrize("seed", [0, 7])
def test_exact_holdout_counts_and_rows(tmp_path: Path, seed: int) -> None:
    """Exactly round(frac N) rows per held-out split: test the smallest keys, valid the next ones."""
    n = 1001  # round(0.1 n) = 100, round(0.15 n) = 150, where the threshold rule gives about as many
    make_csv(tmp_path / "log.csv", n=n, seed=3)
    out = tmp_path / "o"
    assert convert("--src", str(tmp_path / "log.csv"), "--format", "csv", "--label", "click",
                   "--infer-schema", "--split", "random", "--exact-holdout", "--valid-frac", "0.15",
                   "--test-frac", "0.1", "--seed", str(seed), "--out", str(out)) == 0
    order = sorted(range(n), key=lambda i: _splitmix64((i + seed * 0x9E3779B97F4A7C15) & M64))
    assert _ids(out) == {"test": sorted(order[:100]), "valid": sorted(order[100:250]),
                         "train": sorted(order[250:])}
    summary = json.loads((out / "summary.json").read_text())
    assert "exact holdout of the 1001 source rows" in summary["split_rule"]
    assert [summary["splits"][s]["rows"] for s in SPLITS] == [751, 150, 100]


def test_exact_holdout_carved_from_the_train_file(tmp_path: Path) -> None:
    """--split files: valid is exactly round(0.1 N_train) train-file rows; the test file is untouched."""
    (tmp_path / "train.csv").write_text("a,y\n" + "".join(f"v{i % 7},{i % 2}\n" for i in range(205)))
    (tmp_path / "test.csv").write_text("a,y\n" + "".join(f"v{i % 9},{i % 2}\n" for i in range(30)))
    out = tmp_path / "o"
    assert convert("--src", f"train={tmp_path / 'train.csv'}", "--src", f"test={tmp_path / 'test.csv'}",
                   "--format", "csv", "--label", "y", "--infer-schema", "--exact-holdout",
                   "--out", str(out)) == 0
    held = sorted(sorted(range(205), key=_splitmix64)[:20])  # round(20.5) = 20 (round half to even)
    assert _ids(out) == {"train": sorted(set(range(205)) - set(held)), "valid": held,
                         "test": list(range(205, 235))}


def test_exact_holdout_spec_round_trip_and_refusals(tmp_path: Path, capsys) -> None:
    make_csv(tmp_path / "log.csv", n=300, seed=4)
    base = ["--src", str(tmp_path / "log.csv"), "--format", "csv"]
    assert convert(*base, "--label", "click", "--infer-schema", "--exact-holdout", "--out",
                   str(tmp_path / "a")) == 0
    spec_path = tmp_path / "a.import.toml"
    assert load_spec(spec_path).exact_holdout is True
    assert "exact_holdout = true" in spec_path.read_text()
    # the spec alone (no flag) gives the same exact split
    assert convert(*base, "--schema", str(spec_path), "--out", str(tmp_path / "b")) == 0
    assert _ids(tmp_path / "a") == _ids(tmp_path / "b")
    assert [len(v) for v in _ids(tmp_path / "a").values()] == [240, 30, 30]
    # without it, the threshold rule: a default spec says false and gives another sample
    assert convert(*base, "--label", "click", "--infer-schema", "--out", str(tmp_path / "c")) == 0
    assert load_spec(tmp_path / "c.import.toml").exact_holdout is False
    assert _ids(tmp_path / "c") != _ids(tmp_path / "a")
    capsys.readouterr()
    # a split that holds nothing out by hash refuses the option in one line
    assert convert(*base, "--label", "click", "--infer-schema", "--time", "t", "--split", "time",
                   "--exact-holdout", "--out", str(tmp_path / "d")) == 2
    err = capsys.readouterr().err
    assert "--split time cuts by time" in err and err.count("\n") == 1, err
    bad = tmp_path / "bad.toml"
    bad.write_text(spec_path.read_text().replace("exact_holdout = true", 'exact_holdout = "yes"'))
    assert convert(*base, "--schema", str(bad), "--out", str(tmp_path / "e")) == 1
    err = capsys.readouterr().err
    assert "bad.toml: exact_holdout must be true or false" in err and err.count("\n") == 1, err


@pytest.mark.realdata
def test_exact_holdout_matches_frappe_adapter_row_for_row(tmp_path: Path) -> None:
    """issue 11: frappe_x1 through the importer holds out the adapter's valid rows, each with its label."""
    src = _data("frappe_x1")
    assert convert("--src", f"train={src / 'valid.libsvm'}", "--src", f"test={src / 'test.libsvm'}",
                   "--format", "libsvm", "--label", "label", "--exact-holdout", "--infer-schema",
                   "--out", str(tmp_path / "t")) == 0
    assert cli_main(["convert", "frappe_x1", "--src", str(src), "--out", str(tmp_path / "a")]) == 0
    for s in SPLITS:  # both number rows by line, valid.libsvm first
        t = read(tmp_path / "t", s).sort_by("example_id")
        a = read(tmp_path / "a", s).sort_by("example_id")
        assert t["example_id"].to_pylist() == a["example_id"].to_pylist(), s
        np.testing.assert_array_equal(t["label"].to_numpy(), a["click"].to_numpy(), err_msg=s)
    assert read(tmp_path / "a", "valid").num_rows == round(0.1 * 57_722)  # SOURCE.md: 57,722 lines


# --------------------------------------------------------------------------- histories written into one cell
def _history_csv(path: Path, n: int = 600) -> list[dict[str, str]]:
    """ad_id, hist_ad_id ('^'-joined ad ids, oldest first, some empty), tags ('|'-joined), a category path
    with one '|' in a few rows, click."""
    rng = np.random.default_rng(3)
    rows = []
    for i in range(n):
        hist = [str(int(x)) for x in rng.integers(0, 40, int(rng.integers(0, 7)))]
        tags = list(rng.choice(["x", "y", "z"], int(rng.integers(0, 3)), replace=False))
        rows.append({"user_id": str(int(rng.integers(0, 90))), "ad_id": str(int(rng.integers(0, 40))),
                     "hist_ad_id": "^".join(hist), "tags": " | ".join(tags),
                     "cat": "a|b" if i in (5, 77) else f"c{i % 9}", "click": str(int(rng.random() < 0.2))})
    return write_csv(path, rows)


def test_joined_histories_are_sequences_sharing_their_items_table(tmp_path: Path) -> None:
    """'^'- and '|'-joined cells become sequences (split, trimmed, empty cells empty); a history named after a
    feature shares that feature's vocabulary and table, so an ad id in a history is the ad's own row; two
    histories never share a table by accident; a value with one '|' in two rows of 600 stays categorical."""
    rows = _history_csv(tmp_path / "h.csv")
    out = tmp_path / "o"
    assert convert("--src", str(tmp_path / "h.csv"), "--label", "click", "--infer-schema", "--out",
                   str(out)) == 0
    spec = load_spec(tmp_path / "o.import.toml")
    assert {(q.name, q.separator, q.share) for q in spec.sequence} == {("hist_ad_id", "^", "ad_id"),
                                                                       ("tags", "|", "")}
    assert [s.name for s in spec.sparse] == ["user_id", "ad_id", "cat"]
    ds = Dataset(out)
    fields = {g.name: g.fields[0] for g in ds.schema.sequences}
    ad = next(f for f in ds.schema.sparse if f.name == "ad_id")
    assert fields["hist_ad_id"].table_name == ad.table_name and fields["hist_ad_id"].vocab == ad.vocab
    assert fields["tags"].table_name == "tags__id"
    t = pa.concat_tables(read(out, s) for s in SPLITS)
    ad_of = {}  # the ad's own id for each raw ad value
    for r, a in zip(t["example_id"].to_pylist(), t["ad_id"].to_pylist()):
        ad_of.setdefault(rows[r]["ad_id"], a)
    tag_lens = [len(x) for x in t["tags__id"].to_pylist()]
    for r, hist, k in zip(t["example_id"].to_pylist(), t["hist_ad_id__id"].to_pylist(), tag_lens):
        want = rows[r]["hist_ad_id"].split("^") if rows[r]["hist_ad_id"] else []
        assert len(hist) == len(want) and k == len([x for x in rows[r]["tags"].split("|") if x.strip()])
        assert all(ad_of[v] == h for v, h in zip(want, hist) if v in ad_of and ad_of[v] != 0)
    assert 0 in tag_lens and 0 in [len(x) for x in t["hist_ad_id__id"].to_pylist()]
    # match_recent = k on the shared history declares the schema's counts of events equal to the ad
    for q in spec.sequence:
        q.match_recent = 4 if q.share else 0
    spec.save(tmp_path / "m.toml")
    assert convert("--src", str(tmp_path / "h.csv"), "--schema", str(tmp_path / "m.toml"), "--out",
                   str(tmp_path / "m")) == 0
    matched = Dataset(tmp_path / "m").schema
    assert [(m.sequence, m.field, m.feature, m.recent) for m in matched.match_features] == [
        ("hist_ad_id", "id", "ad_id", 4)]
    batch = next(iter(ParquetLoader(Dataset(tmp_path / "m").files("@train"), matched, 64, drop_last=False)))
    assert batch.dense.shape == (64, 2) and batch.dense[:, 0].max() > 0


def test_separator_and_share_spec_errors_and_a_parquet_history_of_int_ids(tmp_path: Path, capsys) -> None:
    _history_csv(tmp_path / "h.csv", 60)
    assert convert("--src", str(tmp_path / "h.csv"), "--label", "click", "--infer-schema", "--out",
                   str(tmp_path / "o")) == 0
    text = (tmp_path / "o.import.toml").read_text()
    capsys.readouterr()
    cat = 'name = "cat", dim = 0, hash = false, multi_valued = false, vocab = 0, separator = '
    for bad, where in ((text.replace('share = "ad_id"', 'share = "nope"'), "sequence[0].share: 'nope'"),
                       (text.replace(cat + '""', cat + '"|"'), "has a separator but multi_valued")):
        assert bad != text
        (tmp_path / "bad.toml").write_text(bad)
        assert convert("--src", str(tmp_path / "h.csv"), "--schema", str(tmp_path / "bad.toml"), "--out",
                       str(tmp_path / "x")) == 1
        err = capsys.readouterr().err
        assert where in err and err.count("\n") == 1, err
    # Parquet: integer ads, a history of the same ids as joined text; the spec says how to read it
    src = pa.table({"ad": pa.array([3, 5, 7, 3] * 20, pa.int64()),
                    "hist": ["5^7", "", "3", "7^3^5"] * 20, "click": [1.0, 0.0, 0.0, 1.0] * 20})
    pq.write_table(src, tmp_path / "p.parquet")
    (tmp_path / "p.toml").write_text('name = "p"\nlabels = ["click"]\nsparse = [{ name = "ad" }]\n'
                                     'sequence = [{ name = "hist", separator = "^", share = "ad" }]\n')
    assert convert("--src", str(tmp_path / "p.parquet"), "--schema", str(tmp_path / "p.toml"), "--out",
                   str(tmp_path / "p")) == 0
    t = pa.concat_tables(read(tmp_path / "p", s) for s in SPLITS)
    got = {r % 4: (a, h) for r, a, h in zip(t["example_id"].to_pylist(), t["ad"].to_pylist(),
                                             t["hist__id"].to_pylist())}
    ids = {3: got[0][0], 5: got[1][0], 7: got[2][0]}  # each ad value's id in the ad column
    assert len(set(ids.values())) == 3 and 0 not in ids.values()
    assert [got[i][1] for i in range(4)] == [[ids[5], ids[7]], [], [ids[3]], [ids[7], ids[3], ids[5]]]
    src2 = src.set_column(1, "hist", pa.array(["5^x", "", "3", "7"] * 20))
    pq.write_table(src2, tmp_path / "p2.parquet")
    assert convert("--src", str(tmp_path / "p2.parquet"), "--schema", str(tmp_path / "p.toml"), "--out",
                   str(tmp_path / "p2")) == 1
    err = capsys.readouterr().err
    assert "column 'hist' (a sequence sharing the vocabulary of 'ad') holds values that are not int64" in err
    assert err.count("\n") == 1


def test_a_history_shares_the_named_feature_its_events_are_values_of() -> None:
    """The name proposes (``item_id`` or its stem ``item`` in the history's name), the sampled values choose:
    a user id whose numbers overlap less loses to the item id; events of no named feature share nothing."""
    sample = pa.record_batch({"item_id": ["1", "2", "3", "4"], "user_id": ["1", "2", "3", "9"],
                              "user_item_history": ["1^2", "3", "", "2^4"], "item_history": ["4", "", "", ""],
                              "clicks": ["1^2", "3", "", ""], "user_history": ["7^8", "8", "", ""]})
    sparse = [SparseSpec("user_id"), SparseSpec("item_id")]
    got = {n: infer_share(sample, SequenceSpec(n, separator="^"), sparse)
           for n in ("user_item_history", "item_history", "clicks", "user_history")}
    assert got == {"user_item_history": "item_id", "item_history": "item_id", "clicks": "",
                   "user_history": ""}


# --------------------------------------------------------------------------- new rows through fitted encoders
def _log_with_surfaces(path: Path, n: int = 900) -> list[dict[str, str]]:
    rng = np.random.default_rng(5)
    rows = []
    for i in range(n):
        click = int(rng.random() < 0.3)
        rows.append({"user": f"u{int(rng.zipf(1.5)) % 300}", "ad": str(int(rng.integers(0, 30))),
                     "price": "" if rng.random() < 0.1 else f"{rng.normal(5, 2):.3f}",
                     "hist_ad": "^".join(str(int(x)) for x in rng.integers(0, 30, int(rng.integers(0, 5)))),
                     "place": ["feed", "search"][i % 2], "t": str(i), "click": str(click),
                     "conv": str(int(rng.random() < 0.2)) if click else ""})
    return write_csv(path, rows)


def test_new_rows_through_the_fitted_encoders_equal_their_converted_twins(tmp_path: Path, capsys,
                                                                          monkeypatch) -> None:
    """`--encoders DATASET` re-encodes rows DATASET holds exactly as DATASET has them (ids, OOV rows,
    standardised prices, histories, surfaces, labels; only the row numbers are new), keeps DATASET's schema
    and encoders, writes a label column the new rows lack as unobserved, and refuses what it cannot do.
    Its first pass only counts: no value of the new rows is tallied into a vocabulary it would throw away,
    also when they go to the train split."""
    rows = _log_with_surfaces(tmp_path / "log.csv")
    base = tmp_path / "base"
    assert convert("--src", str(tmp_path / "log.csv"), "--label", "click,conv", "--time", "t", "--surface",
                   "place", "--infer-schema", "--out", str(base)) == 0

    def no_tally(*_a, **_k):
        raise AssertionError("convert table --encoders tallied values into a vocabulary")

    monkeypatch.setattr(vocab.CategoryCounter, "update", no_tally)
    monkeypatch.setattr(vocab.DenseStats, "update", no_tally)
    old = read(base, "test")
    picked = old["example_id"].to_pylist()  # source row numbers
    fields = list(rows[0])
    unlabelled = [f for f in fields if f not in ("click", "conv")]
    for name, keep in (("with_labels", fields), ("no_labels", unlabelled)):
        with open(tmp_path / f"{name}.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keep, extrasaction="ignore")
            w.writeheader()
            w.writerows(rows[r] for r in picked)
        assert convert("--src", str(tmp_path / f"{name}.csv"), "--encoders", str(base), "--out",
                       str(tmp_path / name)) == 0
        new = read(tmp_path / name, "test")
        assert new.num_rows == old.num_rows and read(tmp_path / name, "train").num_rows == 0
        assert new["example_id"].to_pylist() == list(range(len(picked)))  # new rows, new row numbers
        for c in [c for c in old.column_names if c not in ("example_id", "ts")]:
            if name == "no_labels" and c in ("click", "conv"):
                assert new[c].null_count == new.num_rows, c  # unobserved
            else:
                assert new[c].to_pylist() == old[c].to_pylist(), c
        assert (tmp_path / name / "schema.toml").read_text() == (base / "schema.toml").read_text()
        assert json.loads((tmp_path / name / "encoders.json").read_text()) == json.loads(
            (base / "encoders.json").read_text())
    assert convert("--src", str(tmp_path / "no_labels.csv"), "--encoders", str(base), "--split-name", "train",
                   "--out", str(tmp_path / "as_train")) == 0
    assert read(tmp_path / "as_train", "train")["ad"].to_pylist() == old["ad"].to_pylist()
    assert 0 in old["user"].to_pylist() and old["conv"].null_count > 0  # OOV users and unobserved labels
    summary = json.loads((tmp_path / "no_labels" / "summary.json").read_text())
    assert summary["unobserved_labels"] == ["click", "conv"] and summary["encoders_from"] == str(base)
    capsys.readouterr()
    # a surface the encoders never saw: one line naming the file and row; nothing written
    lines = (tmp_path / "with_labels.csv").read_text().splitlines()
    lines[3] = lines[3].replace(",feed,", ",video,").replace(",search,", ",video,")
    (tmp_path / "odd.csv").write_text("\n".join(lines) + "\n")
    assert convert("--src", str(tmp_path / "odd.csv"), "--encoders", str(base), "--out",
                   str(tmp_path / "o")) == 1
    err = capsys.readouterr().err
    assert "odd.csv: line 4, column 'place' (surface): 'video' is not one of" in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()
    for args, where in ((["--encoders", str(base), "--label", "click"], "--label would fit or override"),
                        (["--encoders", str(tmp_path / "nowhere")], "no encoders.json and schema.toml"),
                        (["--split-name", "valid", "--label", "click", "--infer-schema"], "--split-name goes "
                                                                                          "with --encoders")):
        assert convert("--src", str(tmp_path / "odd.csv"), *args, "--out", str(tmp_path / "o")) == 2
        err = capsys.readouterr().err
        assert where in err and err.count("\n") == 1, err


def test_match_recent_needs_a_shared_history() -> None:
    spec = ImportSpec(name="x", labels=["click"], sparse=[SparseSpec("ad")],
                      sequence=[SequenceSpec("tags", separator="|", match_recent=2)])
    with pytest.raises(SchemaError, match=r"sequence\[0\].match_recent must be .* > 0 only with share"):
        check_spec(spec, "spec")
    spec.sequence[0].share = "ad"
    check_spec(spec, "spec")
