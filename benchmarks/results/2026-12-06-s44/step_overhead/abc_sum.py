"""Sum each arm's two training times per cell and compare every validation metric: python abc_sum.py OUT"""

import collections
import glob
import json
import sys

rows: dict[str, dict] = collections.defaultdict(dict)
for f in sorted(glob.glob(sys.argv[1] + "/*/runs/*/result.json")):
    code_tag, run = f.split("/")[-4], f.split("/")[-2]
    r = json.load(open(f))
    s = json.load(open(f.replace("result.json", "train_summary.json")))
    rows[run][code_tag] = (s["train_seconds"], json.dumps(r["valid"], sort_keys=True))
for run, d in rows.items():
    if len(d) < 4:
        continue
    old, new = d["old-a"][0] + d["old-b"][0], d["new-a"][0] + d["new-b"][0]
    same = len({v[1] for v in d.values()}) == 1
    print(f"{run:32s} old {old / 2:7.2f}s new {new / 2:7.2f}s new/old {new / old:.3f} "
          f"valid metrics identical: {same}")
