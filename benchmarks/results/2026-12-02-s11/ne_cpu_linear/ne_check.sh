#!/bin/bash
# NE check of train.cpu_linear: small-d32 recipe (200k simulated rows), GEM and DCNv2, seeds 0-2, pytorch vs
# onednn, two runs at a time (one per core).
cd /work/main
N=/work/s11/ne2
D=$N/data
mkdir -p $N
run() { m=$1 s=$2 k=$3; o=$N/$m-$k-s$s; .venv/bin/opengem train --config configs/small-d32.toml --data $D --out $o --force model.name=$m train.seed=$s train.cpu_linear=$k train.threads=1 train.progress=false > $o.log 2>&1; }
echo "start $(date -u +%T) $(cat /proc/loadavg)"
if [ ! -f $D/_COMPLETE ]; then
  .venv/bin/python - <<'PY'
import tomllib
from pathlib import Path
from opengem.data.sim_config import SimConfig
from opengem.data.simulate import simulate
t = tomllib.loads(Path("configs/small-d32.toml").read_text())
simulate(SimConfig.from_dict(t["data"]["sim"]), Path("/work/s11/ne2/data"))
PY
fi
echo "data $(date -u +%T)"
for m in gem dcnv2; do for s in 0 1 2; do
  run $m $s pytorch & run $m $s onednn & wait
done; done
echo "end $(date -u +%T) $(cat /proc/loadavg)"
