"""GEM-small-d32 training step: SDPA flash vs explicit-matmul attention, interleaved windows, one process."""
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import opengem.ops.pytorch.pt_attention as pa
from opengem.train.config import load_run_config
from opengem.train.data import prepare_data
from opengem.train.trainer import Trainer

orig = F.scaled_dot_product_attention
def explicit(q, k, v, attn_mask=None):
    s = torch.matmul(q, k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, float("-inf"))
    return torch.matmul(torch.softmax(s, -1), v)
class Flash:
    scaled_dot_product_attention = staticmethod(orig)
class Explicit:
    scaled_dot_product_attention = staticmethod(explicit)
cfg = load_run_config(sys.argv[1], sys.argv[2:])
data = prepare_data(cfg.data, "runs/bench/small", None)
with Trainer(cfg, None, data) as trainer:
    it = iter(trainer.train_loader())
    batches = [next(it).to_device(trainer.device) for _ in range(8)]
    k = 0
    def steps(n):
        global k
        c = time.process_time()
        for _ in range(n):
            trainer.train_step(batches[k % 8])
            k += 1
        return (time.process_time() - c) / n * 1e3
    arms = {"flash": Flash, "explicit": Explicit}
    for a in arms.values():
        pa.F = a
        steps(3)
    t = {n: [] for n in arms}
    for _ in range(int(os.environ.get("ROUNDS", 7))):
        for n, a in arms.items():
            pa.F = a
            t[n].append(steps(10))
    B = cfg.data.batch_size
    for n, ts in t.items():
        m = statistics.median(ts)
        print(f"{n:9s} cpu {m:7.1f} ms/step  {B / m * 1e3:6.0f} ex/s  windows {[round(x) for x in ts]}")
    print("load", os.getloadavg())
