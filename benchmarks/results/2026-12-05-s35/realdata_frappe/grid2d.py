"""frappe_x1 with the dense and the sparse rate tuned apart (session 35): lr_compare.py scales both together.

Every deep family on one 2-D grid on seed 0: dense lr 1e-3 / 3e-3 x sparse lr 0.05 / 0.15 / 0.5 / 1.5 (the
recipe's 0.05 x 1 / 3 / 10 / 30), one more sparse step (5.0) where the best sits on the top sparse edge and
one dense step (3e-4, at the best's sparse rate) where it sits on the bottom dense edge (a second pass), plus
any other point already in OUT for the family at seed 0 (the coupled grid's winners, copied in: DCNv2's is
dense 0.03, sparse 1.5). The point with the lowest validation NE (epoch by validation NE, never test) wins;
seeds 1-4 run at it; GEM minus each baseline on test, paired by seed. LR is left out (its dense part is a
bias: the coupled grid already tunes its table rate). Runs are lr_compare.py's (same harness, split and early
stopping), one JSON each, reused when present.

    python grid2d.py DATA OUT [--jobs 2]       (DATA: lr_compare.py's converted frappe_x1 folder)
"""
import argparse
import importlib.util
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
spec = importlib.util.spec_from_file_location("lr_compare", REPO / "benchmarks" / "lr_compare.py")
lrc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lrc)
spec = importlib.util.spec_from_file_location("sparse_axis",
                                              Path(__file__).parents[1] / "sparse_axis" / "sparse_axis.py")
sparse_axis = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sparse_axis)

MODELS = ["gem", "dcnv2", "dlrm", "wukong"]
DENSE = [1e-3, 3e-3]
SPARSE = [0.05, 0.15, 0.5, 1.5]
BEYOND = 5.0
BELOW = 3e-4


def path(out: Path, model: str, dense: float, sparse: float, seed: int) -> Path:
    return out / f"{model}_d{dense:g}_s{sparse:g}_seed{seed}.json"


def run(data: Path, out: Path, model: str, dense: float, sparse: float, seed: int) -> None:
    res = path(out, model, dense, sparse, seed)
    if res.exists():
        return
    cmd = lrc.harness_command("frappe_x1", data, res, model, seed, dense, sparse, 0, [])
    print("$", " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def valid(out: Path, model: str, dense: float, sparse: float) -> float:
    r = lrc.load(path(out, model, dense, sparse, 0))
    return lrc.valid_ne(r, "ne") if r else float("inf")


def points(out: Path, model: str) -> list[tuple[float, float]]:
    """Every (dense, sparse) with a seed-0 run of the model in OUT."""
    found = []
    for p in out.glob(f"{model}_d*_s*_seed0.json"):
        dense, sparse = p.name[len(model) + 2:].rsplit("_seed", 1)[0].split("_s")
        found.append((float(dense), float(sparse)))
    return sorted(found)


def best(out: Path, model: str) -> tuple[float, float]:
    return min(points(out, model), key=lambda p: valid(out, model, *p))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("data", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(lambda a: run(args.data, args.out, *a),
                      [(m, d, s, 0) for m in MODELS for d in DENSE for s in SPARSE]))
        edge = [(m, best(args.out, m)[0]) for m in MODELS
                if best(args.out, m)[1] == SPARSE[-1] and best(args.out, m)[0] in DENSE]
        list(pool.map(lambda a: run(args.data, args.out, a[0], a[1], BEYOND, 0), edge))
        low = [(m, BELOW, best(args.out, m)[1], 0) for m in MODELS if best(args.out, m)[0] == DENSE[0]]
        list(pool.map(lambda a: run(args.data, args.out, *a), low))  # a dense step below a bottom-edge best
        chosen = {m: best(args.out, m) for m in MODELS}
        list(pool.map(lambda a: run(args.data, args.out, *a),
                      [(m, *chosen[m], s) for m in MODELS for s in range(1, 5)]))
    print("seed 0, validation NE (epoch by validation NE); rows dense lr, columns sparse lr")
    for m in MODELS:
        pts = points(args.out, m)
        for d in sorted({p[0] for p in pts}):
            cells = [f"s{s:g} {valid(args.out, m, d, s):.4f}" for dd, s in pts if dd == d]
            print(f"  {m:<7} d{d:g}  " + "   ".join(cells))
    print("\ntest all/click at the chosen (dense, sparse), epoch by validation NE, 5 seeds")
    runs = {m: [path(args.out, m, *chosen[m], s) for s in range(5)] for m in MODELS}
    labels = {m: f"dense {chosen[m][0]:g} sparse {chosen[m][1]:g}" for m in MODELS}
    sparse_axis.print_test(runs, "all/click", labels)


if __name__ == "__main__":
    main()
