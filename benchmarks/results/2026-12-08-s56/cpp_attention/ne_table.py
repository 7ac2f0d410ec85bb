import json
import sys

root = sys.argv[1]
rows = {}
for r in ("cpp0", "sdpa0", "cpp1", "sdpa1", "cpp2", "sdpa2"):
    try:
        s = json.load(open(f"{root}/{r}/train_summary.json"))
    except FileNotFoundError:
        continue
    m = s["final_eval"]
    rows[r] = {k: v["ne"] for k, v in m.items() if isinstance(v, dict) and "ne" in v}
keys = sorted(rows["cpp0"])
print("run " + " ".join(keys))
for r, v in rows.items():
    print(r, " ".join(f"{v[k]:.5f}" for k in keys))
for s in "012":
    if "cpp" + s in rows and "sdpa" + s in rows:
        d = [rows["cpp" + s][k] - rows["sdpa" + s][k] for k in keys]
        print(f"seed {s} cpp-sdpa", " ".join(f"{x:+.5f}" for x in d), f"max |d| {max(abs(x) for x in d):.5f}")
