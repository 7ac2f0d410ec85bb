"""The simulator's world: hash-derived entities, drifting user intent, behaviour histories and labels.

Every per-user and per-ad property (latent factors, home topics, country, quality ...) is a pure function
of (seed, id) computed with a 64-bit hash, so a vocabulary of 10^7 costs no memory and a user looks the
same in every chunk without any table. Only per-impression randomness (which user, which ad, history
noise, label draws) comes from a seeded generator per chunk, which keeps generation streaming and
deterministic.

The world, in one paragraph: ads belong to topics (topic = ad id mod T, ad = rank * T + topic with a
Zipf rank inside each topic). A user has three home topics (long-term interest) and a short-term intent
that changes every few hours (a hash of user and intent epoch). History events take their topic from
the intent of their own epoch or from long-term interest, so the last events reveal the current intent
and older ones the long-term mix. The click logit is a sum of named terms (``click_terms``):
surface-specific intercepts; sequence terms (recent-intent match in the last ``recent_k`` events, past
engagement with the ad's topic, long-term affinity); a 2-way interaction between a user vector built from
visible user attributes (age, country, device) and an ad vector built from visible ad attributes (topic,
format, objective), with weights that rotate day by day per surface, and a 3-way version crossed with
(surface, format, age) -- high-order *feature crosses* a model can learn from a few hundred thousand rows;
categorical crosses, drifting topic popularity, ad quality; and per-id terms (latent user x ad
interaction, user and ad biases) scaled by ``id_weight``, which only a model that sees each id many times
can learn. Conversion (after a click) has its own terms.

Production-log dynamics (``SimConfig``'s dynamics knobs; all off by default, which leaves the stream bit for
bit as it was). Each models a property of real ads logs:

- ``ad_lifetime_days``: ads enter and leave the inventory -- campaigns and creatives turn over within days
  (each popularity slot gets a new ad id every lifetime, slots staggered), so a model keeps meeting ad ids
  it has never seen (cold start) and ids it memorised go away.
- ``new_advertiser_frac``: advertisers onboard continuously; a new advertiser's ids are cold.
- ``interest_period_days``: users' long-term interests drift over weeks (one home topic at a time).
- ``drift_rad_per_day`` (existing): the value of a feature cross changes over time (concept drift).
- ``hour_rate_amp`` / ``weekly_rate_amp``: click-through follows the hour of the day and the day of week.
- ``traffic_cycle_amp``: each surface has its own daily traffic peak (e.g. messaging in the evening).
- ``surface_signal_contrast``: surfaces differ in which signals predict a click (search and messaging are
  intent- and sequence-driven, feed on attribute crosses, video on per-id memory), beside their base rates
  (the surface table's intercepts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from opengem.data.sim_config import N_ACTIONS, SimConfig

U64 = np.uint64
_GOLD = U64(0x9E3779B97F4A7C15)
_M1 = U64(0xBF58476D1CE4E5B9)
_M2 = U64(0x94D049BB133111EB)
_MASK = (1 << 64) - 1
N_HOME = 3
HOME_W = np.array([0.5, 0.3, 0.2])
INV_BINS = 1 << 16  # inverse-CDF lookup resolution: a table lookup is ~10x faster than searchsorted
DAY = 86400

# Per-surface behaviour for the first four (named) surfaces; later surfaces draw from the same ranges.
# traffic share, click intercept, recent-intent weight, long-term weight, 2-way, 3-way, quality,
# conversion intercept, hour-of-day phase, past-engagement weight.
_SURFACE_TABLE = np.array([
    # share  b_clk  beta  gamma alpha tau   qual  b_cvr  phase  eng
    [0.40, -5.45, 1.6, 0.8, 0.8, 0.7, 1.0, -3.6, 0.0, 0.6],   # feed
    [0.25, -6.10, 2.2, 0.5, 0.6, 0.9, 0.6, -3.9, 1.0, 0.4],   # stories
    [0.20, -5.45, 2.8, 0.6, 0.7, 0.8, 0.8, -3.8, 2.0, 0.8],   # video
    [0.15, -6.50, 0.8, 1.5, 1.0, 0.6, 1.5, -3.2, 3.0, 0.5],   # messaging
])
ENGAGE_ACTIONS = (1, 3, 4)  # organic engage, ad click, ad conversion


def inverse_table(cdf: np.ndarray) -> np.ndarray:
    """Category of each of INV_BINS equal-probability bins (error per category <= 1/INV_BINS)."""
    mid = (np.arange(INV_BINS) + 0.5) / INV_BINS * cdf[-1]
    return np.minimum(np.searchsorted(cdf, mid, side="right"), len(cdf) - 1).astype(np.int64)


def surface_params(n: int) -> np.ndarray:
    """[n, 10] behaviour table; fixed (not seeded) so a named surface keeps its character across seeds."""
    rows = [_SURFACE_TABLE[i] for i in range(min(n, len(_SURFACE_TABLE)))]
    rng = np.random.default_rng(1234)
    lo, hi = _SURFACE_TABLE.min(0), _SURFACE_TABLE.max(0)
    for _ in range(len(rows), n):
        rows.append(rng.uniform(lo, hi))
    p = np.array(rows, dtype=np.float64)
    p[:, 0] /= p[:, 0].sum()
    return p


# --------------------------------------------------------------------------- hashing helpers
def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser (wrapping uint64 arithmetic)."""
    x = x ^ (x >> U64(30))
    x = x * _M1
    x = x ^ (x >> U64(27))
    x = x * _M2
    return x ^ (x >> U64(31))


def _salt(seed: int, tag: int) -> U64:
    x = (seed * 0x632BE59BD9B4E019 + tag * 0x9E3779B97F4A7C15 + 0x1234567) & _MASK
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _MASK
    x ^= x >> 27
    return U64(x)


def _u64(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return a.view(U64) if a.dtype == np.int64 else a.astype(U64)  # a view: no copy for int64 ids


class Hasher:
    """Seeded hash of one or two integer keys to uint64, uniforms and normals."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def h(self, tag: int, a: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        with np.errstate(over="ignore"):
            x = _mix(_u64(a) * _GOLD ^ _salt(self.seed, tag))
            if b is not None:
                x = _mix(x ^ (_u64(b) * _M2))
        return x

    def uniform(self, tag: int, a: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        return (self.h(tag, a, b) >> U64(11)).astype(np.float64) * (1.0 / (1 << 53))

    def normal(self, tag: int, a: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        x = self.h(tag, a, b)
        u1 = ((x >> U64(40)).astype(np.float64) + 0.5) * (1.0 / (1 << 24))
        u2 = (x & U64(0xFFFFFF)).astype(np.float64) * (1.0 / (1 << 24))
        return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)

    def latent(self, tag: int, ids: np.ndarray, dim: int) -> np.ndarray:
        """[n, dim] unit-variance uniform latents (uniform on [-sqrt 3, sqrt 3]) of ids."""
        k = np.arange(dim, dtype=np.int64)
        u = self.uniform(tag, ids[:, None], k[None, :])
        return (u * 2.0 - 1.0) * math.sqrt(3.0)


def zipf_rank(u: np.ndarray, vocab: np.ndarray | int, s: float) -> np.ndarray:
    """Inverse CDF of a continuous power law on [1, V+1): rank 0 is the most popular (int64)."""
    v = np.asarray(vocab, dtype=np.float64)
    if abs(s - 1.0) < 1e-9:
        x = np.power(v + 1.0, u)
    else:
        a = 1.0 - s
        x = np.power(u * (np.power(v + 1.0, a) - 1.0) + 1.0, 1.0 / a)
    r = np.floor(x).astype(np.int64) - 1
    return np.clip(r, 0, np.asarray(vocab, dtype=np.int64) - 1)


# tags: one per hashed property, so properties are independent
T_USER_LAT, T_AD_LAT, T_USER_LAT2, T_AD_LAT2, T_HOME, T_ACT, T_AGE, T_COUNTRY, T_DEVICE = range(9)
T_INTENT, T_INTENT2, T_PERIOD, T_PHASE, T_FAVSURF, T_ADV, T_OBJ, T_FMT, T_QUAL, T_BID = range(9, 19)
T_UBIAS, T_ABIAS, T_XCROSS, T_CCROSS, T_WA, T_WB, T_TOPIC_PERM, T_TDRIFT, T_INTERESTS, T_FMTB = range(19, 29)
T_NINT, T_WPHASE = 29, 30
T_LAGE, T_LCTRY, T_LDEV, T_LTOPIC, T_LFMT, T_LOBJ = range(31, 37)
T_HOMEPHASE, T_NEWADV, T_WEEKPHASE, T_SLOTPHASE = range(37, 41)

# surface_signal_contrast: the signal group each named surface leans on (later surfaces: s mod 3)
SIGNAL_GROUPS = {
    "sequence": ("recent", "engaged", "affinity"),
    "cross": ("cross2", "cross3", "cat_cross", "fmt_bias"),
    "id": ("id_latent", "user_bias", "ad_bias"),
}
_SURFACE_LEAN = ("cross", "sequence", "id", "sequence")  # feed, stories, video, messaging


@dataclass
class Chunk:
    """One generated chunk: column arrays (flat + offsets for list columns) and true probabilities."""

    day: int
    columns: dict[str, np.ndarray]
    offsets: dict[str, np.ndarray]  # list column -> int32 offsets
    p_click: np.ndarray
    p_conversion: np.ndarray
    click: np.ndarray
    conversion: np.ndarray
    conv_observed: np.ndarray
    click_terms: dict[str, np.ndarray] | None = None  # the click logit's named terms (diagnostics)


class World:
    """Everything derived from (config, seed) that does not depend on the impression."""

    def __init__(self, cfg: SimConfig) -> None:
        cfg.validate()
        self.cfg = cfg
        self.H = Hasher(cfg.seed)
        self.sp = surface_params(cfg.surfaces)
        T = cfg.topics
        t = np.arange(T)
        # topic popularity: Zipf weights over a seeded permutation of topics
        order = np.argsort(self.H.uniform(T_TOPIC_PERM, t))
        w = np.empty(T)
        w[order] = (np.arange(T) + 1.0) ** (-cfg.zipf_topics)
        self.topic_logw = np.log(w / w.sum())
        self.base_inv = inverse_table(np.cumsum(w / w.sum()))
        self.topic_period = 5.0 + 25.0 * self.H.uniform(T_TDRIFT, t)  # days
        self.topic_phase = 2 * np.pi * self.H.uniform(T_TDRIFT, t, np.full(T, 7))
        self.ads_per_topic = (cfg.ads - t + T - 1) // T  # ads with id % T == t
        self._za = 1.0 - cfg.zipf_ads
        vp1 = self.ads_per_topic + 1.0
        self._zc = vp1 if abs(self._za) < 1e-9 else np.power(vp1, self._za) - 1.0
        k = np.arange(cfg.latent_dim)
        S = cfg.surfaces
        s_idx = np.arange(S)
        self.w_a = self.H.normal(T_WA, s_idx[:, None], k[None, :])  # [S, k] day-0 weights
        self.w_b = self.H.normal(T_WB, s_idx[:, None], k[None, :])  # direction they rotate toward
        self.w_phase = 2 * np.pi * self.H.uniform(T_WPHASE, s_idx)
        self.obj_cvr = np.linspace(-1.0, 1.5, cfg.objectives) if cfg.objectives > 1 else np.zeros(1)
        self.obj_bid = np.exp(np.linspace(0.0, 1.2, cfg.objectives))
        self.signal_mult = signal_multipliers(cfg.surfaces, cfg.surface_signal_contrast)
        self.week_phase = 2 * np.pi * float(self.H.uniform(T_WEEKPHASE, np.zeros(1, np.int64))[0])

    # ----------------------------------------------------------------- ads entering over time
    def ad_slots(self, topic: np.ndarray) -> np.ndarray:
        """Ad slots per topic: slot r (Zipf popularity rank r) hosts one ad at a time, replaced every
        ad_lifetime_days at a per-slot phase; generations g = 0..G-1 cover the stream (ids g * slots + r)."""
        gens = int(math.floor(self.cfg.days / self.cfg.ad_lifetime_days)) + 2
        return np.maximum(self.ads_per_topic[topic] // gens, 1)

    def _slot_phase(self, topic: np.ndarray, slot: np.ndarray) -> np.ndarray:
        return self.H.uniform(T_SLOTPHASE, topic, slot)

    def ad_birth_day(self, ad: np.ndarray) -> np.ndarray:
        """Day (relative to start_ts; <= 0 for the first generation) on which ``ad`` starts getting
        impressions; it gets them for ad_lifetime_days from then."""
        ad = np.asarray(ad, dtype=np.int64)
        topic, i = ad % self.cfg.topics, ad // self.cfg.topics
        v = self.ad_slots(topic)
        g, r = i // v, i % v
        return (g - self._slot_phase(topic, r)) * self.cfg.ad_lifetime_days

    def live_ad_in_topic(self, topic: np.ndarray, u: np.ndarray, tday: np.ndarray) -> np.ndarray:
        """The ad alive on (fractional) day ``tday`` in the Zipf-ranked slot ``u`` picks: popularity belongs
        to the slot, so an ad keeps its rank for its life and its successor inherits it (a new creative of
        a campaign). A history event from before day 0 may show the slot's first-generation ad."""
        v = self.ad_slots(topic)
        r = zipf_rank(u, v, self.cfg.zipf_ads)
        g = np.maximum(np.floor(tday / self.cfg.ad_lifetime_days + self._slot_phase(topic, r)), 0)
        return (g.astype(np.int64) * v + r) * self.cfg.topics + topic

    def pick_ad(self, topic: np.ndarray, u: np.ndarray, tday: np.ndarray) -> np.ndarray:
        if self.cfg.ad_lifetime_days > 0:
            return self.live_ad_in_topic(topic, u, tday)
        return self.ad_in_topic(topic, u)

    def advertiser_of(self, ad: np.ndarray) -> np.ndarray:
        """Advertiser of each ad; with new_advertiser_frac > 0 that share of ads born during the stream
        belongs to an advertiser who joined by the ad's birth (advertisers join evenly over the days)."""
        cfg = self.cfg
        est = zipf_rank(self.H.uniform(T_ADV, ad), cfg.advertisers, 1.0)
        if cfg.new_advertiser_frac <= 0:
            return est
        n_old = max(1, int(math.ceil(cfg.advertisers * (1 - cfg.new_advertiser_frac))))
        n_new = cfg.advertisers - n_old
        if n_new <= 0:
            return est
        est = zipf_rank(self.H.uniform(T_ADV, ad), n_old, 1.0)
        born = np.clip(self.ad_birth_day(ad) / cfg.days, 0.0, 1.0)
        joined = np.floor(n_new * born).astype(np.int64)  # new advertisers that exist at the ad's birth
        u = self.H.uniform(T_NEWADV, ad)
        new = n_old + np.minimum((u / cfg.new_advertiser_frac * joined).astype(np.int64),
                                 np.maximum(joined - 1, 0))
        return np.where((u < cfg.new_advertiser_frac) & (joined > 0), new, est)

    # ----------------------------------------------------------------- visible-attribute latents
    def _attr(self, tag: int, ids: np.ndarray) -> np.ndarray:
        return self.H.latent(tag, np.asarray(ids, dtype=np.int64), self.cfg.latent_dim)

    def user_attr_vec(self, age: np.ndarray, country: np.ndarray, device: np.ndarray) -> np.ndarray:
        """[n, K] unit-variance user vector from visible attributes: its products are feature crosses."""
        v = self._attr(T_LAGE, age) + self._attr(T_LCTRY, country) + self._attr(T_LDEV, device)
        return v / math.sqrt(3)

    def ad_attr_vec(self, topic: np.ndarray, fmt: np.ndarray, objective: np.ndarray) -> np.ndarray:
        """[n, K] unit-variance ad vector from visible attributes (topic, format, objective)."""
        v = self._attr(T_LTOPIC, topic) + self._attr(T_LFMT, fmt) + self._attr(T_LOBJ, objective)
        return v / math.sqrt(3)

    def rotating_weights(self, s: np.ndarray, tday: np.ndarray) -> np.ndarray:
        """[n, K] per-surface interaction weights, rotating at drift_rad_per_day (concept drift)."""
        theta = self.cfg.drift_rad_per_day * tday + self.w_phase[s]
        return np.cos(theta)[:, None] * self.w_a[s] + np.sin(theta)[:, None] * self.w_b[s]

    # ----------------------------------------------------------------- topics
    def topic_drift(self, topic: np.ndarray, tday: np.ndarray | float) -> np.ndarray:
        return np.sin(2 * np.pi * tday / self.topic_period[topic] + self.topic_phase[topic])

    def day_probs(self, tday: float) -> np.ndarray:
        """Topic popularity on (fractional) day ``tday``: base Zipf reweighted by each topic's cycle."""
        logw = self.topic_logw + 0.7 * self.topic_drift(np.arange(self.cfg.topics), tday)
        w = np.exp(logw - logw.max())
        return w / w.sum()

    def sample_topic(self, u: np.ndarray, table: np.ndarray) -> np.ndarray:
        """Topic for uniforms ``u`` from an inverse-CDF lookup table (see ``inverse_table``)."""
        return table[(u * INV_BINS).astype(np.int64)]

    def home_topics(self, user: np.ndarray, tday: np.ndarray | None = None) -> np.ndarray:
        """[n, 3] long-term interest topics (weights HOME_W), drawn from base popularity.

        With interest_period_days > 0 each slot is redrawn once per period, at a per-user, per-slot phase,
        so a user's interests change one topic at a time (``tday``: the impression's day)."""
        j = np.arange(N_HOME)
        P = self.cfg.interest_period_days
        if P <= 0 or tday is None:
            return self.sample_topic(self.H.uniform(T_HOME, user[:, None], j[None, :]), self.base_inv)
        phase = self.H.uniform(T_HOMEPHASE, user[:, None], j[None, :])
        epoch = np.floor(np.asarray(tday)[:, None] / P + phase).astype(np.int64)
        key = j[None, :] + N_HOME * epoch
        return self.sample_topic(self.H.uniform(T_HOME, user[:, None], key), self.base_inv)

    def pick_home(self, home: np.ndarray, u: np.ndarray) -> np.ndarray:
        idx = (u > HOME_W[0]).astype(np.int64) + (u > HOME_W[0] + HOME_W[1])
        return np.take_along_axis(home, idx[:, None], 1)[:, 0]

    def intent(self, user: np.ndarray, epoch: np.ndarray, home: np.ndarray) -> np.ndarray:
        """Short-term intent topic of a user in an intent epoch: a home topic 60 %, else a popular one."""
        u1 = self.H.uniform(T_INTENT, user, epoch)
        u2 = self.H.uniform(T_INTENT2, user, epoch)
        from_home = u1 < 0.6
        hm = self.pick_home(home, u1 / 0.6)
        other = self.sample_topic(u2, self.base_inv)
        return np.where(from_home, hm, other)

    def ad_in_topic(self, topic: np.ndarray, u: np.ndarray) -> np.ndarray:
        """Zipf rank inside the topic (zipf_rank with the per-topic power precomputed), then the ad id."""
        v = self.ads_per_topic[topic]
        if abs(self._za) < 1e-9:
            x = np.power(self._zc[topic], u)
        else:
            x = np.power(u * self._zc[topic] + 1.0, 1.0 / self._za)
        r = np.minimum(x.astype(np.int64) - 1, v - 1)
        return r * self.cfg.topics + topic


def signal_multipliers(n_surfaces: int, contrast: float) -> np.ndarray | None:
    """[S, n_terms] weights per surface and click term (None when contrast is 0: terms stay untouched).

    Surface s leans on its group (x (1 + contrast)) and away from the other two (x (1 - contrast / 2))."""
    if contrast <= 0:
        return None
    names = [t for g in SIGNAL_GROUPS.values() for t in g]
    out = np.ones((n_surfaces, len(names)))
    for s in range(n_surfaces):
        lean = _SURFACE_LEAN[s] if s < len(_SURFACE_LEAN) else tuple(SIGNAL_GROUPS)[s % 3]
        for k, name in enumerate(names):
            out[s, k] = 1 + contrast if name in SIGNAL_GROUPS[lean] else 1 - contrast / 2
    return out


def click_terms(world: World, *, s: np.ndarray, tday: np.ndarray, user: np.ndarray, ad: np.ndarray,
                ad_topic: np.ndarray, fmt: np.ndarray, objective: np.ndarray, age: np.ndarray,
                country: np.ndarray, device: np.ndarray, quality: np.ndarray, act: np.ndarray,
                recent_frac: np.ndarray, engaged_n: np.ndarray,
                affinity: np.ndarray) -> dict[str, np.ndarray]:
    """The click logit's terms (already weighted; the logit is intercept + hour + click_scale * their sum).

    Named so that diagnostics (benchmarks/sim_learnability.py) can say how much NE each kind of signal is
    worth: sequence terms (``recent``, ``engaged``, ``affinity``), feature crosses (``cross2``,
    ``cross3``, ``cat_cross``, ``fmt_bias``), dense (``quality``, ``activity``), drift (``topic_drift``)
    and per-id terms (``id_latent``, ``user_bias``, ``ad_bias``), which need many rows per id to learn.
    """
    cfg, H, sp = world.cfg, world.H, world.sp
    K = cfg.latent_dim
    w2 = world.rotating_weights(s, tday)
    ua = world.user_attr_vec(age, country, device)
    aa = world.ad_attr_vec(ad_topic, fmt, objective)
    uva = ua * aa
    c3 = H.latent(T_XCROSS, (s * cfg.formats + fmt) * cfg.age_buckets + age, K)
    uvec = H.latent(T_USER_LAT, user, K)
    avec = H.latent(T_AD_LAT, ad, K)
    idw = cfg.id_weight
    terms = {
        "recent": sp[s, 2] * recent_frac,
        "engaged": sp[s, 9] * np.log1p(engaged_n),
        "affinity": sp[s, 3] * affinity,
        "cross2": sp[s, 4] * (uva * w2).sum(1) / math.sqrt(K),
        "cross3": sp[s, 5] * (uva * c3).sum(1) / math.sqrt(K),
        "cat_cross": 0.3 * H.normal(T_CCROSS, country * cfg.topics + ad_topic),
        "fmt_bias": 0.4 * H.normal(T_FMTB, s * cfg.formats + fmt),
        "quality": sp[s, 6] * (quality - 0.5),
        "activity": 0.2 * np.log(act),
        "topic_drift": 0.5 * world.topic_drift(ad_topic, tday),
        "id_latent": idw * sp[s, 4] * (uvec * avec * w2).sum(1) / math.sqrt(K),
        "user_bias": idw * 0.4 * H.normal(T_UBIAS, user),
        "ad_bias": idw * 0.3 * H.normal(T_ABIAS, ad),
    }
    if world.signal_mult is not None:
        names = [t for g in SIGNAL_GROUPS.values() for t in g]
        for k, name in enumerate(names):
            terms[name] = terms[name] * world.signal_mult[s, k]
    return terms


def day_bounds(cfg: SimConfig) -> np.ndarray:
    """Row index where each day starts (length days + 1); rows are split evenly across days."""
    return np.round(np.arange(cfg.days + 1) * (cfg.rows / cfg.days)).astype(np.int64)


def chunk_plan(cfg: SimConfig) -> list[tuple[int, int, int]]:
    """(day, first row, end row) of every chunk; chunks never straddle a day."""
    b = day_bounds(cfg)
    plan = []
    for d in range(cfg.days):
        for s in range(int(b[d]), int(b[d + 1]), cfg.chunk_rows):
            plan.append((d, s, min(s + cfg.chunk_rows, int(b[d + 1]))))
    return plan


def generate_chunk(world: World, day: int, r0: int, r1: int, chunk_index: int) -> Chunk:
    cfg, H, sp = world.cfg, world.H, world.sp
    rng = np.random.default_rng([cfg.seed, 7, chunk_index])
    n = r1 - r0
    K = cfg.latent_dim
    b = day_bounds(cfg)
    nd = int(b[day + 1] - b[day])

    # --- time: evenly spread rows, warped so traffic peaks mid-day; monotone in row index
    x = (np.arange(r0, r1) - b[day] + rng.random(n)) / nd
    warp = x - 0.5 * np.sin(2 * np.pi * x) / (2 * np.pi)
    ts = cfg.start_ts + day * DAY + np.floor(warp * DAY).astype(np.int64)
    tday = (ts - cfg.start_ts) / DAY
    hour = ((ts - cfg.start_ts) % DAY) / 3600.0
    end_ts = cfg.start_ts + cfg.days * DAY

    # --- surface and user
    u_surface = rng.random(n)
    if cfg.traffic_cycle_amp > 0:  # each surface's share peaks at its own hour (phase: the surface table)
        w = sp[:, 0] * np.exp(cfg.traffic_cycle_amp * np.sin(2 * np.pi * hour[:, None] / 24.0 + sp[:, 8]))
        cdf = np.cumsum(w, 1) / w.sum(1, keepdims=True)
        surface = np.minimum((u_surface[:, None] >= cdf).sum(1), cfg.surfaces - 1)
    else:
        surface = np.minimum(np.searchsorted(np.cumsum(sp[:, 0]), u_surface, side="right"), cfg.surfaces - 1)
    user = zipf_rank(rng.random(n), cfg.users, cfg.zipf_users)
    home = world.home_topics(user, tday)
    act = np.exp(0.5 * H.normal(T_ACT, user) - 0.125)  # mean-one activity level
    age = (H.h(T_AGE, user) % U64(cfg.age_buckets)).astype(np.int64)
    country = zipf_rank(H.uniform(T_COUNTRY, user), cfg.countries, 1.2)
    device = (H.h(T_DEVICE, user) % U64(cfg.devices)).astype(np.int64)
    period = (6.0 + 30.0 * H.uniform(T_PERIOD, user)) * 3600.0
    phase = H.uniform(T_PHASE, user) * period
    fav_surface = (H.h(T_FAVSURF, user) % U64(cfg.surfaces)).astype(np.int64)
    cur_intent = world.intent(user, np.floor((ts + phase) / period).astype(np.int64), home)

    # --- interests: the first 1..interests_max of (home topics, then hashed extras), some replaced by noise
    n_int = 1 + (H.h(T_NINT, user) % U64(cfg.interests_max)).astype(np.int64)
    j = np.arange(cfg.interests_max)
    extra = world.sample_topic(H.uniform(T_INTERESTS, user[:, None], j[None, :]), world.base_inv)
    cand = np.where(j[None, :] < N_HOME, np.pad(home, ((0, 0), (0, max(0, cfg.interests_max - N_HOME))))
                    [:, : cfg.interests_max], extra)
    noisy = H.uniform(T_INTERESTS, user[:, None], j[None, :] + 100) < 0.2
    cand = np.where(noisy, extra, cand)
    int_mask = j[None, :] < n_int[:, None]
    interests = cand[int_mask]
    int_off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(n_int, out=int_off[1:])

    # --- history: jagged lengths, event times, topics from epoch intent or long-term interest
    L = np.rint(cfg.seq_mean * act * np.exp(0.6 * rng.standard_normal(n) - 0.18)).astype(np.int64)
    L = np.clip(L, 0, cfg.seq_max)
    off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(L, out=off[1:])
    ne = int(off[-1])
    row = np.repeat(np.arange(n), L)
    gaps = rng.exponential(1.0, ne) * (cfg.gap_mean_s / act)[row]
    csum = np.zeros(ne + 1)
    np.cumsum(gaps, out=csum[1:])
    dt = csum[off[1:]][row] - csum[:-1]  # seconds before the impression, oldest first => decreasing
    recency = off[1:][row] - 1 - np.arange(ne)  # 0 = most recent event
    ev_epoch = np.floor((ts[row] - dt + phase[row]) / period[row]).astype(np.int64)
    # events are time-ordered inside a row, so each row holds a few runs of one epoch: hash once per run
    new_run = np.ones(ne, dtype=bool)
    new_run[1:] = (ev_epoch[1:] != ev_epoch[:-1]) | (row[1:] != row[:-1])
    run_id = np.cumsum(new_run) - 1
    starts = np.flatnonzero(new_run)
    ev_intent = world.intent(user[row[starts]], ev_epoch[starts], home[row[starts]])[run_id]
    u_ev = rng.random((3, ne))
    hidx = (u_ev[2] > HOME_W[0]).astype(np.int64) + (u_ev[2] > HOME_W[0] + HOME_W[1])
    home_flat = home.ravel()
    longterm = np.where(u_ev[1] < 0.6, home_flat[row * N_HOME + hidx],
                        world.sample_topic(u_ev[2], world.base_inv))
    ev_topic = np.where(u_ev[0] < 0.75, ev_intent, longterm)
    ev_item = world.pick_ad(ev_topic, rng.random(ne), tday[row] - dt / DAY)
    in_home = ((ev_topic == home_flat[row * N_HOME]) | (ev_topic == home_flat[row * N_HOME + 1])
               | (ev_topic == home_flat[row * N_HOME + 2]))
    u_act = rng.random((2, ne))
    is_ad = u_act[0] < 0.3
    organic = (u_act[1] < 0.1 + 0.25 * in_home).astype(np.int64)  # 0 view, 1 engage
    ad_act = np.where(u_act[1] < 0.02 + 0.08 * in_home, np.where(u_act[1] < 0.008 * (1 + in_home), 4, 3), 2)
    ev_action = np.where(is_ad, ad_act, organic)
    surf_inv = inverse_table(np.cumsum(sp[:, 0]))
    any_surface = surf_inv[(rng.random(ne) * INV_BINS).astype(np.int64)]
    ev_surface = np.where(rng.random(ne) < 0.6, fav_surface[row], any_surface)
    del u_ev, u_act, ev_epoch, ev_intent, longterm, gaps, csum, run_id, new_run

    # --- the ranked ad: targeted at current intent, long-term interest or trending topics
    u_ad = rng.random((3, n))
    trending = world.sample_topic(u_ad[1], inverse_table(np.cumsum(world.day_probs(day + 0.5))))
    ad_topic = np.where(u_ad[0] < 0.3, cur_intent,
                        np.where(u_ad[0] < 0.5, world.pick_home(home, u_ad[1]), trending))
    ad = world.pick_ad(ad_topic, u_ad[2], tday)
    advertiser = world.advertiser_of(ad)
    objective = (H.h(T_OBJ, advertiser) % U64(cfg.objectives)).astype(np.int64)
    fmt = (H.h(T_FMT, ad) % U64(cfg.formats)).astype(np.int64)
    quality = H.uniform(T_QUAL, ad) ** 0.7
    bid = np.exp(0.5 * H.normal(T_BID, ad)) * world.obj_bid[objective]

    # --- click logit
    recent = (recency < cfg.recent_k) & (ev_topic == np.repeat(ad_topic, L))
    k_eff = np.maximum(np.minimum(L, cfg.recent_k), 1)
    recent_frac = np.bincount(row[recent], minlength=n) / k_eff
    engaged = (ev_topic == np.repeat(ad_topic, L)) & np.isin(ev_action, ENGAGE_ACTIONS)
    engaged_n = np.bincount(row[engaged], minlength=n).astype(np.float64)
    affinity = (home == ad_topic[:, None]) @ HOME_W
    s = surface
    terms = click_terms(world, s=s, tday=tday, user=user, ad=ad, ad_topic=ad_topic, fmt=fmt,
                        objective=objective, age=age, country=country, device=device, quality=quality,
                        act=act, recent_frac=recent_frac, engaged_n=engaged_n, affinity=affinity)
    signal = sum(terms.values())
    hour_eff = cfg.hour_rate_amp * np.sin(2 * np.pi * hour / 24.0 + sp[s, 8])
    if cfg.weekly_rate_amp > 0:
        hour_eff = hour_eff + cfg.weekly_rate_amp * np.sin(2 * np.pi * tday / 7.0 + world.week_phase)
    p_click = 1.0 / (1.0 + np.exp(-(sp[s, 1] + cfg.click_bias + hour_eff + cfg.click_scale * signal)))
    fmt_bias = H.normal(T_FMTB, surface * cfg.formats + fmt)
    abias = H.normal(T_ABIAS, ad)

    # --- conversion given click: objective, own latent interaction, intent, surface
    u2 = H.latent(T_USER_LAT2, user, K)
    a2 = H.latent(T_AD_LAT2, ad, K)
    ua, aa = world.user_attr_vec(age, country, device), world.ad_attr_vec(ad_topic, fmt, objective)
    cvr_logit = (sp[s, 7] + world.obj_cvr[objective] + 0.8 * cfg.id_weight * (u2 * a2).sum(1) / math.sqrt(K)
                 + 0.6 * (ua[:, ::-1] * aa).sum(1) / math.sqrt(K)
                 + 1.2 * recent_frac + 0.6 * affinity + 0.3 * cfg.id_weight * abias
                 + 0.3 * (age - cfg.age_buckets / 2)
                 / max(cfg.age_buckets, 1) + 0.3 * fmt_bias)
    p_cvr = 1.0 / (1.0 + np.exp(-cvr_logit))
    p_conv = p_click * p_cvr

    u_lab = rng.random((2, n))
    click = u_lab[0] < p_click
    conv = click & (u_lab[1] < p_cvr)
    conv_observed = ts + int(cfg.conv_window_hours * 3600) <= end_ts

    cols = {
        "example_id": np.arange(r0, r1, dtype=np.int64),
        "ts": ts,
        "surface": surface.astype(np.int32),
        "user_id": user,
        "ad_id": ad,
        "advertiser_id": advertiser,
        "campaign_objective": objective,
        "creative_format": fmt,
        "ad_category": ad_topic.astype(np.int64),
        "user_age": age,
        "user_country": country,
        "user_device": device,
        "user_interests": interests.astype(np.int64),
        "ad_quality": quality.astype(np.float32),
        "bid": bid.astype(np.float32),
        "user_activity": act.astype(np.float32),
        "hour_of_day": (hour / 24.0).astype(np.float32),
        "hist__item": ev_item,
        "hist__category": ev_topic.astype(np.int64),
        "hist__action": ev_action.astype(np.int64),
        "hist__surface": ev_surface.astype(np.int64),
        "hist__dt": np.log1p(dt).astype(np.float32),
    }
    assert int(ev_action.max(initial=0)) < N_ACTIONS
    offs = {"user_interests": int_off.astype(np.int32)}
    hist_off = off.astype(np.int32)
    for f in ("item", "category", "action", "surface", "dt"):
        offs[f"hist__{f}"] = hist_off
    return Chunk(day=day, columns=cols, offsets=offs, p_click=p_click, p_conversion=p_conv, click=click,
                 conversion=conv, conv_observed=conv_observed, click_terms=terms)
