"""GEM runs of the iso-FLOP study (each ladder's s0, the study's own code) with extra model overrides, on
session 12's stream, into their own folder: does a wider dense-feature path let GEM learn messaging's
hour-of-day conversion pattern (calibrate/README.md)? Rows still follow the budget (the plan counts the
overridden model's FLOPs).

    python variant_runs.py OUT DATA LR SEEDS BUDGET OVERRIDE...
    e.g. python variant_runs.py /work/s13/dense/h32 /work/s12/iso/out/data 0.003 3,4,5 2 \
             model.embedding.dense_hidden=32
"""
import sys

from opengem.bench.isoflop import default_config_path, load_isoflop_config, train_cell

out, data = sys.argv[1], sys.argv[2]
lr, seeds, budget = float(sys.argv[3]), [int(s) for s in sys.argv[4].split(",")], int(sys.argv[5])
cfg = load_isoflop_config(default_config_path("default"), families=["gem"])
train_cell(cfg, out, data, "gem", 0, budget, lr, seeds, sys.argv[6:], log=lambda m: print(m, flush=True))
