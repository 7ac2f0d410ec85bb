#!/bin/bash
# one-client probes, the Arrow cells and GEM's row, in a window where every other python is paused
cd /work/s6/wt_grid
export PYTHONPATH=/work/s6/wt_grid/src OMP_NUM_THREADS=1
O=/work/s6/grid/quiet
mkdir -p $O
uptime > $O/uptime.txt
python3 /work/s6/speed.py 0 > $O/speed_before.txt
.venv/bin/python benchmarks/serve_vm_probe.py --model /work/s6/grid/work/vm-export --data /work/s6/grid/work/vmdata --backend aoti --requests 2000 --out $O/probe_spin.json > $O/probe_spin.txt 2>&1
.venv/bin/python benchmarks/serve_vm_probe.py --model /work/s6/grid/work/vm-export --data /work/s6/grid/work/vmdata --backend aoti --requests 1000 --client block --out $O/probe_block.json > $O/probe_block.txt 2>&1
.venv/bin/python -m opengem.cli bench serve --model /work/s6/grid/work/vm-export --data /work/s6/grid/work/vmdata --backends eager,aoti --candidates 512 --clients 1,16 --requests 1000 --duration 15 --swap-versions 0 --server-threads 1 --body arrow --out $O/serve_vm_arrow.json > $O/serve_vm_arrow.txt 2>&1
.venv/bin/python -m opengem.cli bench serve --model /work/s5/demo/seed0/gem --data /work/s5/sim875/data --backends eager,export --candidates 512 --clients 1,16 --requests 100 --duration 20 --swap-versions 0 --server-threads 1 --body arrow --out $O/serve_gem.json > $O/serve_gem.txt 2>&1
python3 /work/s6/speed.py 0 > $O/speed_after.txt
uptime >> $O/uptime.txt
