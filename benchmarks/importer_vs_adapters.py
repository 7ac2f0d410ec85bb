"""The generic importer against the named adapters, from the same raw files: rows and label rates per split.

    .venv/bin/python benchmarks/importer_vs_adapters.py [--data ../shared/data] [--out DIR] [--only NAME]

For each real dataset in the data folder that an adapter covers, runs ``opengem convert NAME`` and
``opengem convert table`` with the split rule closest to the adapter's, and prints one table row per
split. MovieLens's label (rating >= 4) is derived by the importer too (``--label like=rating>=4``) and
its time split uses the same quantile positions. Where a split cannot match by construction, the
"note" column says why. Frappe: the adapter holds out exactly round(0.1 N) train-pool lines, those with
the smallest splitmix64(line); the importer's ``--exact-holdout`` is that rule (with the default seed 0),
so the valid rows are the same lines. Without it the importer holds out each line whose
u = splitmix64(splitmix64(line) ^ seed) / 2**64 is below 0.1: another sample (5,779 rows, not 5,772).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from opengem.cli import main as cli_main
from opengem.data.adapters import data_root
from opengem.data.adapters.kuairand_pure import TEST_START_MS, VALID_START_MS

CRITEO_COLUMNS = ",".join(["label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27))])


def importer_args(name: str, src: Path) -> tuple[list[str], str, str] | str:
    """(convert table arguments, importer label, adapter task), or why the dataset is not comparable."""
    if name == "criteo_kaggle_head":
        return (["--src", f"train={src / 'train.tsv'}", "--src", f"valid={src / 'dev.tsv'}", "--src",
                 f"test={src / 'test.tsv'}", "--format", "tsv", "--columns", CRITEO_COLUMNS,
                 "--label", "label"], "label", "click")
    if name == "avazu_head":
        return (["--src", f"train={src / 'train.csv'}", "--src", f"valid={src / 'dev.csv'}", "--src",
                 f"test={src / 'test.csv'}", "--format", "csv", "--label", "click"], "click", "click")
    if name == "frappe_x1":  # adapter: valid.libsvm minus a hashed 10 % -> train/valid; test.libsvm -> test
        return (["--src", f"train={src / 'valid.libsvm'}", "--src", f"test={src / 'test.libsvm'}",
                 "--format", "libsvm", "--label", "label", "--valid-frac", "0.1", "--exact-holdout"],
                "label", "click")
    if name == "kuairand_pure":  # the adapter's UTC+8 midnights, given as fixed time cuts
        return (["--src", str(src / "log_standard_*.parquet"), "--format", "parquet", "--label",
                 "is_click", "--time", "time_ms", "--split", "time", "--time-cuts",
                 f"{VALID_START_MS},{TEST_START_MS}"], "is_click", "is_click")
    if name == "movielens_100k":  # u.data: user, item, rating, unix time; no header
        return (["--src", str(src / "u.data"), "--format", "tsv", "--columns", "user,item,rating,ts",
                 "--label", "like=rating>=4", "--time", "ts", "--split", "time"], "like", "like")
    if name == "movielens_latest_small":
        return (["--src", str(src / "ratings.csv"), "--format", "csv", "--label", "like=rating>=4",
                 "--time", "timestamp", "--split", "time"], "like", "like")
    return "no importer recipe"


NOTES: dict[str, str] = {}  # dataset -> why a split cannot match by construction (none at present)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", default=str(data_root()))
    p.add_argument("--out", default="/tmp/importer_vs_adapters")
    p.add_argument("--only", action="append", help="only this dataset (repeatable; default: all)")
    args = p.parse_args()
    data, out = Path(args.data), Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    rows = []
    for name in ("criteo_kaggle_head", "avazu_head", "frappe_x1", "kuairand_pure", "movielens_100k",
                 "movielens_latest_small"):
        if args.only and name not in args.only:
            continue
        src = data / name
        if not src.is_dir():
            rows.append(f"| {name} | - | absent from {data} | | | | | |")
            continue
        recipe = importer_args(name, src)
        if isinstance(recipe, str):
            rows.append(f"| {name} | - | not comparable: {recipe} | | | | | |")
            continue
        targs, label, task = recipe
        assert cli_main(["convert", name, "--src", str(src), "--out", str(out / name / "adapter")]) == 0
        table_out = str(out / name / "table")
        assert cli_main(["convert", "table", *targs, "--infer-schema", "--out", table_out]) == 0
        a = json.loads((out / name / "adapter" / "summary.json").read_text())
        t = json.loads((out / name / "table" / "summary.json").read_text())
        for split in ("train", "valid", "test"):
            sa, st = a["splits"][split], t["splits"][split]
            ra, rt = sa["label_rates"][task], st["label_rates"][label]
            same = "same" if sa["rows"] == st["rows"] and ra == rt else "differs"
            note = NOTES.get(name, "") if same == "differs" else ""
            rows.append(f"| {name} | {split} | {sa['rows']:,} | {st['rows']:,} | {ra:.6f} | {rt:.6f} "
                        f"| {same} | {note} |")
    print("| dataset | split | adapter rows | importer rows | adapter label rate | importer label rate | "
          "match | note |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
