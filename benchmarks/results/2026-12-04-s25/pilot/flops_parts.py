"""Forward FLOPs/example of each GEM size of a study config, split by part (embedding, cross, head, encoder,
InterFormer)."""
import sys

sys.path.insert(0, "/work/s25/wt/src")
from opengem.bench.isoflop import load_isoflop_config
from opengem.bench.size_ladder import size_overrides
from opengem.data.dataset import Dataset
from opengem.model.registry import build_model
from opengem.train.config import load_run_config

cfg = load_isoflop_config(sys.argv[1])
ds = Dataset(sys.argv[2])
fam = [f for f in cfg.families if f.name == "gem"][0]
for i, ovr in enumerate(size_overrides(fam)):
    rc = load_run_config(cfg.base, ["train.steps=10", *cfg.overrides, "model.name=gem", *ovr, *sys.argv[3:]])
    m = build_model(ds.schema, rc.model)
    width = sum(m.embedding.seq_len(g, None) for g in m.groups)
    parts = {"emb": m.embedding.flops_per_example(None), "cross": m.cross.flops_per_example(),
             "head": m.head.flops_per_example(), "enc": m.encoder.flops(width),
             "ifr": m.interformer.flops(m.encoder.out_len(width))}
    tot = m.flops_per_example()
    print(f"s{i}: total {tot/1e3:.1f}k  " + "  ".join(f"{k} {v/1e3:.1f}k" for k, v in parts.items()),
          f"rest {(tot-sum(parts.values()))/1e3:.1f}k")
