"""Run an iso-FLOP study's cells PARALLEL at a time, in the order the study's own rule needs them.

`opengem scale --design isoflop` trains one run at a time; on a 2-core host that leaves a core idle. This
driver follows the same rule (opengem.bench.isoflop.run_study, steps 1-3) per (family, budget) cell:
1. seed 0 of the family's size ``lr_size`` at every rate of the grid; the lowest validation NE is the rate;
2. seed 0 of every other size at that rate; the lowest validation NE is the size;
3. seeds 1 .. seeds-1 there;
and trains each run as its own `cell.py` process (opengem.bench.isoflop.train_cell: the study's names, rows
and configs), longest first. Runs already in OUT/runs with the same resolved config are reused, not retrained.
Afterwards `opengem scale --design isoflop --config STUDY_TOML --out OUT --data DATA OVERRIDES` reuses every
run and writes the study's outputs (frontier, laws, efficiency ratio).

    python drive.py STUDY_TOML OUT DATA PARALLEL [OVERRIDE...] > drive.log
"""
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from opengem.bench.isoflop import (
    _batch_size,
    load_isoflop_config,
    plan_grid,
    prepare_study,
    run_name,
    selection_ne,
)

CELL = Path(__file__).resolve().parents[2] / "2026-12-02-s15" / "ladder" / "cell.py"
toml, out, data, parallel, extra = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5:]
cfg = load_isoflop_config(toml)
st = prepare_study(cfg, out, data, extra, lambda m: None)
grid = plan_grid(cfg.budgets, st.fwd, _batch_size(st), st.train_rows, cfg.min_steps, cfg.max_epochs)
plan = {(p.family, p.size, p.budget): p for p in grid}
fams = [f.name for f in cfg.families]
lock = threading.Lock()
ready: list[tuple[str, int, int, float, int]] = []
running: set[str] = set()
failed: list[str] = []


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)


def valid_ne(fam: str, size: int, b: int, lr: float, seed: int) -> float | None:
    p = out / "runs" / run_name(fam, size, b, lr, seed) / "result.json"
    return selection_ne(json.loads(p.read_text())["valid"], cfg.metric) if p.exists() else None


def wanted(fam: str, b: int) -> list[tuple[str, int, int, float, int]]:
    """The runs of (fam, b) whose inputs are known and that have no result yet (the rule's next step)."""
    grid = [(fam, cfg.lr_size, b, lr, 0) for lr in cfg.lr_grid]
    if any(valid_ne(*r) is None for r in grid):
        return [r for r in grid if valid_ne(*r) is None]
    lr = min(cfg.lr_grid, key=lambda x: valid_ne(fam, cfg.lr_size, b, x, 0))
    sizes = [(fam, i, b, lr, 0) for i in range(len(st.sizes[fam]))]
    if any(valid_ne(*r) is None for r in sizes):
        return [r for r in sizes if valid_ne(*r) is None]
    best = min(range(len(st.sizes[fam])), key=lambda i: valid_ne(fam, i, b, lr, 0))
    return [r for r in ((fam, best, b, lr, s) for s in range(1, cfg.seeds)) if valid_ne(*r) is None]


def refill() -> None:
    ready.clear()
    for fam in fams:
        for b in range(len(cfg.budgets)):
            ready.extend(r for r in wanted(fam, b) if run_name(*r) not in running | set(failed))
    ready.sort(key=lambda r: (-r[2], -plan[r[:3]].examples))  # largest budget first, then most rows


def worker() -> None:
    while True:
        with lock:
            refill()
            if not ready:
                if not running:
                    return
                job = None
            else:
                job = ready.pop(0)
                running.add(run_name(*job))
        if job is None:
            time.sleep(5)
            continue
        name = run_name(*job)
        fam, size, b, lr, seed = job
        t0 = time.perf_counter()
        log(f"start {name}")
        with open(out / f"log_{name}.txt", "a") as fh:
            rc = subprocess.call([sys.executable, str(CELL), toml, str(out), data, fam, str(size), str(b),
                                  format(lr, "g"), str(seed), *extra], stdout=fh, stderr=subprocess.STDOUT)
        with lock:
            running.discard(name)
            if rc != 0 or valid_ne(*job) is None:
                failed.append(name)
        log(f"done  {name} rc={rc} valid NE {valid_ne(*job)} {time.perf_counter() - t0:.0f}s")


threads = [threading.Thread(target=worker) for _ in range(parallel)]
for t in threads:
    t.start()
    time.sleep(2)
for t in threads:
    t.join()
log(f"all done; failed: {failed or 'none'}")
sys.exit(1 if failed else 0)
