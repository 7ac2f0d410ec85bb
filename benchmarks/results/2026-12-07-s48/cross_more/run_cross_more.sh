#!/bin/bash
# session 48: more of the cross branch at equal compute? Three rows beside ../ablation/'s (same config at dfc6fa9,
# stream, seeds, scoring); the full model's runs copied from ../ablation/runs/ and ../lr_edge/runs/ and reused
cd /work/s48
( while true; do echo "$(date -u +%H:%M:%S) $(cut -d' ' -f1-3 /proc/loadavg)" >> cross_more_load.txt; sleep 60; done ) &
LP=$!
/usr/bin/time -v /work/main/.venv/bin/python -m opengem.cli scale --design ablation \
  --config /work/main/configs/ablation.toml --out /work/s48/cross_more --data /work/s47/study/data \
  --set 'proxies=[]' \
  --set 'ablations=[{name = "rank16", component = "cross branch rank 8 -> 16", overrides = ["model.gem.cross_rank=16"]}, {name = "cross3", component = "cross branch 2 -> 3 layers", overrides = ["model.gem.cross_layers=3"]}, {name = "cwidth16", component = "cross branch own attributes 8 -> 16 wide", overrides = ["model.gem.cross_width=16"]}]' \
  > /work/s48/cross_more.log 2> /work/s48/cross_more.err
echo "rc $?" >> /work/s48/cross_more.err
kill $LP
