"""Record the SDPA shapes of GEM-small-d32 training steps."""
import collections
import sys

import torch.nn.functional as F

import opengem.ops.pytorch.pt_attention as pa
from opengem.train.config import load_run_config
from opengem.train.data import prepare_data
from opengem.train.trainer import Trainer

seen = collections.Counter()
orig = F.scaled_dot_product_attention
class Fake:
    @staticmethod
    def scaled_dot_product_attention(q, k, v, attn_mask=None, **kw):
        seen[(tuple(q.shape), tuple(k.shape), None if attn_mask is None else tuple(attn_mask.shape),
              q.stride(), k.stride(), v.stride())] += 1
        return orig(q, k, v, attn_mask=attn_mask, **kw)
pa.F = Fake
cfg = load_run_config(sys.argv[1], [])
data = prepare_data(cfg.data, "/work/s51/benchdata", None)
with Trainer(cfg, None, data) as trainer:
    it = iter(trainer.train_loader())
    for _ in range(4):
        trainer.train_step(next(it).to(trainer.device))
for k, n in seen.most_common():
    print(n, k)
