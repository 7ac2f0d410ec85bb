"""Paired differences of validation and test NE between arms of a screen (session 41's screens).

    python paired_table.py OUT ARM_A-ARM_B [ARM_A-ARM_B ...] > table.md

Each pair: A minus B over the seeds both have (95 % t interval), pooled click, pooled conversion and their
mean (the demo's selection metric); then every arm's NE per seed."""

import json
import sys
from pathlib import Path

import numpy as np

from opengem.bench.fit import mean_ci

TASKS = ("all/click", "all/conversion")


def ne(out: Path, arm: str, seed: int, split: str) -> list[float]:
    m = json.loads((out / f"{arm}_seed{seed}.json").read_text())[split]["metrics"]
    vals = [m[t]["ne"] for t in TASKS]
    return vals + [float(np.mean(vals))]


def cell(d: np.ndarray) -> str:
    if len(d) < 2:
        return f"{d.mean():+.4f}" if len(d) else "-"
    m, h = mean_ci(d)
    lo, hi = m - h, m + h
    star = "**" if hi < 0 or lo > 0 else ""
    return f"{star}{m:+.4f} [{lo:+.4f}, {hi:+.4f}]{star}"


def seeds_of(out: Path, arm: str) -> list[int]:
    return [s for s in range(20) if (out / f"{arm}_seed{s}.json").exists()]


def main() -> None:
    out, pairs = Path(sys.argv[1]), [p.split("-", 1) for p in sys.argv[2:]]
    print("paired 95 % t intervals over the seeds both arms have; bold: excludes 0; "
          "mean = (click + conv) / 2\n")
    print("| comparison | seeds | valid click | valid conv | valid mean | test click | test conv "
          "| test mean |")
    print("|---|---|---|---|---|---|---|---|")
    for a, b in pairs:
        seeds = sorted(set(seeds_of(out, a)) & set(seeds_of(out, b)))
        if not seeds:
            continue
        cells = []
        for split in ("valid", "test"):
            d = np.array([np.subtract(ne(out, a, s, split), ne(out, b, s, split)) for s in seeds])
            cells += [cell(d[:, t]) for t in range(3)]
        print(f"| {a} minus {b} | {','.join(map(str, seeds))} | " + " | ".join(cells) + " |")
    arms = sorted({x for p in pairs for x in p})
    print("\nNE per seed, valid click / conv -> test click / conv:")
    for a in arms:
        runs = [f"{s}: " + " / ".join(f"{v:.4f}" for v in ne(out, a, s, "valid")[:2]) + " -> "
                + " / ".join(f"{v:.4f}" for v in ne(out, a, s, "test")[:2]) for s in seeds_of(out, a)]
        print(f"  {a:14s} " + "; ".join(runs))


if __name__ == "__main__":
    main()
