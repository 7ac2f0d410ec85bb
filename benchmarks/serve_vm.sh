#!/usr/bin/env bash
# Issue 16's serving grid on the vertical model of configs/transfer.toml, from nothing to a table.
#
#   benchmarks/serve_vm.sh --out DIR [--requests 500] [--duration 10] [--steps 300] [--smoke]
#
# 1. simulates configs/transfer.toml's [data.sim] data (DIR/work/sim), 2. derives the VM dataset of its
# [vm.schema] on surfaces feed and stories (DIR/work/vmdata), 3. trains [vm.model] with [train] as a plain
# run (DIR/work/vm-run; --steps, default 300), 4. exports it with AOTInductor (DIR/work/vm-export; the
# artifact also carries the torch.export program, so one folder serves all three backends), 5. runs
# `opengem bench serve`: backends eager,export,aoti x candidates 1,64,512 x clients 1,4,16, then the swap
# of 5 successive versions under load (AOTI), and 6. the same 512-candidate cells with Arrow bodies;
# first, the in-process stage timings (`bench serve --in-process`: decode, encode, forward, score_many),
# then where one client's request time goes (benchmarks/serve_vm_probe.py: the server's CPU and stages
# against an echo app on the same HTTP stack), last the model thread's score_many against the same
# requests in-process, interleaved (benchmarks/serve_vm_score_ab.py). Results: DIR/serve_vm_stages.{json,txt},
# DIR/serve_vm.{json,txt}, DIR/serve_vm_arrow.{json,txt}, DIR/serve_vm_probe.{json,txt},
# DIR/serve_vm_score_ab.{json,txt}, with `uptime` before and after.
# The server is pinned to one CPU and the clients to the others (bench serve's default with >= 2 CPUs);
# the server runs 1 torch thread. Steps 1-4 are skipped when their output exists (rerun = just measure).
# --smoke: a few requests per cell, 1 swap version: checks the script end to end, measures nothing.
set -euo pipefail

OUT="" REQUESTS=500 DURATION=10 STEPS=300 SWAPS=5 SMOKE=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --requests) REQUESTS="$2"; shift 2 ;;
    --duration) DURATION="$2"; shift 2 ;;
    --steps) STEPS="$2"; shift 2 ;;
    --smoke) SMOKE=1; REQUESTS=8; DURATION=5; SWAPS=1; shift ;;
    *) echo "serve_vm.sh: unknown argument $1 (see the header)" >&2; exit 2 ;;
  esac
done
[ -n "$OUT" ] || { echo "serve_vm.sh: --out DIR is required" >&2; exit 2; }
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="$ROOT/.venv/bin/python"
W="$OUT/work"
mkdir -p "$W"
cd "$ROOT"

if [ ! -f "$W/vmdata/_COMPLETE" ]; then
  "$PY" - "$W" <<'EOF'
import sys, tomllib
from pathlib import Path
from opengem.config import from_dict
from opengem.data.dataset import Dataset
from opengem.data.sim_config import SimConfig
from opengem.data.simulate import simulate
from opengem.transfer.vertical import VMSchemaConfig, build_vm_dataset, derive_vm_schema
w = Path(sys.argv[1])
t = tomllib.loads(Path("configs/transfer.toml").read_text())
if not (w / "sim" / "_COMPLETE").is_file():
    simulate(SimConfig.from_dict(t["data"]["sim"]), w / "sim")
fm = Dataset(w / "sim").schema
vm = derive_vm_schema(fm, from_dict(VMSchemaConfig, t["vm"]["schema"]), name="vm")
surfaces = [fm.surfaces.index(s) for s in t["surfaces"]]  # the VMs of the experiment: feed, stories
build_vm_dataset(w / "sim", surfaces, w / "vmdata", schema=vm)
print("vm dataset:", w / "vmdata", vm.feature_columns())
EOF
fi

if [ ! -d "$W/vm-run/checkpoints" ]; then
  "$PY" - "$W" "$STEPS" <<'EOF'
import sys, tomllib
from pathlib import Path
import tomli_w
w, steps = Path(sys.argv[1]), int(sys.argv[2])
t = tomllib.loads(Path("configs/transfer.toml").read_text())
days = sorted(p.name for p in (w / "vmdata").glob("day=*"))
cfg = {"data": {"train": ",".join(days[:-1]), "eval": days[-1], "batch_size": t["batch_size"]},
       "model": t["vm"]["model"], "train": {**t["train"], "steps": steps, "log_every": 100}}
(w / "vm.toml").write_text(tomli_w.dumps(cfg))
EOF
  "$PY" -m opengem.cli train --config "$W/vm.toml" --data "$W/vmdata" --out "$W/vm-run" train.progress=false
fi

if [ ! -f "$W/vm-export/manifest.json" ]; then
  "$PY" -m opengem.cli export "$W/vm-run" --out "$W/vm-export" --backend aoti
fi

echo "uptime before: $(uptime)" | tee "$OUT/uptime.txt"
"$PY" -m opengem.cli bench serve --in-process --model "$W/vm-export" --data "$W/vmdata" \
  --backends eager,export,aoti --candidates 512 --requests "$((REQUESTS < 200 ? REQUESTS : 200))" \
  --out "$OUT/serve_vm_stages.json" | tee "$OUT/serve_vm_stages.txt"
"$PY" -m opengem.cli bench serve --model "$W/vm-export" --data "$W/vmdata" --backends eager,export,aoti \
  --candidates 1,64,512 --clients 1,4,16 --requests "$REQUESTS" --duration "$DURATION" \
  --swap-versions "$SWAPS" --swap-model "$W/vm-run" --swap-backends aoti --server-threads 1 \
  --out "$OUT/serve_vm.json" | tee "$OUT/serve_vm.txt"
"$PY" -m opengem.cli bench serve --model "$W/vm-export" --data "$W/vmdata" --backends eager,aoti \
  --candidates 512 --clients 1,16 --requests "$REQUESTS" --duration "$DURATION" --swap-versions 0 \
  --server-threads 1 --body arrow --out "$OUT/serve_vm_arrow.json" | tee "$OUT/serve_vm_arrow.txt"
"$PY" benchmarks/serve_vm_probe.py --model "$W/vm-export" --data "$W/vmdata" --backend aoti \
  --requests "$((REQUESTS < 300 ? REQUESTS : 300))" --out "$OUT/serve_vm_probe.json" | tee "$OUT/serve_vm_probe.txt"
"$PY" benchmarks/serve_vm_score_ab.py --model "$W/vm-export" --data "$W/vmdata" --backend aoti \
  --requests "$((REQUESTS < 300 ? REQUESTS : 300))" --out "$OUT/serve_vm_score_ab.json" | tee "$OUT/serve_vm_score_ab.txt"
echo "uptime after: $(uptime)" | tee -a "$OUT/uptime.txt"
[ "$SMOKE" = 1 ] && echo "serve_vm.sh: smoke run (few requests per cell): these numbers are not measurements"
exit 0
