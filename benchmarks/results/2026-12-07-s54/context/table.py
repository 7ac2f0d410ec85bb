"""The HTTP runs of http.sh as one table: per run, one-client p50/p99 and 16-client requests/s per backend.

    python table.py DIR...   (folders that http.sh wrote)
"""

import json
import sys
from pathlib import Path

print("| run | requests | eager 1 client p50 / p99 ms | AOTI 1 client p50 / p99 ms | eager 16 req/s "
      "| AOTI 16 req/s | AOTI / eager |")
print("|---|---|---|---|---|---|---|")
for d in sys.argv[1:]:
    for f in sorted(Path(d).glob("*.json")):
        r = json.loads(f.read_text())
        c = {(x["backend"], x["clients"]): x for x in r["cells"]}
        e1, a1, e16, a16 = c[("eager", 1)], c[("aoti", 1)], c[("eager", 16)], c[("aoti", 16)]
        kind = "user context + 512 ads" if f.stem.startswith("context") else "512 rows, each its own user"
        print(f"| {Path(d).name}/{f.stem} | {kind} | {e1['p50_ms']:.2f} / {e1['p99_ms']:.2f} "
              f"| {a1['p50_ms']:.2f} / {a1['p99_ms']:.2f} | {e16['requests_per_s']:.1f} | "
              f"{a16['requests_per_s']:.1f} | {a16['requests_per_s'] / e16['requests_per_s']:.2f}x |")
