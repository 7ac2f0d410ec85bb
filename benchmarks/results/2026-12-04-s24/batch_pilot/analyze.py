import collections
import json
import statistics
import sys

sys.path.insert(0, "/work/s24/wt/src")
from opengem.bench.isoflop import load_isoflop_config, selection_ne  # noqa: E402

cfg = load_isoflop_config("/work/s24/wt/configs/isoflop.toml")
recs = [json.loads(l) for l in open("/work/s24/pilot/results.jsonl")]
cell = collections.defaultdict(list)
for r in recs:
    if r.get("exit") != 0 or "result" not in r:
        print("FAILED", *(r.get(k) for k in ("family", "budget", "batch", "lr", "seed", "error")))
        continue
    res = r["result"]
    v = selection_ne(res["valid"], cfg.metric)
    t = selection_ne(res["test"], cfg.metric) if res.get("test") else float("nan")
    cell[(r["family"], r["budget"], r["batch"], r["lr"])].append((r["seed"], v, t, r["steps"], r["seconds"]))
budget_name = {1: "1.58e10", 2: "5e10"}
print(f"selection metric: {cfg.metric}; cells = mean over seeds 0-2 (validation | test)")
lines = []
for b in (1, 2):
    print(f"\n## budget {budget_name[b]}")
    print("| family | batch | steps | lr 3e-3 valid | lr 1e-2 valid | chosen lr | test NE (chosen lr) |")
    print("|---|---|---|---|---|---|---|")
    for fam in ("gem", "din", "dcnv2"):
        best = None
        for bs in (64, 128, 256):
            row = {}
            for lr in (0.003, 0.01):
                xs = cell.get((fam, b, bs, lr), [])
                if len(xs) == 3:
                    row[lr] = (statistics.mean(x[1] for x in xs), statistics.mean(x[2] for x in xs), xs[0][3],
                               [x[2] for x in xs])
            if not row:
                continue
            lr_c = min(row, key=lambda k: row[k][0])
            steps = next(iter(row.values()))[2]
            v3, v10 = (f"{row[lr][0]:.4f}" if lr in row else "-" for lr in (0.003, 0.01))
            print(f"| {fam} | {bs} | {steps} | {v3} | {v10} | {lr_c:g} | {row[lr_c][1]:.4f} |")
            if best is None or row[lr_c][0] < best[1]:
                best = (bs, row[lr_c][0], row[lr_c][1], lr_c, row[lr_c][3])
        if best:
            lines.append((b, fam, best))
print("\n## chosen on validation (batch and lr), test NE of the 3 seeds")
for b, fam, (bs, v, t, lr, ts) in lines:
    seeds = [f"{x:.4f}" for x in ts]
    print(f"{budget_name[b]} {fam}: batch {bs}, lr {lr:g}: valid {v:.4f}, test {t:.4f} {seeds}")
