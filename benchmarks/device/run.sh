#!/bin/bash
# On the lent GPU machine (see pack.sh): unpack the carried fbgemm-gpu and wheels, smoke-test, run gpu_check.
# Everything worth keeping is printed (a call returns the output's tail) or left under $OUT.
set -u
T0=$(date +%s)
NOISE='compat_table|cannot determine|WARNING:root|^\s*(.\[[0-9;]*m)?\s*$'  # fbgemm 1.6's version-table warnings
mkdir -p /tmp/site
cat /tmp/g/part_aa .gpu/p2/part_a[b-z] | xz -dc -T0 | tar -xf - -C /tmp/site || { echo "EXTRACT FAILED"; exit 3; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu/p2/whl/*.whl \
  || echo "PIP FAILED"
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
echo "setup $(( $(date +%s) - T0 )) s"
python3 - <<'PY' 2>&1 | grep -v -E "$NOISE" || exit 4
import torch, fbgemm_gpu, torchrec, triton
print("torch", torch.__version__, torch.version.cuda, "triton", triton.__version__, "fbgemm", fbgemm_gpu.__version__,
      "torchrec", torchrec.__version__, torch.cuda.get_device_name(0))
print(torch.ops.fbgemm.asynchronous_complete_cumsum(torch.tensor([1, 2, 3], device="cuda")))
import opengem.cli  # noqa: F401
PY
nvidia-smi --query-gpu=name,memory.used,clocks.sm,temperature.gpu --format=csv
PYTHON=python3 GPU_CHECK_LIMIT_S=${LIMIT:-150} bash benchmarks/gpu_check.sh /tmp/gc
echo "total $(( $(date +%s) - T0 )) s"
cp /tmp/gc/*.json "$OUT/" 2>/dev/null
cp /tmp/gc/pipeline/pipeline_ab.json "$OUT/pipeline_ab.json" 2>/dev/null
for f in /tmp/gc/*.log; do  # the logs, less fbgemm's version warnings, as one file
  echo "=== $f"; grep -v -E "$NOISE" "$f" | tail -n 200
done > "$OUT/logs.txt"
exit 0
