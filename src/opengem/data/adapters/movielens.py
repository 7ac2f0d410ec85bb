"""MovieLens ml-100k and ml-latest-small -> canonical Parquet (one module, two registry names).

Label ``like`` = rating >= 4. Split by time on global timestamp quantiles (80/10/10): with the
timestamps sorted, ``c80`` / ``c90`` are the values at positions floor(0.8 N) / floor(0.9 N);
train = ts < c80, valid = c80 <= ts < c90, test = ts >= c90 (ties at a cut go to the later split,
so the split sizes are within a few rows of 80/10/10; the cuts are recorded in summary.json).
One surface ``all``.

Every row carries the user's strictly earlier ratings (timestamp smaller than the row's), oldest
first, last ``max_len``: movie id (sharing the ``movie`` table with the ranked movie), the rating as an
action code (ml-100k: 1..5; latest-small: 2 x rating, 1..10) and log1p hours since the rating.
Side features: ml-100k age bucket, gender, occupation, zip prefix (3 chars), genres (multi-valued),
release-year bucket (5 years); latest-small genres (multi-valued, movies.csv) and the year from the
title (5-year bucket).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from opengem.data.adapters.common import (
    AdapterError,
    BadRows,
    build_history,
    encode_list_on_train,
    encode_on_train,
    first_users_limit,
    make_table,
    read_csv,
    require_files,
    sparse_specs,
    take_columns,
    write_dataset,
)
from opengem.data.schema import FeatureSchema

GENRES_100K = (
    "unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary", "Drama",
    "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller", "War", "Western",
)
AGE_CUTS = (18, 25, 35, 45, 50, 56)  # the ml-1m age groups
QUANTILES = (0.8, 0.9)


def _read(path: Path, names: list[str] | None, delimiter: str, types: dict[str, pa.DataType],
          bad: BadRows, encoding: str = "utf8") -> pa.Table:
    quote = '"' if delimiter == "," else False  # u.item titles contain bare quotes
    return read_csv(
        path, bad, "cannot parse",
        read_options=pcsv.ReadOptions(column_names=names, encoding=encoding),
        parse_options=pcsv.ParseOptions(delimiter=delimiter, quote_char=quote),
        convert_options=pcsv.ConvertOptions(column_types=types, strings_can_be_null=True),
    )


def _lookup(table: pa.Table, key: str, keys: np.ndarray, path: Path) -> pa.Table:
    pos = pc.index_in(pa.array(keys), value_set=table[key].combine_chunks())
    if pos.null_count:
        missing = keys[np.flatnonzero(pos.is_null().to_numpy(zero_copy_only=False))[0]]
        raise AdapterError(f"{path}: no row for {key} {missing}")
    return table.take(pos)


def _year_bucket(year: pa.Array | pa.ChunkedArray) -> pa.Array:
    y = pc.cast(year, pa.int64())
    return pc.multiply(pc.divide(y, 5), 5)


def _time_split(ts: np.ndarray) -> tuple[np.ndarray, list[int]]:
    s = np.sort(ts)
    cuts = [int(s[int(np.floor(q * len(s)))]) for q in QUANTILES]
    return np.searchsorted(np.array(cuts), ts, side="right").astype(np.int64), cuts


def _convert(name: str, src: Path, out: str | Path, ratings: pa.Table, rating_code: np.ndarray,
             n_codes: int, side: dict[str, pa.Array], multi: list[str], limit: int | None,
             max_len: int, force: bool, bad: BadRows) -> dict[str, Any]:
    """Shared part: ``ratings`` has user, item, rating, ts; ``side`` holds per-rating raw features."""
    keep = first_users_limit(ratings["user"].to_numpy(), limit)
    ratings = ratings.filter(pa.array(keep))
    side = {k: v.filter(pa.array(keep)) for k, v in side.items()}
    rating_code = rating_code[keep]
    user, item = ratings["user"].to_numpy(), ratings["item"].to_numpy()
    ts = ratings["ts"].to_numpy()
    order = np.lexsort((item, user, ts))
    user, item, ts, rating_code = user[order], item[order], ts[order], rating_code[order]
    idx = pa.array(order)
    side = {k: v.take(idx) for k, v in side.items()}
    rating = ratings["rating"].to_numpy()[order]
    n = len(ts)
    split, cuts = _time_split(ts)
    train = split == 0

    cols: dict[str, Any] = {
        "example_id": np.arange(n, dtype=np.int64), "ts": ts.astype(np.int64),
        "surface": np.zeros(n, np.int32), "like": (rating >= 4).astype(np.float32),
    }
    vocabs: dict[str, int] = {}
    cols["user_id"], vocabs["user_id"] = encode_on_train(pa.array(user), train)
    cols["movie_id"], vocabs["movie_id"] = encode_on_train(pa.array(item), train)
    for k, v in side.items():
        if k in multi:
            cols[k], vocabs[k] = encode_list_on_train(v, train)
        else:
            cols[k], vocabs[k] = encode_on_train(v, train)
    hist = build_history(user, ts, max_len)
    cols["hist_len_log"] = np.log1p(hist.n_earlier).astype(np.float32)

    schema = FeatureSchema.from_dict({
        "name": name, "surfaces": ["all"],
        "sparse": sparse_specs(vocabs, dims={"user_id": 32, "movie_id": 32}, multi=multi,
                               tables={"movie_id": "movie"}),
        "dense": [{"name": "hist_len_log"}],
        "sequence": [{
            "name": "hist", "max_len": max_len, "fields": [
                {"name": "movie", "vocab": vocabs["movie_id"], "dim": 32, "table": "movie"},
                {"name": "action", "vocab": n_codes, "dim": 4},
                {"name": "dt", "kind": "dense"},
            ],
        }],
        "task": [{"name": "like"}],
    }, source=f"{name} adapter")
    tables = {}
    for i, split_name in enumerate(("train", "valid", "test")):
        rows = np.flatnonzero(split == i)
        part = take_columns(cols, rows)
        sub = hist.take(rows)
        part["hist__movie"] = sub.field(cols["movie_id"])
        part["hist__action"] = sub.field(rating_code)
        part["hist__dt"] = sub.time_delta_hours(ts)
        tables[split_name] = make_table(schema, part, f"{name}/{split_name}")
    rule = (f"time split on global timestamp quantiles 80/10/10: train = ts < {cuts[0]}, "
            f"valid = {cuts[0]} <= ts < {cuts[1]}, test = ts >= {cuts[1]} (Unix s); label like = rating >= 4")
    return write_dataset(out, schema, tables, rule, extra={
        "source": str(src), "limit": limit, "cuts": cuts,
        "history": f"strictly earlier timestamp, last {max_len}",
    }, force=force, bad=bad)


def convert_100k(src: str | Path, out: str | Path, limit: int | None = None,
                 max_len: int = 100, force: bool = False) -> dict[str, Any]:
    src = Path(src)
    require_files(src, ["u.data", "u.user", "u.item"])
    bad = BadRows()
    ratings = _read(src / "u.data", ["user", "item", "rating", "ts"], "\t",
                    {"user": pa.int64(), "item": pa.int64(), "rating": pa.int64(), "ts": pa.int64()}, bad)
    r = ratings["rating"].to_numpy()
    if ratings["rating"].null_count or not np.isin(r, [1, 2, 3, 4, 5]).all():
        raise AdapterError(f"{src / 'u.data'}: ratings must be integers 1..5")
    users = _read(src / "u.user", ["user", "age", "gender", "occupation", "zip"], "|",
                  {"user": pa.int64(), "age": pa.int64(), "zip": pa.string()}, bad)
    item_names = ["item", "title", "release", "video_release", "url", *[f"g{i}" for i in range(19)]]
    items = _read(src / "u.item", item_names, "|", {"item": pa.int64(), "release": pa.string()}, bad,
                  encoding="latin-1")
    u = _lookup(users, "user", ratings["user"].to_numpy(), src / "u.user")
    it = _lookup(items, "item", ratings["item"].to_numpy(), src / "u.item")
    age_bucket = np.digitize(u["age"].to_numpy(), AGE_CUTS)
    flags = np.stack([it[f"g{i}"].to_numpy() for i in range(19)], axis=1).astype(bool)
    rows, gen = np.nonzero(flags)
    offsets = np.zeros(len(flags) + 1, np.int32)
    np.cumsum(flags.sum(1), out=offsets[1:])
    genres = pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.array(GENRES_100K)[gen]))
    year = pc.utf8_slice_codeunits(it["release"], -4)
    side = {
        "age_bucket": pa.array(age_bucket), "gender": u["gender"], "occupation": u["occupation"],
        "zip3": pc.utf8_upper(pc.utf8_slice_codeunits(u["zip"], 0, 3)), "genres": genres,
        "year_bucket": _year_bucket(year),
    }
    return _convert("movielens_100k", src, out, ratings, r.astype(np.int64), 6, side, ["genres"],
                    limit, max_len, force, bad)


def convert_latest_small(src: str | Path, out: str | Path, limit: int | None = None,
                         max_len: int = 100, force: bool = False) -> dict[str, Any]:
    src = Path(src)
    require_files(src, ["ratings.csv", "movies.csv"])
    bad = BadRows()
    ratings = _read(src / "ratings.csv", None, ",", {"rating": pa.float64()}, bad)
    if ratings.column_names[:4] != ["userId", "movieId", "rating", "timestamp"]:
        raise AdapterError(f"{src / 'ratings.csv'}: header {ratings.column_names} is not "
                           "userId,movieId,rating,timestamp")
    ratings = ratings.rename_columns(["user", "item", "rating", "ts"])
    code = np.round(ratings["rating"].to_numpy() * 2).astype(np.int64)
    if ratings["rating"].null_count or (code < 1).any() or (code > 10).any():
        raise AdapterError(f"{src / 'ratings.csv'}: ratings must be 0.5..5.0")
    movies = _read(src / "movies.csv", None, ",", {"movieId": pa.int64(), "title": pa.string()}, bad)
    m = _lookup(movies, "movieId", ratings["item"].to_numpy(), src / "movies.csv")
    year = pc.struct_field(pc.extract_regex(pc.utf8_trim_whitespace(m["title"]), r"\((?P<y>\d{4})\)$"), [0])
    side = {"genres": pc.split_pattern(m["genres"], "|"), "year_bucket": _year_bucket(year)}
    return _convert("movielens_latest_small", src, out, ratings, code, 11, side, ["genres"], limit, max_len,
                    force, bad)
