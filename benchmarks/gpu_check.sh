#!/usr/bin/env bash
# One-command GPU check (issue 13), under 8 minutes on one H200: GEM-base and DCNv2-base training-step
# benchmarks in bf16 with torch.compile on (examples/s, MFU on executed and on full-length FLOPs against
# the bf16 matmul peak measured in the same run, peak memory), time to first step with a cold and then a
# warm compile cache, a 1-process NCCL all-reduce, the Triton twins of ops/triton against their
# references (largest difference, ms forward + backward), and DCNv2's training with and without TorchRec's
# TrainPipelineSparseDist (train.pipeline). If GEM fails compiled, its warm round is skipped and GEM-base is
# timed once with compile off instead (row gem*), so that a compile failure still leaves a GPU number for it.
# Prints one table.
#
#   bash benchmarks/gpu_check.sh [OUT_DIR]        # default runs/gpu_check (JSON of every part kept there)
#
# Without a CUDA GPU it prints one line and exits 2. Every part has its own time limit (GPU_CHECK_LIMIT_S
# seconds per bench round, default 200; 60 for NCCL, 100 each for the Triton
# and pipeline parts), so a hung compile cannot take the whole budget.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=${1:-runs/gpu_check}
LIMIT=${GPU_CHECK_LIMIT_S:-200}

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "gpu_check: no CUDA GPU here (torch.cuda.is_available() is False with $PY): nothing was run"
  exit 2
fi
mkdir -p "$OUT"

# a part's exit status, and on failure the end of its log (less fbgemm's version-table warnings): a device
# call returns only the output's tail, and the machine (with the logs) may be gone before one can look
report() {  # NAME STATUS LOG
  echo "$1: exit $2 (log $3)" >&2
  if [ "$2" -ne 0 ]; then
    grep -v -E 'compat_table|cannot determine compatibility|WARNING:root|^[[:space:]]*(.\[[0-9;]*m)?[[:space:]]*$' "$3" \
      | tail -n 25 | sed "s/^/  $1| /" >&2
  fi
}
rm -rf "$OUT/inductor-cache"  # the first round must be cold

# 1. NCCL, one process: init, all-reduce, barrier, destroy
MASTER_ADDR=127.0.0.1 MASTER_PORT=${GPU_CHECK_PORT:-29577} \
  timeout 60 "$PY" - "$OUT/nccl.json" > "$OUT/nccl.log" 2>&1 <<'PY'
import json, sys, time
import torch
import torch.distributed as dist
t = time.perf_counter()
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
x = torch.full((1 << 20,), 2.0, device="cuda")
dist.all_reduce(x)
dist.barrier()
torch.cuda.synchronize()
ok = bool((x == 2.0).all())
res = {"ok": ok, "seconds": time.perf_counter() - t, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
       "device": torch.cuda.get_device_name(0), "torch": torch.__version__}
dist.destroy_process_group()
open(sys.argv[1], "w").write(json.dumps(res))
sys.exit(0 if ok else 1)
PY
report nccl $? "$OUT/nccl.log"

# 2. and 3. the same benchmark twice: a cold compile cache, then warm (new processes, same cache folder)
BENCH=(-m opengem.cli bench train --config configs/base.toml --models gem,dcnv2 --json
       --out "$OUT/bench-data" --steps 10 --warmup 3 --windows 3 --pool 8
       train.device=cuda train.precision=bf16 train.compile=true "train.compile_cache_dir=$OUT/inductor-cache")
has_gem() {  # did this bench JSON time GEM?
  "$PY" -c 'import json, sys; d = json.load(open(sys.argv[1]))
sys.exit(0 if any(r.get("model") == "gem" for r in d.get("runs", [d])) else 1)' "$1" 2>/dev/null
}
for round in cold warm; do
  cmd=("${BENCH[@]}")
  if [ "$round" = warm ] && ! has_gem "$OUT/bench-cold.json"; then
    cmd=("${cmd[@]/#gem,dcnv2/dcnv2}")  # GEM failed compiled: its warm round would too (GEM eager below)
  fi
  timeout "$LIMIT" "$PY" "${cmd[@]}" > "$OUT/bench-$round.json" 2> "$OUT/bench-$round.log"
  report "bench $round" $? "$OUT/bench-$round.log"
done
# 3b. GEM failed under compile: GEM-base with compile off, so that the table has a GPU number for it at all
if ! has_gem "$OUT/bench-cold.json"; then
  cmd=("${BENCH[@]/#gem,dcnv2/gem}")
  cmd=("${cmd[@]/#train.compile=true/train.compile=false}")
  timeout "$LIMIT" "$PY" "${cmd[@]}" > "$OUT/bench-eager.json" 2> "$OUT/bench-eager.log"
  report "bench gem eager" $? "$OUT/bench-eager.log"
fi

# 4. the Triton twins (ops/triton) against their references at GEM-base's shapes: difference and ms
timeout 100 "$PY" benchmarks/triton_kernels.py --json "$OUT/triton.json" > "$OUT/triton.log" 2>&1
report "triton kernels" $? "$OUT/triton.log"

# 5. train.pipeline on the GPU, one process: the plain loop vs TrainPipelineSparseDist (the next batch's
#    copy on a side stream from pinned memory while this one trains), DCNv2 on the small recipe, fp32
timeout 100 "$PY" benchmarks/pipeline_ab.py --config configs/small-d32.toml --models dcnv2 --nproc 1 \
  --steps 60 --repeats 1 --out "$OUT/pipeline" train.device=cuda > "$OUT/pipeline.log" 2>&1
report "pipeline A/B" $? "$OUT/pipeline.log"

"$PY" benchmarks/gpu_check_table.py "$OUT"
