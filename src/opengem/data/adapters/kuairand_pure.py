"""KuaiRand-Pure (14 days of the standard exposure log) -> canonical Parquet.

Split by ``time_ms`` at Beijing-time (UTC+8) midnights: train = time_ms < 2022-05-06 00:00,
valid = 2022-05-06, test = 2022-05-07 .. 2022-05-08 (the end of the log). The log's own ``date`` column
is not used for the split because its clock disagrees with ``time_ms`` by up to ~2 h around midnight,
which would make the splits overlap in time (and ``ts`` is ``time_ms``).

Surfaces are the app ``tab``; tabs with < 1 % of the *training* rows are merged into one ``other``
surface. Tasks: is_click, long_view, is_like.

Every row carries the user's history of strictly earlier exposures (``time_ms`` smaller than the
row's), oldest first, last ``max_len`` kept: video id (sharing the ``video`` table with the ranked
video), tab, an action code ``1 + is_click + 2 * long_view`` and log1p hours since the event. Histories
cross split boundaries on purpose: at serving time every earlier exposure is known.
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
    log1p_dense,
    make_table,
    read_csv,
    read_parquet,
    require_files,
    sparse_specs,
    take_columns,
    write_dataset,
)
from opengem.data.schema import FeatureSchema

LOGS = ("log_standard_20220425_20220430.parquet", "log_standard_20220501_20220508.parquet")
USERS = "user_features_pure.csv"
VIDEOS = "video_features_basic_pure.csv"
UTC8_MS = 8 * 3600 * 1000
VALID_START_MS = int(np.datetime64("2022-05-06", "ms").astype(np.int64)) - UTC8_MS
TEST_START_MS = int(np.datetime64("2022-05-07", "ms").astype(np.int64)) - UTC8_MS
TASKS = ("is_click", "long_view", "is_like")
MIN_SURFACE_SHARE = 0.01
LOG_COLUMNS = ["user_id", "video_id", "hourmin", "time_ms", "tab", *TASKS]
USER_SPARSE = [
    "user_active_degree", "is_lowactive_period", "is_live_streamer", "is_video_author",
    "follow_user_num_range", "fans_user_num_range", "friend_user_num_range", "register_days_range",
    *[f"onehot_feat{i}" for i in range(18)],
]
USER_DENSE = ["follow_user_num", "fans_user_num", "friend_user_num", "register_days"]
VIDEO_SPARSE = ["author_id", "video_type", "upload_type", "music_id", "music_type"]
SPLIT_RULE = (
    f"time split on time_ms at UTC+8 midnights: train = time_ms < {VALID_START_MS} (log start 2022-04-25 .. "
    f"2022-05-05), valid = {VALID_START_MS} <= time_ms < {TEST_START_MS} (2022-05-06), test = time_ms >= "
    f"{TEST_START_MS} (2022-05-07 .. 2022-05-08); rows sorted by (time_ms, user_id, video_id), "
    "example_id = that order; ts = time_ms"
)


def _lookup(table: pa.Table, key: str, keys: np.ndarray) -> pa.Table:
    """Rows of a feature table for each key (null row, so id 0 / dense 0, where the key has none)."""
    pos = pc.index_in(pa.array(keys), value_set=table[key].combine_chunks())
    return table.take(pos)


def convert(src: str | Path, out: str | Path, limit: int | None = None, max_len: int = 100,
            force: bool = False) -> dict[str, Any]:
    src = Path(src)
    require_files(src, [*LOGS, USERS, VIDEOS])
    bad = BadRows()
    log = pa.concat_tables([read_parquet(src / f, columns=LOG_COLUMNS) for f in LOGS])
    for c in LOG_COLUMNS:
        if log[c].null_count:
            raise AdapterError(f"{src}: log column {c!r} has {log[c].null_count} nulls")
    keep = first_users_limit(log["user_id"].to_numpy(), limit)
    log = log.filter(pa.array(keep))
    order = np.lexsort((log["video_id"].to_numpy(), log["user_id"].to_numpy(), log["time_ms"].to_numpy()))
    log = log.take(pa.array(order))
    n = log.num_rows
    cuts = np.array([VALID_START_MS, TEST_START_MS])
    split = np.searchsorted(cuts, log["time_ms"].to_numpy(), side="right")
    train = split == 0
    if not train.any():
        raise AdapterError(f"{src}: no rows before 2022-05-06 (time_ms < {VALID_START_MS})")

    user_id = log["user_id"].to_numpy()
    video_id = log["video_id"].to_numpy()
    ts = log["time_ms"].to_numpy()
    tab = log["tab"].to_numpy()

    # Surfaces: tabs with at least 1 % of the training rows, the rest merged into "other".
    tabs, counts = np.unique(tab[train], return_counts=True)
    big = [int(t) for t, c in zip(tabs, counts) if c >= MIN_SURFACE_SHARE * train.sum()]
    surfaces = [f"tab{t}" for t in big] + ["other"]
    surface_of_tab = np.full(max(int(tab.max()), max(big)) + 1, len(big), np.int32)
    surface_of_tab[big] = np.arange(len(big), dtype=np.int32)
    surface = surface_of_tab[tab]

    cols: dict[str, Any] = {"example_id": np.arange(n, dtype=np.int64), "ts": ts, "surface": surface}
    vocabs: dict[str, int] = {}

    def sparse(name: str, arr: pa.Array | pa.ChunkedArray) -> None:
        cols[name], vocabs[name] = encode_on_train(arr, train)

    sparse("user_id", log["user_id"])
    sparse("video_id", log["video_id"])
    cols["hour"] = (log["hourmin"].to_numpy() // 100 + 1).astype(np.int64)
    vocabs["hour"] = 25
    sparse("tab", log["tab"])

    users = read_csv(src / USERS, bad, "not the KuaiRand user feature CSV")
    urows = _lookup(users, "user_id", user_id)
    for c in USER_SPARSE:
        sparse(f"u_{c}", urows[c])
    dense: dict[str, np.ndarray] = {}
    for c in USER_DENSE:
        dense[f"u_{c}_log"], _ = log1p_dense(urows[c])

    video_types = {"tag": pa.string(), "music_id": pa.int64(), "author_id": pa.int64()}
    videos = read_csv(src / VIDEOS, bad, "not the KuaiRand video feature CSV",
                      convert_options=pcsv.ConvertOptions(column_types=video_types))
    vrows = _lookup(videos, "video_id", video_id)
    for c in VIDEO_SPARSE:
        sparse(f"v_{c}", vrows[c])
    tags = pc.split_pattern(vrows["tag"], ",")
    cols["v_tag"], vocabs["v_tag"] = encode_list_on_train(tags, train)
    dense["v_duration_log"], dense["v_duration_missing"] = log1p_dense(
        pc.divide(pc.cast(vrows["video_duration"], pa.float64()), 1000.0))

    labels = {t: log[t].to_numpy().astype(np.float32) for t in TASKS}
    hist = build_history(user_id, ts, max_len)
    action = 1 + log["is_click"].to_numpy() + 2 * log["long_view"].to_numpy()
    dense["hist_len_log"] = np.log1p(hist.n_earlier).astype(np.float32)
    cols.update(dense)
    cols.update(labels)

    schema = FeatureSchema.from_dict({
        "name": "kuairand_pure",
        "surfaces": surfaces,
        "sparse": sparse_specs(vocabs, dims={"user_id": 32, "video_id": 32}, multi=["v_tag"],
                               tables={"video_id": "video"}),
        "dense": [{"name": k} for k in dense],
        "sequence": [{
            "name": "hist", "max_len": max_len, "fields": [
                {"name": "video", "vocab": vocabs["video_id"], "dim": 32, "table": "video"},
                {"name": "tab", "vocab": vocabs["tab"], "dim": 4, "table": "tab"},
                {"name": "action", "vocab": 5, "dim": 4},
                {"name": "dt", "kind": "dense"},
            ],
        }],
        "task": [{"name": t} for t in TASKS],
    }, source="kuairand_pure adapter")

    tables = {}
    for i, name in enumerate(("train", "valid", "test")):
        rows = np.flatnonzero(split == i)
        part = take_columns(cols, rows)
        sub = hist.take(rows)
        part["hist__video"] = sub.field(cols["video_id"])
        part["hist__tab"] = sub.field(cols["tab"])
        part["hist__action"] = sub.field(action)
        part["hist__dt"] = sub.time_delta_hours(ts, seconds_per_unit=1e-3)
        tables[name] = make_table(schema, part, f"kuairand_pure/{name}")
    return write_dataset(out, schema, tables, SPLIT_RULE, extra={
        "source": str(src), "limit": limit, "history": f"strictly earlier time_ms, last {max_len}",
        "surface_rule": f"tab with >= {MIN_SURFACE_SHARE:.0%} of train rows, others -> 'other'",
    }, force=force, bad=bad)
