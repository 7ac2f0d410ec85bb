"""The one ``opengem`` command.

Each subcommand lives in the module that owns its job; that module exposes
``add_arguments(parser)`` and ``run(args) -> int``. Modules are imported only when their
subcommand runs, so ``opengem simulate`` does not pay for importing the model stack.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "simulate": ("opengem.data.simulate", "generate a dataset with the ads-platform simulator"),
    "convert": ("opengem.data.adapters", "convert a real dataset to canonical Parquet"),
    "validate": ("opengem.data.validate", "check a dataset against its schema"),
    "train": ("opengem.train.cli", "train a model (GEM, DLRM, DCNv2, DIN)"),
    "evaluate": ("opengem.train.evaluate", "evaluate a run: NE, AUC, calibration per surface x task"),
    "generate": ("opengem.transfer.generate", "knowledge generation: FM soft labels and embeddings"),
    "transfer": ("opengem.transfer.experiment", "the FM -> VM transfer experiment"),
    "bench": ("opengem.bench.cli", "throughput, MFU, memory and start-up benchmarks"),
    "scale": ("opengem.bench.scale", "scaling-law sweeps"),
    "report": ("opengem.bench.report", "HTML report of runs"),
}


def available_commands() -> dict[str, tuple[str, str]]:
    return {k: v for k, v in COMMANDS.items() if importlib.util.find_spec(v[0]) is not None}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # Build only the requested subcommand's parser so unrelated heavy modules are not imported.
    cmds = available_commands()
    if argv and argv[0] in cmds:
        module = importlib.import_module(cmds[argv[0]][0])
        parser = argparse.ArgumentParser(prog=f"opengem {argv[0]}", description=cmds[argv[0]][1])
        module.add_arguments(parser)
        args = parser.parse_args(argv[1:])
        return int(module.run(args) or 0)
    parser = argparse.ArgumentParser(prog="opengem", description="GEM-style ads foundation model")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (_, help_text) in cmds.items():
        sub.add_parser(name, help=help_text)
    parser.parse_args(argv)
    return 2


if __name__ == "__main__":
    sys.exit(main())
