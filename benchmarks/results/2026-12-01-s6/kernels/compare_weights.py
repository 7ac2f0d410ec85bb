"""Trained weights of two runs side by side (issue 13): which parameters differ, and how much?

Why: the demo's fused and reference runs of one seed see the same rows in the same order and start from
the same weights, so their difference is what the kernels did. Set beside the difference between two seeds
of one kernel, it shows whether the kernels moved some block (a norm, an attention's key bias, a head)
far more than seed noise moves it, or everything alike. Dense parameters only (``open_run``'s model).

Usage: python compare_weights.py RUN_A RUN_B DATA_DIR [RUN_C]   (C: a second seed of A's kernel)
"""

from __future__ import annotations

import sys
import warnings

import torch

from opengem.train.evaluate import open_run
from opengem.train.optim import dense_parameters


def weights(run: str, data: str) -> dict[str, torch.Tensor]:
    with open_run(run, data) as r:
        return {n: p.detach().clone() for n, p in dense_parameters(r.model).items()}


def main(a: str, b: str, data: str, c: str | None) -> None:
    warnings.filterwarnings("ignore", category=FutureWarning)
    wa, wb = weights(a, data), weights(b, data)
    wc = weights(c, data) if c else None
    rows = []
    for n, x in wa.items():
        rel_ab = float((x - wb[n]).norm() / x.norm().clamp(min=1e-12))
        rel_ac = float((x - wc[n]).norm() / x.norm().clamp(min=1e-12)) if wc else float("nan")
        ratio = rel_ab / max(rel_ac, 1e-12) if wc else rel_ab
        rows.append((ratio, rel_ab, rel_ac, float(x.norm()), float(wb[n].norm()), n))
    print(f"A {a}\nB {b}\nC {c}\nratio = |A-B| / |A-C|; sorted by it (largest first)")
    print(f"{'ratio':>7} {'|A-B|/|A|':>10} {'|A-C|/|A|':>10} {'|A|':>9} {'|B|':>9}  parameter")
    for ratio, ab, ac, na, nb, n in sorted(rows, reverse=True):
        print(f"{ratio:7.2f} {ab:10.2e} {ac:10.2e} {na:9.3f} {nb:9.3f}  {n}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else None)
