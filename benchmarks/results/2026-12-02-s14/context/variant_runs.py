"""Runs of the iso-FLOP study's plan (the study's own code, opengem.bench.isoflop.train_cell: rows follow the
budget for the overridden model) for one family, size, budget, rate and seeds, with extra model overrides,
into their own folder.

    python variant_runs.py OUT DATA FAMILY SIZE BUDGET LR SEEDS OVERRIDE...
    e.g. python variant_runs.py /work/s14/ctx/gem /work/s12/iso/out/data gem 0 2 0.003 3,4,5 \
             model.head.context=time
"""
import sys

from opengem.bench.isoflop import default_config_path, load_isoflop_config, train_cell

out, data, family = sys.argv[1], sys.argv[2], sys.argv[3]
size, budget, lr = int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
seeds, extra = [int(s) for s in sys.argv[7].split(",")], sys.argv[8:]
cfg = load_isoflop_config(default_config_path("default"), families=[family])
train_cell(cfg, out, data, family, size, budget, lr, seeds, extra, log=lambda m: print(m, flush=True))
