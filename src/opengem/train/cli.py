"""``opengem train --config C.toml [--data DIR] [--out RUN] [section.key=value ...]``."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, help="TOML recipe (configs/tiny.toml, small, base, large)")
    p.add_argument("--data", default=None,
                   help="dataset folder (default: data.path, else simulate into RUN/data)")
    p.add_argument("--out", default=None, help="run folder (default: runs/<recipe>-<model>)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the newest complete checkpoint in RUN/checkpoints "
                        "(a fresh start if there is none)")
    p.add_argument("--online", action="store_true",
                   help="continuous training: evaluate, train and publish each new time partition in turn "
                        "(RUN/versions/vNNNN); polls for new partitions (train.online_*)")
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
    from opengem.train.startup import StartupTimer

    timer = StartupTimer()
    if args.online:
        from opengem.train.online import train_online

        res = train_online(cfg, out, args.data, timer=timer)
        for w in res["windows"]:
            ne = {k: round(v["ne"], 4) for k, v in w["eval"].items() if k.startswith("all/")}
            print(f"{w['window']}: v{w['version']:04d} rows={w['rows']} loss={w['loss']:.4f} "
                  f"progressive NE {ne}")
        print(f"stopped: {res['stopped']}; {res['versions']} versions in {out / 'versions'}")
        return 0
    summary = train(cfg, out, args.data, resume=args.resume, timer=timer)
    if summary.get("world_size", 1) == 1 or int(os.environ.get("RANK", 0)) == 0:
        print(json.dumps({k: v for k, v in summary.items() if k not in ("final_eval", "startup")}, indent=2))
        print(timer.format(summary["startup"].get("train_seconds")))
        print(f"run folder: {out}")
    return 0
