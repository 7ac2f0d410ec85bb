"""Plateau diagnostic: mean training loss per 50 steps, head-input part scales, per-module param movement."""
import sys

from opengem.bench.isoflop import _batch_size, load_isoflop_config, plan_grid, prepare_study
from opengem.train.trainer import Trainer

fam_name, seed, lr = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
extra = sys.argv[4:]
cfg = load_isoflop_config("configs/isoflop.toml")
st = prepare_study(cfg, __import__("pathlib").Path("/work/s32/diag_out"), "/work/s30/study/data", extra,
                   lambda m: None)
plan = plan_grid(cfg.budgets, st.fwd, _batch_size(st), st.train_rows, cfg.min_steps, cfg.max_epochs)
p = next(q for q in plan if (q.family, q.size, q.budget) == (fam_name, 0, 1))
fam = next(f for f in cfg.families if f.name == fam_name)
rc = st.run_config(fam, 0, p.steps, lr, seed)
scales = {}
with Trainer(rc, None, rc.data.path) as tr:
    m = tr.parallel.plain
    def hook(name):
        def f(mod, inp, out):
            o = out[0] if isinstance(out, tuple) else out
            scales[name] = float(o.detach().float().pow(2).mean().sqrt())
        return f
    for name in ("interformer", "cross", "head.trunk", "wukong", "encoder"):
        mod = m.get_submodule(name) if hasattr(m, name.split(".")[0]) else None
        print("hook", name, mod is not None)
        if mod is not None:
            mod.register_forward_hook(hook(name))
    import os
    mode = os.environ.get("MODE", "")
    if mode == "zero_if":
        orig = m.interformer.forward
        def fwd(*a, **k):
            h, x, s_sum = orig(*a, **k)
            return h * 0, x, s_sum
        m.interformer.forward = fwd
    if mode == "detach_seq":
        orig_e = m.encoder.forward
        def efwd(seq, mask, target):
            return orig_e(seq.detach(), mask, target.detach())
        m.encoder.forward = efwd
    groups = {}
    for n, prm in m.named_parameters():
        key = n.split(".")[0] + ("." + n.split(".")[1] if n.startswith("head") else "")
        groups.setdefault(key, []).append(prm)
    snap = {g: [q.detach().clone() for q in ps] for g, ps in groups.items()}
    losses = []
    for batch in tr.train_loader():
        if tr.step >= p.steps:
            break
        losses.append(tr.train_step(batch))
        if tr.step % 50 == 0 or tr.step == 1:
            mv = {g: sum(float((q - s).norm() ** 2) for q, s in zip(groups[g], snap[g])) ** 0.5
                  for g in groups}
            snap = {g: [q.detach().clone() for q in ps] for g, ps in groups.items()}
            print(f"step {tr.step:4d} loss {sum(losses[-50:]) / 50:.4f} scales "
                  + " ".join(f"{k}={v:.3g}" for k, v in scales.items())
                  + " | move " + " ".join(f"{g}={v:.2g}" for g, v in mv.items()), flush=True)
