"""Input variance of every LayerNorm in GEM at init (and after training when a checkpoint is given)."""
import sys

import torch

from opengem.train.config import load_run_config
from opengem.train.trainer import Trainer

run = sys.argv[1]
cfg = load_run_config(f"{run}/config.toml", ["train.steps=1"])
with Trainer(cfg, None, cfg.data.path) as tr:
    model = tr.parallel.plain
    stats = {}
    def hook(name):
        def f(m, inp, out):
            x = inp[0].detach().float()
            stats[name] = (x.var(dim=-1, unbiased=False).mean().item(), m.eps, x.abs().mean().item(),
                           out.detach().float().abs().mean().item())
        return f
    for n, m in model.named_modules():
        if isinstance(m, torch.nn.LayerNorm):
            m.register_forward_hook(hook(n))
    from opengem.model.wukong import WukongLayer
    def whook(name):
        def f(m, inp, out):
            x = inp[0].detach().float()
            fm = m.fm(x).flatten(1)
            stats[name + ".fm_ln(fm)"] = (fm.var(dim=-1, unbiased=False).mean().item(), m.fm_ln.eps,
                                          fm.abs().mean().item(), out.detach().float().abs().mean().item())
            stats[name + ".x"] = (x.var(dim=-1, unbiased=False).mean().item(), m.ln.eps,
                                  x.abs().mean().item(), 0.0)
        return f
    for n, m in model.named_modules():
        if isinstance(m, WukongLayer):
            m.register_forward_hook(whook(n))
    emb = {}
    model.embedding.register_forward_hook(lambda m, i, o: emb.__setitem__("tok", o.tokens.detach()))
    b = next(iter(tr.train_loader())).to(tr.device)
    with torch.no_grad():
        model.eval()
        model(b)
    t = emb["tok"]
    for j in range(t.shape[1]):
        print(f"token {j:2d} |x| {t[:, j].abs().mean().item():.3e}")
    for n, (v, eps, a, o) in stats.items():
        print(f"{n:50s} input var {v:.3e} (eps {eps:.0e}, var/eps {v/eps:8.3f})  |x| {a:.3e}  |out| {o:.3e}")
