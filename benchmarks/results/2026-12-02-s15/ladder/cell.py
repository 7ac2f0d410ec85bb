"""More seeds, or a variant under extra overrides, of one cell of an iso-FLOP study's plan, trained as the
study would (opengem.bench.isoflop.train_cell) into OUT/runs/.

    python cell.py STUDY_TOML OUT DATA FAMILY SIZE BUDGET LR|recipe SEEDS [OVERRIDE...]
    e.g. python cell.py ladder.toml /work/s15/diag /work/s12/iso/out/data gem 1 1 0.003 0,1 train.log_every=25
"""
import sys

from opengem.bench.isoflop import load_isoflop_config, train_cell

cfg_path, out, data, fam = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
size, budget = int(sys.argv[5]), int(sys.argv[6])
lr = None if sys.argv[7] == "recipe" else float(sys.argv[7])
seeds = [int(s) for s in sys.argv[8].split(",")]
cfg = load_isoflop_config(cfg_path, families=[fam])
train_cell(cfg, out, data, fam, size, budget, lr, seeds, sys.argv[9:], log=lambda m: print(m, flush=True))
