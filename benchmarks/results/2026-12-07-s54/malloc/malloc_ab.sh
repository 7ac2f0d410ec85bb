for r in 1 2 3 4; do
 for m in gem dcnv2; do
 uptime
 TAG=default .venv/bin/python steps.py configs/small-d32.toml $m 2>&1 | grep "ms/step"
 TAG=mmap32M MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824 .venv/bin/python steps.py configs/small-d32.toml $m 2>&1 | grep "ms/step"
 done
done
