"""How far a validation sample's NE, and the difference between two runs' NE, lies from the whole day's.

Reads collect_logits.py's output (every row of the validation day, in file order, row groups of 4,096 rows)
and scores the study's metric (mean of pooled click and conversion NE) on: the day's first 16,384 / 65,536
rows (the study until session 46), and k whole row groups spread as data.loader.spread_units spreads them
(the middle unit of each of k equal runs; k = 4, 8, 16, 32 is 16,384 .. 131,072 rows), the spread grid also
shifted by 1..11 row groups for the spread of the estimate.

    python sample_error.py day6_b3.npz
"""

import itertools
import sys

import numpy as np

RG = 4096


def ne(y: np.ndarray, m: np.ndarray, z: np.ndarray, idx: np.ndarray) -> float:
    out = []
    for t in range(y.shape[1]):
        i = idx[m[idx, t]]
        yy, zz = y[i, t], z[i, t]
        loss = np.mean(np.logaddexp(0, zz) - yy * zz)
        p = yy.mean()
        out.append(loss / -(p * np.log(p) + (1 - p) * np.log(1 - p)))
    return float(np.mean(out))


def spread(k: int, n_rows: int, shift: int = 0) -> np.ndarray:
    n = -(-n_rows // RG)
    picks = [((2 * i + 1) * n // (2 * k) + shift) % n for i in range(k)]
    return np.concatenate([np.arange(r * RG, min(n_rows, (r + 1) * RG)) for r in picks])


def main(path: str) -> None:
    d = np.load(path)
    y, m = d["y"], d["m"]
    names = [k for k in d.files if k not in ("y", "m", "s")]
    n = len(y)
    whole = {r: ne(y, m, d[r], np.arange(n)) for r in names}
    samples = {"first 16,384": [np.arange(16384)], "first 65,536": [np.arange(65536)]}
    for k in (4, 8, 16, 32):
        samples[f"spread {k * RG:,}"] = [spread(k, n, s) for s in range(12)]
    one = {s: {r: ne(y, m, d[r], idxs[0]) for r in names} for s, idxs in samples.items()}
    print("validation NE (mean of all/click and all/conversion) per run")
    print("run".ljust(28) + "".join(s.rjust(15) for s in samples) + "whole day".rjust(12))
    for r in names:
        print(r.ljust(28) + "".join(f"{one[s][r]:15.5f}" for s in samples) + f"{whole[r]:12.5f}")

    def fam(prefix: str, vals: dict[str, float]) -> float:
        return float(np.mean([v for r, v in vals.items() if r.startswith(prefix)]))

    print("\nthree-seed mean differences (the study's size rule compares these)")
    pairs = [("gem-s4", "dcnv2-s0"), ("gem-s4", "gem-s0"), ("dcnv2-s0", "dcnv2-s2"), ("gem-s4", "dlrm-s0")]
    for a, b in pairs:
        print(f"{a} - {b}".ljust(28) + "".join(f"{fam(a, one[s]) - fam(b, one[s]):+15.5f}" for s in samples)
              + f"{fam(a, whole) - fam(b, whole):+12.5f}")
    print("\nrms error of a difference between two runs against the whole day's (every pair of runs; "
          "spread: 12 shifts)")
    for s, idxs in samples.items():
        errs = []
        for idx in idxs:
            v = {r: ne(y, m, d[r], idx) for r in names}
            errs += [(v[a] - v[b]) - (whole[a] - whole[b]) for a, b in itertools.combinations(names, 2)]
        print(f"  {s:<14} {np.sqrt(np.mean(np.square(errs))):.5f}  ({len(errs)} differences)")


if __name__ == "__main__":
    main(sys.argv[1])
