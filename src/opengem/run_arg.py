"""The run argument of ``evaluate``, ``predict``, ``calibrate`` and ``export``: ``RUN`` or ``--run RUN``.

Why both: a newcomer types ``opengem evaluate runs/x`` as they type ``opengem export runs/x``, while scripts
written against the flag keep working; under ``torchrun``, whose own ``--run-path`` swallows ``--run``, the
positional form (or ``--run-dir``) is the one that gets through.
"""

from __future__ import annotations

import argparse
import os
import re

from opengem.errors import UsageError

RUN_HELP = "training run folder (has config.toml and checkpoints/)"
OVERRIDE = re.compile(r"^[A-Za-z_][\w-]*(\.[\w-]+)+=")  # section.key=value
NOT_A_RUN = "is a section.key=value override, not a run"


def run_path(value: str) -> str:
    """A positional RUN: an override typed where a run goes (``evaluate RUN train.steps=3``) is refused at
    parse time, so the parser can say where overrides go instead of looking for a folder of that name."""
    if OVERRIDE.match(value) and not os.path.exists(value):
        raise argparse.ArgumentTypeError(f"{value} {NOT_A_RUN}")
    return value


def add_run_argument(p: argparse.ArgumentParser, help: str = RUN_HELP, many: bool = False) -> None:
    """``RUN`` (positional, optional) and ``--run``/``--run-dir RUN``; with ``many``, each may repeat."""
    p.add_argument("run", nargs="*" if many else "?", metavar="RUN", type=run_path, help=help)
    p.add_argument("--run", "--run-dir", dest="run_flag", metavar="RUN", action="append" if many else "store",
                   help="the same, as a flag" + (" (repeatable; with or instead of RUN)" if many
                                                 else " (give one of the two)"))


def resolve_run(args: argparse.Namespace, many: bool = False) -> None:
    """Sets ``args.run`` to the one run (or, with ``many``, the list of runs) however they were given."""
    if many:
        runs = [*(args.run or []), *(args.run_flag or [])]
        if not runs:
            raise UsageError("give a run: RUN or --run RUN")
        args.run = runs
        return
    if (args.run is None) == (args.run_flag is None):
        raise UsageError("give the run once, as RUN or --run RUN")
    args.run = args.run or args.run_flag
