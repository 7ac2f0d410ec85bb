import json
import sys

d = json.load(open(sys.argv[1]))
print("load", [round(x, 2) for x in d["load_start"]], [round(x, 2) for x in d["load_end"]])
for k, v in d.items():
    if isinstance(v, dict):
        print(
            f"{k:12s} rps {v['rps_median']:6.1f} p50 {v['p50_median']:5.1f} p99 {v['p99_median']:5.1f}",
            f"cpu {v['cpu_total_ms']:.3f} {v['cpu_ms_per_req']} req/batch {v.get('req_per_batch')}",
            f"score_cpu/req {v.get('score_cpu_ms_per_req')} err {v['errors']}",
        )
