"""``opengem train --config C.toml [--data DIR] [--out RUN] [section.key=value ...]``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, help="TOML recipe (configs/tiny.toml, small, base, large)")
    p.add_argument("--data", default=None,
                   help="dataset folder (default: data.path, else simulate into RUN/data)")
    p.add_argument("--out", default=None, help="run folder (default: runs/<recipe>-<model>)")
    p.add_argument("overrides", nargs="*", metavar="section.key=value",
                   help="config overrides, values as TOML literals, e.g. model.name=dlrm train.steps=100")


def run(args: argparse.Namespace) -> int:
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)  # TorchRec/DCP deprecation notices
    from opengem.train.config import load_run_config
    from opengem.train.trainer import train

    cfg = load_run_config(args.config, args.overrides)
    stem = Path(args.config).stem if args.config else "default"
    out = Path(args.out or f"runs/{stem}-{cfg.model.name}")
    summary = train(cfg, out, args.data)
    print(json.dumps({k: v for k, v in summary.items() if k != "final_eval"}, indent=2))
    print(f"run folder: {out}")
    return 0
