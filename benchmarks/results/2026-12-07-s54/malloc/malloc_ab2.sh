for r in 1 2 3 4 5 6; do
 uptime
 TAG=default .venv/bin/python steps.py configs/small-d32.toml gem 2>&1 | grep "ms/step"
 TAG=mmap32M MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824 .venv/bin/python steps.py configs/small-d32.toml gem 2>&1 | grep "ms/step"
 TAG=top MALLOC_TOP_PAD_=268435456 MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824 .venv/bin/python steps.py configs/small-d32.toml gem 2>&1 | grep "ms/step"
done
