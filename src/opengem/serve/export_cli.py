"""``opengem export [--run] RUN[@version] --out DIR [--backend eager|export|aoti]``: a run -> an artifact.

See :mod:`opengem.serve.artifact` for what the folder holds and :mod:`opengem.serve.export` for how the
program is made. ``eager`` writes weights and the data contract only (seconds); ``export`` adds the
``torch.export`` program; ``aoti`` adds an AOTInductor package compiled for this CPU (minutes on a small
machine: it runs a C++ compiler).
"""

from __future__ import annotations

import argparse
import warnings

from opengem.run_arg import add_run_argument, resolve_run
from opengem.serve.export import BACKENDS, export_run
from opengem.train.calibration import describe_calibration


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_run_argument(p, help="training run folder, or RUN@version (e.g. RUN@3 or RUN@v0003) for a published "
                             "version of an online run")
    p.add_argument("--out", required=True, help="artifact folder to write")
    p.add_argument("--backend", default="export", choices=BACKENDS,
                   help="what to build besides the weights (default: export)")
    p.add_argument("--force", action="store_true", help="replace --out if it is an artifact already")


def run(args: argparse.Namespace) -> int:
    warnings.filterwarnings("ignore", category=FutureWarning)  # TorchRec/DCP deprecation notices
    resolve_run(args)
    res = export_run(args.run, args.out, backend=args.backend, force=args.force)
    timing = ", ".join(f"{k} {v:.1f}s" for k, v in res.items() if k.endswith("_s"))
    cal_note = describe_calibration(res["source"].get("calibration"))
    print(f"exported {args.run} -> {res['out']}: version {res['version']}, trained through ts "
          f"{res['trained_through_ts']}, backends {', '.join(res['backends'])}{cal_note} ({timing})")
    return 0
