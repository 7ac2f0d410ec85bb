"""Session 25 ladder pilot: new GEM sizes (this folder) beside session 24's batch-256 runs of GEM s1, DIN s1
and DCNv2 s2 (same stream, rule and cpu_linear record). Per size and budget: the rate with the lowest mean
validation NE over seeds 0-2, then that rate's test NE (the study's 16,384-row test slice)."""
import collections
import json
import statistics
from pathlib import Path

from opengem.bench.isoflop import selection_ne

HERE = Path(__file__).parent
recs = [json.loads(line) for line in open(HERE / "results_s24_bs256.jsonl")]  # session 24's, batch 256
recs += [json.loads(line) for line in open(HERE / "results_s25.jsonl")]
METRIC = "tasks"  # the study's: mean of pooled click and conversion NE
cell = collections.defaultdict(list)
for r in recs:
    if r.get("exit") != 0 or "result" not in r:
        print("FAILED", r)
        continue
    res = r["result"]
    cell[(r["family"], r["size"], r["budget"], r["lr"])].append(
        (r["seed"], selection_ne(res["valid"], METRIC), selection_ne(res["test"], METRIC),
         r["examples"], res["flops_per_example"]))
names = {1: "1.58e10", 2: "5e10", 3: "1.58e11"}
for b in (1, 2, 3):
    print(f"\n## budget {names[b]} (mean of seeds 0-2; chosen rate = lowest mean validation NE)")
    print("| family | size | MFLOP/ex | rows | valid lr 3e-3 | valid lr 1e-2 | chosen | test NE (3 seeds) |")
    print("|---|---|---|---|---|---|---|---|")
    keys = sorted({(f, s) for (f, s, bb, _) in cell if bb == b})
    for f, s in keys:
        row = {lr: xs for (ff, ss, bb, lr), xs in cell.items() if (ff, ss, bb) == (f, s, b) and len(xs) == 3}
        if not row:
            continue
        v = {lr: statistics.mean(x[1] for x in xs) for lr, xs in row.items()}
        lr = min(v, key=v.get)
        xs = sorted(row[lr])
        t = [x[2] for x in xs]
        va, vb = v.get(0.003, float("nan")), v.get(0.01, float("nan"))
        print(f"| {f} | s{s} | {xs[0][4] / 1e6:.3f} | {xs[0][3]:,} | {va:.4f} | {vb:.4f} | {lr:g} | "
              f"{statistics.mean(t):.4f} ({', '.join(f'{x:.4f}' for x in t)}) |")

# each family's size chosen on validation (its best rate), then GEM minus each baseline on test, by seed
T2 = 4.303  # t(0.975, 2 df): 3 seeds
print("\n## each family's best size and rate by mean validation NE; "
      "GEM minus each, test, paired by seed (95 % t)")
for b in (1, 2):
    best = {}
    for (f, s, bb, lr), xs in cell.items():
        if bb == b and len(xs) == 3:
            v = statistics.mean(x[1] for x in xs)
            if f not in best or v < best[f][0]:
                best[f] = (v, s, lr, {x[0]: x[2] for x in xs})
    line = []
    for f in ("gem", "dcnv2", "din", "dlrm"):
        if f in best:
            v, s, lr, t = best[f]
            line.append(f"{f} s{s} lr {lr:g}: valid {v:.4f}, test {statistics.mean(t.values()):.4f}")
    print(f"{names[b]}: " + "; ".join(line))
    g = best["gem"][3]
    for f in ("dcnv2", "din", "dlrm"):
        if f in best:
            d = [g[k] - best[f][3][k] for k in sorted(g)]
            m, h = statistics.mean(d), T2 * statistics.stdev(d) / len(d) ** 0.5
            print(f"  GEM - {f}: {m:+.4f} [{m - h:+.4f}, {m + h:+.4f}]")
