#!/bin/bash
# For each study run of session 12's stream: whole test day before calibration, then Platt and offset fits on
# the validation day (data.eval = day=006, held out), each scored on the whole test day (day=007).
# The loop itself is ../../2026-12-02-s14/context/run_cal.sh (any runs folder).   usage: run_cal.sh RUN...
exec "$(dirname "$0")/../../2026-12-02-s14/context/run_cal.sh" /work/s12/iso/out/runs "$@"
