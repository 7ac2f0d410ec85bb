# The NE check (issue 13): GEM-small 400 steps on the demo recipe's stream, three seeds, each with both
# attention cores (OPENGEM_CPP_KERNELS=0: SDPA); the table: python ne_table.py OUT
OUT=${1:-/tmp/ne2}
D=$OUT/sim/data   # the demo stream: prepare_data(load_run_config("configs/small.toml").data, OUT/sim)
for seed in 0 1 2; do
  for arm in cpp sdpa; do
    if [ $arm = sdpa ]; then export OPENGEM_CPP_KERNELS=0; else unset OPENGEM_CPP_KERNELS; fi
    .venv/bin/opengem train --config configs/small.toml --data $D --out $OUT/$arm$seed \
      train.steps=400 train.seed=$seed train.progress=false train.threads=1 > $OUT/$arm$seed.log 2>&1
  done
done
