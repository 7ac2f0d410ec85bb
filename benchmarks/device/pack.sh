#!/usr/bin/env bash
# Pack what the lent GPU machine lacks for benchmarks/gpu_check.sh, in chunks that fit a device call.
#
#   bash benchmarks/device/pack.sh            # writes .gpu/p1/part_aa, .gpu/p2/{part_ab, whl/, run.sh}
#
# The machine (one H200) has python3 with torch 2.11.0+cu130 and Triton 3.6, and no fbgemm-gpu or TorchRec;
# nothing can be fetched there and a call carries 64 MiB (README of the device tool). So, here, with the
# package registry: fbgemm-gpu 1.6.0 (the release for torch 2.11, CUDA 13: it links libcudart.so.13) with
# its non-sm_90 cubins zeroed (fatbin_keep_arch.py) and xz-packed, split in two; TorchRec 1.6.1 and the
# pure-Python packages torchrec and opengem need beyond the image's. Then, on the device, two calls, the
# second at once after the first (the machine goes back after 30 s idle, and with it /tmp):
#
#   run  carry [".gpu/p1"]  command: mkdir -p /tmp/g && cp .gpu/p1/part_aa /tmp/g/
#   run  carry [".gpu/p2"]  command: bash .gpu/p2/run.sh         (timeout_s 600; prints the table)
#
# Session 24 did exactly this (benchmarks/results/2026-12-04-s24/gpu/). Versions are the image's as seen
# then: check `python3 -c "import torch; print(torch.__version__)"` there first if it may have moved.
set -euo pipefail
cd "$(dirname "$0")/../.."
FBGEMM=${FBGEMM:-1.6.0} TORCHREC=${TORCHREC:-1.6.1}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
dl() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
         --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 "$@"; }
dl -d "$W" "fbgemm-gpu==$FBGEMM"
mkdir -p "$W/x" && (cd "$W/x" && unzip -q "$W"/fbgemm_gpu-*.whl)
for so in "$W"/x/fbgemm_gpu/*.so; do python3 benchmarks/device/fatbin_keep_arch.py "$so" 90; done
grep -qx "/.gpu/" .git/info/exclude 2>/dev/null || echo "/.gpu/" >> .git/info/exclude
rm -rf .gpu && mkdir -p .gpu/p1 .gpu/p2/whl
(cd "$W/x" && tar -cf - fbgemm_gpu fbgemm_gpu-*.dist-info) | xz -T0 -6 > "$W/fbgemm.tar.xz"
(cd .gpu && split -b 48M "$W/fbgemm.tar.xz" part_ && mv part_aa p1/ && mv part_a? p2/)
dl -d .gpu/p2/whl "torchrec==$TORCHREC" tensordict==0.15.3 "pyvers>=0.2,<0.3" iopath==0.1.9 portalocker==4.4.2 \
  tomli_w==1.2.0 orjson==3.13.0
cp benchmarks/device/run.sh .gpu/p2/run.sh
du -sh .gpu/p1 .gpu/p2
