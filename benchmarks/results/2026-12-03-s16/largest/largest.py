"""Each family's 5e11 compute-optimal size of session 15's ladders, trained at 1.58e12 (budget index 3 of
ladder_b3.toml) through the study's own code (opengem.bench.isoflop.train_cell): seed 0 at two rates (the
one chosen at 5e11 and its neighbour), the better validation NE (the study's metric) chosen, then more seeds
at it. Runs go to OUT/runs/; the stream is simulated into OUT/data once (or read from DATA).

    python largest.py OUT DATA FAMILY:SIZE:RATE,RATE [FAMILY:SIZE:RATE,RATE ...] [--seeds 1,2]
    e.g. python largest.py /work/s16/b3 /work/s16/b3/data gem:0:0.01,0.003
"""
import sys
from pathlib import Path

from opengem.bench.isoflop import load_isoflop_config, selection_ne, train_cell

args = sys.argv[1:]
seeds = [1, 2]
if "--seeds" in args:
    i = args.index("--seeds")
    seeds = [int(s) for s in args[i + 1].split(",")]
    del args[i:i + 2]
out, data, cells = args[0], args[1], args[2:]
here = Path(__file__).resolve().parent
log = lambda m: print(m, flush=True)  # noqa: E731
for cell in cells:
    fam, size, rates = cell.split(":")
    cfg = load_isoflop_config(here / "ladder_b3.toml", families=[fam])
    metric = cfg.metric
    valid = {}
    for lr in (float(r) for r in rates.split(",")):
        (rec,) = train_cell(cfg, out, data, fam, int(size), 3, lr, [0], log=log)
        valid[lr] = selection_ne(rec["valid"], metric)
    best = min(valid, key=valid.get)
    log(f"largest: {fam} size {size}: validation NE by rate {valid}; chosen {best}")
    train_cell(cfg, out, data, fam, int(size), 3, best, seeds, log=log)
