"""SimConfig (every simulator knob) and the FeatureSchema the simulator writes.

Kept apart from the generator so that code which only needs the schema of simulated data (tests,
configs, docs) does not import the generator.
"""

from __future__ import annotations

import io
from dataclasses import asdict, dataclass
from functools import cache
from typing import Any

from opengem.config import ConfigError, nonfinite_floats
from opengem.config import from_dict as config_from_dict
from opengem.data.match_features import MatchFeature
from opengem.data.schema import (
    DenseFeature,
    FeatureSchema,
    SequenceField,
    SequenceGroup,
    SparseFeature,
    Task,
)
from opengem.errors import UsageError

SURFACE_NAMES = ("feed", "stories", "video", "messaging", "search", "marketplace", "reels", "notifications")
N_ACTIONS = 5  # 0 organic view, 1 organic engage, 2 ad impression, 3 ad click, 4 ad conversion
START_TS = 1_700_006_400  # 2023-11-15 00:00:00 UTC
# Parquet codecs by the names pyarrow takes; which of them this pyarrow build can write is asked of pyarrow
PARQUET_CODECS = ("none", "snappy", "gzip", "brotli", "lz4", "zstd")


class SimConfigError(UsageError, ValueError):
    pass


@cache
def parquet_codec_ok(name: str) -> bool:
    """True when pyarrow can write a Parquet file with compression ``name`` (pyarrow's own check)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pq.write_table(pa.table({"x": pa.array([], pa.int8())}), io.BytesIO(), compression=name)
    except Exception:  # noqa: BLE001 - pyarrow says no with ArrowException, OSError or ValueError
        return False
    return True


@dataclass
class SimConfig:
    """All simulator knobs; the defaults are the embedded default dataset."""

    rows: int = 200_000
    seed: int = 0
    days: int = 7
    surfaces: int = 4
    users: int = 1_000_000
    ads: int = 100_000
    advertisers: int = 5_000
    topics: int = 200  # ad categories == topics
    objectives: int = 4
    formats: int = 6
    age_buckets: int = 8
    countries: int = 60
    devices: int = 5
    interests_max: int = 5
    seq_mean: float = 100.0
    seq_max: int = 2000
    recent_k: int = 20  # how many latest history events the click model reads for intent match
    latent_dim: int = 8
    emb_dim: int = 16
    zipf_users: float = 0.85  # the busiest user sees ~2 % of impressions at 10^6 users
    zipf_ads: float = 1.1
    zipf_topics: float = 0.9
    gap_mean_s: float = 1800.0  # mean seconds between history events of an average user
    conv_window_hours: float = 12.0  # a conversion label is observable once ts + window <= end
    drift_rad_per_day: float = 0.2  # rotation speed of the latent-interaction weights
    click_scale: float = 1.0  # multiplies every non-intercept click logit term (signal strength)
    # weight of the per-id terms (latent user x ad interaction, user and ad biases): signal that only a model
    # seeing each id many times can learn; the attribute crosses and sequence terms are learnable from far
    # fewer rows (sim_core.click_terms)
    id_weight: float = 0.5
    # added to every surface's click intercept: a higher click rate puts more label information in each
    # row (a recipe with few rows raises it so that models can learn within a CPU budget)
    click_bias: float = 0.0
    chunk_rows: int = 20_000  # rows per generated chunk = Parquet row group
    compression: str = "zstd"
    start_ts: int = START_TS
    # --- production-log dynamics (sim_core.Dynamics). Every default leaves the stream bit for bit what it
    # was before these knobs existed (tests/test_sim_dynamics.py pins a hash), so older studies reproduce.
    # Ads enter and leave: an ad lives this many days from its birth and gets impressions only while alive,
    # newest ads first (0 = every ad lives for the whole stream, the original world).
    ad_lifetime_days: float = 0.0
    # share of new ads that belong to advertisers who join during the stream (needs ad_lifetime_days > 0)
    new_advertiser_frac: float = 0.0
    # each of a user's home topics is redrawn once per this many days, slots staggered (0 = never)
    interest_period_days: float = 0.0
    hour_rate_amp: float = 0.25  # daily cycle of every surface's click base rate (logit amplitude)
    weekly_rate_amp: float = 0.0  # weekly cycle of the click base rate (logit amplitude)
    traffic_cycle_amp: float = 0.0  # daily cycle of each surface's traffic share (log-share amplitude)
    # 0..1: how much each surface leans on one kind of signal (sequence, crosses or ids) and away from the
    # others (0 = the surface table's own weights only)
    surface_signal_contrast: float = 0.0

    # > 0: the schema declares match_features (opengem.data.match_features) of the history against the ranked
    # ad -- hist.item vs ad_id and hist.category vs ad_category, all events and the latest k -- derived when
    # batches are built. A pipeline's feature, not a generative parameter: the rows do not change.
    match_recent: int = 0

    def validate(self, where: str = "") -> None:
        """Refuse a config the simulator cannot run, naming the key (under ``where``, e.g. ``data.sim``)."""

        def need(ok: bool, key: str, msg: str) -> None:
            if not ok:
                name = f"{where}.{key}" if where else key
                raise SimConfigError(f"{name}: {msg} (got {getattr(self, key)!r})")

        for key, _ in nonfinite_floats(self)[:1]:  # NaN passes every comparison below as false, inf some
            need(False, key, "must be a finite number")
        need(self.rows > 0, "rows", "must be > 0")
        need(self.match_recent >= 0, "match_recent", "must be >= 0 (0: no match features)")
        need(self.days > 0, "days", "must be > 0")
        need(self.surfaces >= 1, "surfaces", "must be >= 1")
        for k in ("users", "ads", "advertisers", "topics", "objectives", "formats", "age_buckets",
                  "countries", "devices", "interests_max", "latent_dim", "emb_dim", "chunk_rows", "recent_k"):
            need(getattr(self, k) >= 1, k, "must be >= 1")
        need(self.ads >= self.topics, "ads", f"must be >= topics ({self.topics}): every topic needs an ad")
        need(self.topics >= self.interests_max, "topics",
             f"must be >= interests_max ({self.interests_max}, the most interests a user has)")
        need(self.seq_mean >= 0, "seq_mean", "must be >= 0")
        need(self.seq_max >= 1, "seq_max", "must be >= 1")
        need(self.seq_mean <= self.seq_max, "seq_mean", f"must be <= seq_max ({self.seq_max})")
        need(self.gap_mean_s > 0, "gap_mean_s", "must be > 0")
        need(self.conv_window_hours >= 0, "conv_window_hours", "must be >= 0")
        need(self.id_weight >= 0, "id_weight", "must be >= 0")
        for k in ("zipf_users", "zipf_ads", "zipf_topics"):
            need(self.__dict__[k] > 0, k, "must be > 0")
        for k in ("ad_lifetime_days", "interest_period_days", "hour_rate_amp", "weekly_rate_amp",
                  "traffic_cycle_amp"):
            need(getattr(self, k) >= 0, k, "must be >= 0")
        need(0 <= self.new_advertiser_frac < 1, "new_advertiser_frac", "must be in [0, 1)")
        need(self.new_advertiser_frac == 0 or self.ad_lifetime_days > 0, "new_advertiser_frac",
             "needs ad_lifetime_days > 0 (new advertisers enter with new ads)")
        need(0 <= self.surface_signal_contrast <= 1, "surface_signal_contrast", "must be in [0, 1]")
        if not (isinstance(self.compression, str) and parquet_codec_ok(self.compression)):
            codecs = ", ".join(c for c in PARQUET_CODECS if parquet_codec_ok(c))
            need(False, "compression", f"not a Parquet codec this pyarrow can write; choose one of {codecs}")

    @property
    def surface_names(self) -> list[str]:
        return [SURFACE_NAMES[i] if i < len(SURFACE_NAMES) else f"surface_{i}" for i in range(self.surfaces)]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "data.sim") -> SimConfig:
        """A SimConfig from a config table (``[data.sim]``): an unknown key or a value of the wrong type is a
        SimConfigError naming ``where.key``, and so is a value the simulator cannot run (:meth:`validate`)."""
        try:
            cfg = config_from_dict(cls, d, where)
        except ConfigError as e:
            raise SimConfigError(str(e)) from None
        cfg.validate(where)
        return cfg


def sim_schema(cfg: SimConfig) -> FeatureSchema:
    """The FeatureSchema of simulated data: the ranked ad and history items share table ``item``."""
    d = cfg.emb_dim
    sparse = (
        SparseFeature("user_id", vocab=cfg.users, dim=d),
        SparseFeature("ad_id", vocab=cfg.ads, dim=d, table="item"),
        SparseFeature("advertiser_id", vocab=cfg.advertisers, dim=d),
        SparseFeature("campaign_objective", vocab=cfg.objectives, dim=d),
        SparseFeature("creative_format", vocab=cfg.formats, dim=d),
        SparseFeature("ad_category", vocab=cfg.topics, dim=d, table="category"),
        SparseFeature("user_age", vocab=cfg.age_buckets, dim=d),
        SparseFeature("user_country", vocab=cfg.countries, dim=d),
        SparseFeature("user_device", vocab=cfg.devices, dim=d),
        SparseFeature("user_interests", vocab=cfg.topics, dim=d, multi_valued=True, pooling="mean",
                      table="category"),
    )
    dense = tuple(DenseFeature(n) for n in ("ad_quality", "bid", "user_activity", "hour_of_day"))
    hist = SequenceGroup(
        name="hist",
        max_len=cfg.seq_max,
        fields=(
            SequenceField("item", vocab=cfg.ads, dim=d, table="item"),
            SequenceField("category", vocab=cfg.topics, dim=d, table="category"),
            SequenceField("action", vocab=N_ACTIONS, dim=d),
            SequenceField("surface", vocab=cfg.surfaces, dim=d),
            SequenceField("dt", kind="dense"),
        ),
    )
    # Request-time context (issue 14): a (sin, cos) input for each clock cycle the world generates, as a
    # real system adds one once its logs show the cycle. The weekly one only with weekly_rate_amp > 0: without
    # a cycle it carries nothing but the day index, and over the usual 7 days (test day 6 never seen in
    # training) a model would fit day-to-day drift to it and extrapolate that onto the test day.
    clock = (("hour_of_day",) if cfg.hour_rate_amp > 0 else ()) + (
        ("day_of_week",) if cfg.weekly_rate_amp > 0 else ())
    return FeatureSchema(
        name="sim",
        surfaces=tuple(cfg.surface_names),
        tasks=(Task("click"), Task("conversion")),
        sparse=sparse,
        dense=dense,
        sequences=(hist,),
        time_features=clock,
        match_features=tuple(MatchFeature("hist", f, feature, cfg.match_recent)
                             for f, feature in (("item", "ad_id"), ("category", "ad_category"))
                             if cfg.match_recent),
        extra={"generator": "opengem.data.simulate", "seed": cfg.seed,
               "truth_columns": "p_click, p_conversion in truth/"},
    )
