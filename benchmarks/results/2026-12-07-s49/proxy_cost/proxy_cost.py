"""Proxies at equal cost (issue 14, item 3): one full-rows seed against rows-cut proxies, each scored
against the same held-out full seeds.

Usage: python proxy_cost.py ABLATION_RUNS_CSV ROWS2_RUNS_CSV NARROW_RUNS_CSV -- the ablation_runs.csv of
session 48's ablation/ (full runs + the rows x 0.25 proxy) and proxy2/ (rows x 0.5), and of session 49's
narrow/ (d / 2).
"""

import csv
import itertools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "src"))
from opengem.bench.fit import spearman  # noqa: E402


def load(path: str, proxy: str) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for r in csv.DictReader(open(path)):
        if r["proxy"] == proxy:
            out.setdefault(r["config"], {})[int(r["seed"])] = float(r["test_ne"])
    return out


full = load(sys.argv[1], "")
rows4 = load(sys.argv[1], "rows4")
rows2 = load(sys.argv[2], "rows2")
narrow = load(sys.argv[3], "narrow2")
names = sorted(full)
seeds = sorted(next(iter(full.values())))
rng = np.random.default_rng(0)


def mean_over(d: dict[str, dict[int, float]], ss: list[int]) -> np.ndarray:
    return np.array([float(np.mean([d[n][s] for s in ss])) for n in names])


def agreement(pairs: list, n: int = 2000) -> tuple[float, float, float]:
    """rho averaged over the (proxy seeds, held-out full seeds) pairs; bootstrap over configurations."""
    P = [mean_over(*p) for p, _ in pairs]
    T = [mean_over(full, t) for _, t in pairs]
    point = float(np.mean([spearman(p, t) for p, t in zip(P, T)]))
    samples = []
    for _ in range(n):
        pick = rng.integers(0, len(names), len(names))
        samples.append(np.nanmean([spearman(p[pick], t[pick]) for p, t in zip(P, T)]))
    return point, float(np.nanquantile(samples, 0.025)), float(np.nanquantile(samples, 0.975))


def others(*used: int) -> list[int]:
    return [t for t in seeds if t not in used]


cases = [
    ("full rows, 1 seed (vs the other 4)", 0.2, [((full, [s]), others(s)) for s in seeds]),
    ("full rows, 2 seeds (vs the other 3)", 0.4,
     [((full, list(c)), others(*c)) for c in itertools.combinations(seeds, 2)]),
    ("d / 2 (4 -> 2), full rows, 3 seeds", 0.6 * 0.618,
     [((narrow, [0, 1, 2]), others(s)) for s in seeds]),
    ("d / 2, full rows, 1 seed", 0.2 * 0.618, [((narrow, [k]), others(s)) for s in seeds for k in (0, 1, 2)]),
    ("rows x 0.5, 3 seeds", 0.3, [((rows2, [0, 1, 2]), others(s)) for s in seeds]),
    ("rows x 0.5, 1 seed", 0.1, [((rows2, [k]), others(s)) for s in seeds for k in (0, 1, 2)]),
    ("rows x 0.25, 3 seeds", 0.15, [((rows4, [0, 1, 2]), others(s)) for s in seeds]),
    ("rows x 0.25, 1 seed", 0.05, [((rows4, [k]), others(s)) for s in seeds for k in (0, 1, 2)]),
]
print("| proxy | cost (share of the 5-seed full runs) | Spearman vs held-out full seeds | 95 % |")
print("|---|---|---|---|")
for label, cost, pairs in cases:
    rho, lo, hi = agreement(pairs)
    print(f"| {label} | {cost:.2f} | {rho:.2f} | [{lo:.2f}, {hi:.2f}] |")
print(f"\n{len(names)} configurations, full seeds {seeds}. Target: mean test NE of 4 full seeds (3 for the "
      "2-seed row) the proxy does not use, averaged over every such split; 95 %: 2,000 resamples of the "
      "configurations, the same resample for every split.")
