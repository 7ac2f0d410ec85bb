"""GEM with its DCNv2 cross branch on frappe_x1, on session 35's 2-D rate grid (session 36).

Session 31 tried the cross branch (``model.gem.cross_layers = 2``, ``cross_rank = 16``, the demo recipe's)
on frappe at the coupled grid's rates, whose table rate session 35 found 3-10x too low for GEM; with the dense
and the table rate tuned apart DCNv2 leads GEM by a resolved margin. Asked here, the protocol fixed before
running: does GEM with the cross branch, tuned on the same 2-D grid by the same rule (``grid2d.py``'s: seed 0,
validation NE, dense 1e-3 / 3e-3 x sparse 0.05 / 0.15 / 0.5 / 1.5, one sparse step past a top-edge best, one
dense step (3e-4 / 1e-2) past a bottom- / top-edge best, seeds 1-4 at the choice), close that gap? Which GEM a
recipe should use is decided on the 5-seed validation mean, never on test.

    python cross_grid.py DATA GRID2D OUT [--jobs 2]

DATA: lr_compare.py's converted frappe_x1; GRID2D: session 35's grid2d.py output folder (GEM, DCNv2, DLRM and
Wukong at their choices, read only); OUT: this arm's runs (``gemx_*`` files, one JSON each, reused).
"""
import argparse
import importlib.util
import statistics
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
S35 = REPO / "benchmarks" / "results" / "2026-12-05-s35"


spec = importlib.util.spec_from_file_location("grid2d", S35 / "realdata_frappe" / "grid2d.py")
grid2d = importlib.util.module_from_spec(spec)
spec.loader.exec_module(grid2d)
lrc, sparse_axis = grid2d.lrc, grid2d.sparse_axis  # the modules grid2d.py itself loaded

ARM = "gemx"  # file prefix of this arm
CROSS = ["model.gem.cross_layers=2", "model.gem.cross_rank=16"]
BASELINES = ["gem", "dcnv2", "dlrm", "wukong"]  # session 35's choices, read from GRID2D
ABOVE = 1e-2  # one dense step past the grid's top edge (grid2d.py never needed it)


def run(data: Path, out: Path, dense: float, sparse: float, seed: int) -> None:
    res = grid2d.path(out, ARM, dense, sparse, seed)
    if res.exists():
        return
    cmd = lrc.harness_command("frappe_x1", data, res, "gem", seed, dense, sparse, 0, CROSS)
    print("$", " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def valid_mean(out: Path, model: str, point: tuple[float, float]) -> float:
    return statistics.mean(lrc.valid_ne(lrc.load(grid2d.path(out, model, *point, s)), "ne") for s in range(5))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("data", type=Path)
    ap.add_argument("grid2d", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)

    def go(points: list[tuple[float, float, int]]) -> None:
        with ThreadPoolExecutor(args.jobs) as pool:
            list(pool.map(lambda p: run(args.data, out, *p), points))

    go([(d, s, 0) for d in grid2d.DENSE for s in grid2d.SPARSE])
    d, s = grid2d.best(out, ARM)
    if s == grid2d.SPARSE[-1] and d in grid2d.DENSE:
        go([(d, grid2d.BEYOND, 0)])
    d, s = grid2d.best(out, ARM)
    if d == grid2d.DENSE[0]:
        go([(grid2d.BELOW, s, 0)])
    elif d == grid2d.DENSE[-1]:  # session 35's winners all sat on the bottom edge; this arm's may not
        go([(ABOVE, s, 0)])
    chosen = grid2d.best(out, ARM)
    go([(*chosen, seed) for seed in range(1, 5)])

    print("GEM + cross branch (rank 16, 2 layers), seed 0 validation NE; rows dense lr, columns sparse lr")
    pts = grid2d.points(out, ARM)
    for dd in sorted({p[0] for p in pts}):
        cells = [f"s{sp:g} {grid2d.valid(out, ARM, dd, sp):.4f}" for d2, sp in pts if d2 == dd]
        print(f"  d{dd:g}  " + "   ".join(cells))
    base = {m: grid2d.best(args.grid2d, m) for m in BASELINES}
    print("\nvalidation NE, mean of seeds 0-4 at each choice (what a recipe may be chosen on)")
    print(f"  GEM + cross   {valid_mean(out, ARM, chosen):.4f}  (dense {chosen[0]:g} sparse {chosen[1]:g})")
    for m in BASELINES:
        d, s = base[m]
        print(f"  {m:<13} {valid_mean(args.grid2d, m, base[m]):.4f}  (dense {d:g} sparse {s:g})")
    print("\ntest all/click, epoch by validation NE, 5 seeds; gem = GEM + cross branch, "
          "gem-nox = session 35's GEM")
    runs = {"gem": [grid2d.path(out, ARM, *chosen, s) for s in range(5)]}
    labels = {"gem": f"dense {chosen[0]:g} sparse {chosen[1]:g}"}
    for m in BASELINES:
        key = "gem-nox" if m == "gem" else m
        runs[key] = [grid2d.path(args.grid2d, m, *base[m], s) for s in range(5)]
        labels[key] = f"dense {base[m][0]:g} sparse {base[m][1]:g}"
    sparse_axis.print_test(runs, "all/click", labels)

if __name__ == "__main__":
    main()
