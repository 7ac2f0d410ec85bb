"""GEM-small-d32's elementwise ops and copies: self CPU time per op and input shapes (record_shapes)."""
import sys

from torch.profiler import ProfilerActivity, profile

from opengem.train.config import load_run_config
from opengem.train.data import prepare_data
from opengem.train.trainer import Trainer

cfg = load_run_config("configs/small-d32.toml", [])
data = prepare_data(cfg.data, "/work/s51/benchdata", None)
with Trainer(cfg, None, data) as trainer:
    it = iter(trainer.train_loader())
    batches = [next(it).to(trainer.device) for _ in range(4)]
    for b in batches:
        trainer.train_step(b)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for b in batches:
            trainer.train_step(b)
    ev = prof.key_averages(group_by_input_shape=True)
    rows = [e for e in ev if e.key in ("aten::cat", "aten::copy_", "aten::fill_", "aten::mul", "aten::add")]
    rows.sort(key=lambda e: -e.self_cpu_time_total)
    for e in rows[:int(sys.argv[1]) if len(sys.argv) > 1 else 25]:
        stack = [str(e.input_shapes)[:150]]
        print(f"{e.key:14s} {e.self_cpu_time_total / 4 / 1e3:7.2f} ms/step  calls/step {e.count / 4:5.1f}  "
              + stack[0])
