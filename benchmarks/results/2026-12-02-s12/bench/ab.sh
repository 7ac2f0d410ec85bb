export OMP_NUM_THREADS=1 PYTHONWARNINGS=ignore
for round in 1 2; do
  for code in new old; do
    if [ $code = old ]; then cd /work/s12/old; else cd /work/main; fi
    echo "=== $code round $round $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
    PYTHONPATH=src /work/main/.venv/bin/python -m opengem.cli bench train --config configs/small-d32.toml --models gem,dlrm,dcnv2 --out /work/s12/bench/data train.threads=1 2>&1 | grep -E "^(gem|dlrm|dcnv2) "
  done
done
echo "=== end $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
