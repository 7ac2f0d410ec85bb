"""Memory savers on GEM: peak memory, saved-activation bytes and examples/s per setting, and the NE change
each causes on the simulator.

    .venv/bin/python benchmarks/memory_savers.py speed [--config configs/base.toml] [--batch 32] [--steps 3]
    .venv/bin/python benchmarks/memory_savers.py ne [--config configs/tiny.toml] [--steps 60]

speed: the recipe's model (default GEM-base) on random schema-conformant batches (sequences padded to
max_len), one fresh process per setting so that peak RSS (ru_maxrss) belongs to that setting alone.
"peak step MB" = peak RSS during the timed steps minus RSS before the first step (activations, gradients,
optimizer state, allocator slack). "saved MB" = bytes autograd kept for backward in one step (counted by a
saved-tensor hook; FP8 counts the packed bytes). Settings: none | ac | bf16 | fp8 (e4m3) | all.
ne: the trainer on the recipe's simulator data with each setting, same data, seed and steps; final NE on the
eval partition.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

SETTINGS = {
    "none": [],
    "ac": ['train.activation_checkpointing="layer"'],
    "bf16": ['train.precision="bf16"'],
    "fp8": ['train.fp8_saved_activations="e4m3"'],
    "all": ['train.activation_checkpointing="layer"', 'train.precision="bf16"',
            'train.fp8_saved_activations="e4m3"'],
}

CHILD = r"""
import json, resource, sys, time
import torch
from opengem.data.random_batch import random_batch
from opengem.data.sim_config import SimConfig, sim_schema
from opengem.model.heads import masked_bce
from opengem.model.registry import build_model
from opengem.train.config import load_run_config
from opengem.train.memory import SavedTensorStats, apply_activation_checkpointing, autocast
from opengem.train.memory import fp8_saved_activations
config, batch, steps, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
cfg = load_run_config(config, ["model.embedding.pad_to_max_len=true", *json.loads(sys.argv[5])])
t = cfg.train
if threads:
    torch.set_num_threads(threads)
schema = sim_schema(SimConfig.from_dict(dict(cfg.data.sim)))
torch.manual_seed(0)
model = build_model(schema, cfg.model)
apply_activation_checkpointing(model, t.activation_checkpointing)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
batches = [random_batch(schema, batch, seed=i) for i in range(steps + 1)]
w = torch.ones(len(schema.tasks))
cpu = torch.device("cpu")
def step(b, stats=None):
    with autocast(t.precision, cpu), fp8_saved_activations(t.fp8_saved_activations, t.fp8_min_numel, stats):
        logits = model(b).logits
    loss = masked_bce(logits.float(), b.labels, b.label_mask, w)
    opt.zero_grad(); loss.backward(); opt.step()
    return float(loss)
def rss_mb():
    return int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize() / 2**20
base = rss_mb()
stats = SavedTensorStats()
step(batches[0], stats)  # warm-up (optimizer state is created here)
t0 = time.perf_counter()
for b in batches[1:]:
    step(b)
dt = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"peak_step_mb": peak - base, "peak_rss_mb": peak, "saved_mb": stats.bytes_kept / 2**20,
                  "saved_mb_fp32_equiv": stats.bytes_in / 2**20, "examples_per_s": batch * steps / dt,
                  "step_s": dt / steps,
                  "params_m": sum(p.numel() for p in model.parameters()) / 1e6}))
"""


def speed(args: argparse.Namespace) -> None:
    print(f"speed: {args.config}, batch {args.batch}, {args.steps} timed steps, threads {args.threads}, "
          f"load average {os.getloadavg()}")
    rows = {}
    for name, ov in SETTINGS.items():
        r = subprocess.run([sys.executable, "-c", CHILD, args.config, str(args.batch), str(args.steps),
                            str(args.threads), json.dumps(ov)], capture_output=True, text=True, timeout=7200)
        if r.returncode:
            sys.exit(f"{name} failed:\n{r.stderr[-4000:]}")
        rows[name] = json.loads(r.stdout.strip().splitlines()[-1])
        print(name, json.dumps(rows[name]), flush=True)
    print(f"{'setting':<8}{'peak step MB':>13}{'saved MB':>10}{'examples/s':>12}{'vs none':>9}")
    for name, r in rows.items():
        print(f"{name:<8}{r['peak_step_mb']:>13.0f}{r['saved_mb']:>10.1f}{r['examples_per_s']:>12.1f}"
              f"{r['examples_per_s'] / rows['none']['examples_per_s']:>9.2f}")
    print(f"load average after: {os.getloadavg()}")


def ne(args: argparse.Namespace) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    from opengem.train.config import load_run_config
    from opengem.train.data import prepare_data
    from opengem.train.trainer import train

    root = tempfile.mkdtemp(prefix="opengem-ms-")
    base = load_run_config(args.config, [f"train.steps={args.steps}", "train.progress=false"])
    data = prepare_data(base.data, root)
    print(f"ne: {args.config}, {args.steps} steps, data {data}, load average {os.getloadavg()}")
    res = {}
    for name, ov in SETTINGS.items():
        cfg = load_run_config(args.config, [f"train.steps={args.steps}", "train.progress=false", *ov])
        t0 = time.perf_counter()
        s = train(cfg, os.path.join(root, name), data, force=True)
        ev = s["final_eval"]
        res[name] = {k: ev[k]["ne"] for k in sorted(ev) if k.startswith("all/")}
        res[name]["last_loss"] = s["last_loss"]
        res[name]["seconds"] = time.perf_counter() - t0
        print(name, json.dumps(res[name]), flush=True)
    keys = [k for k in res["none"] if k.startswith("all/")]
    print(f"{'setting':<8}" + "".join(f"{k + ' NE':>20}{'change %':>10}" for k in keys))
    for name, r in res.items():
        cells = [f"{r[k]:>20.4f}{100 * (r[k] / res['none'][k] - 1):>10.2f}" for k in keys]
        print(f"{name:<8}" + "".join(cells))
    print(f"load average after: {os.getloadavg()}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["speed", "ne"])
    p.add_argument("--config", default=None)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--threads", type=int, default=0)
    args = p.parse_args()
    if args.what == "speed":
        args.config = args.config or "configs/base.toml"
        speed(args)
    else:
        args.config = args.config or "configs/tiny.toml"
        ne(args)


if __name__ == "__main__":
    main()
