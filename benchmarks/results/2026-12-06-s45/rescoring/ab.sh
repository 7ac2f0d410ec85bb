#!/bin/bash
# old code (6c4ab8f worktree) and new side by side, one per core, then cores swapped
cd /work/s45/eq
uptime
PYTHONPATH=/work/s45/old/src taskset -c 0 /work/main/.venv/bin/python old.py runsA 2>/dev/null &
PYTHONPATH=/work/main/src taskset -c 1 /work/main/.venv/bin/python new.py runsB 2>/dev/null &
wait
for d in runsA runsB; do rm $d/*/frontier_test.json; done
uptime
PYTHONPATH=/work/s45/old/src taskset -c 1 /work/main/.venv/bin/python old.py runsA 2>/dev/null &
PYTHONPATH=/work/main/src taskset -c 0 /work/main/.venv/bin/python new.py runsB 2>/dev/null &
wait
uptime
