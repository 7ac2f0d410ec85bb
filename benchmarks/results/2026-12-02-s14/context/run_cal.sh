#!/bin/bash
# For each run in RUNS_DIR: the whole test day before calibration, then Platt and offset fits on the
# validation day (data.eval = day=006, held out), each scored on the whole test day (day=007).
# (../../2026-12-02-s13/calibrate/run_cal.sh runs it on session 12's runs.)   usage: run_cal.sh RUNS_DIR RUN...
OG=/work/main/.venv/bin/opengem
cd "$1" || exit 1
shift
for r in "$@"; do
  [ -f $r/uncal-eval-day=007.json ] || { [ -f $r/eval-day=007.json ] || $OG evaluate --run $r --partitions day=007 > /dev/null 2>&1; cp $r/eval-day=007.json $r/uncal-eval-day=007.json; }
  for m in platt offset; do
    [ -f $r/$m-eval-day=007.json ] && continue
    $OG calibrate --run $r --method $m > $r/calibrate-$m.txt 2>&1 || { echo "FAIL calibrate $r $m"; continue; }
    cp $r/calibration.json $r/calibration-$m.json
    $OG evaluate --run $r --partitions day=007 > /dev/null 2>&1 || echo "FAIL eval $r $m"
    cp $r/eval-day=007.json $r/$m-eval-day=007.json
  done
  rm -f $r/calibration.json
  cp $r/uncal-eval-day=007.json $r/eval-day=007.json
  echo "$(date +%T) done $r $(cut -d' ' -f1-3 /proc/loadavg)"
done
