"""``opengem train --config C.toml [--data DIR] [--out RUN] [--resume | --force] [section.key=value ...]``.

The run folder is locked and owned by one run (train/run_dir.py): a folder holding another run is refused
unless ``--resume`` (continue it) or ``--force`` (move it aside); ``--resume`` refuses changed settings
unless ``--allow-config-change``. Ctrl-C or SIGTERM saves a checkpoint and exits 130/143 with one line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import warnings
from pathlib import Path

from opengem.errors import UsageError
from opengem.train.startup import StartupTimer


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, help="TOML recipe (configs/tiny.toml, small, base, large)")
    p.add_argument("--data", default=None,
                   help="dataset folder (default: data.path, else simulate into RUN/data)")
    p.add_argument("--out", default=None, help="run folder (default: runs/<recipe>-<model>)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out from its newest complete checkpoint "
                        "(a fresh start if there is none)")
    p.add_argument("--force", action="store_true",
                   help="--out holds another run: move it aside to RUN.old-<time> and start a new run")
    p.add_argument("--allow-config-change", action="store_true",
                   help="with --resume: accept settings that differ from the saved config.toml (recorded "
                        "in metrics.jsonl and train_summary.json)")
    p.add_argument("--online", action="store_true",
                   help="continuous training: evaluate, train and publish each new time partition in turn "
                        "(RUN/versions/vNNNN); polls for new partitions (train.online_*)")
    p.add_argument("overrides", nargs="*", metavar="section.key=value",
                   help="config overrides, values as TOML literals, e.g. model.name=dlrm train.steps=100")


def run(args: argparse.Namespace) -> int:
    warnings.filterwarnings("ignore", category=FutureWarning)  # TorchRec/DCP deprecation notices
    # torch and torchrec are imported only now, so that `opengem train --help` stays fast
    from opengem.train.config import load_run_config
    from opengem.train.run_dir import RunLock
    from opengem.train.trainer import train

    cfg = load_run_config(args.config, args.overrides)
    stem = Path(args.config).stem if args.config else "default"
    out = Path(args.out or f"runs/{stem}-{cfg.model.name}")
    timer = StartupTimer()
    if args.online:
        from opengem.train.online import train_online

        if args.force or args.allow_config_change:
            raise UsageError("--force and --allow-config-change do not apply to --online (a restart on the "
                             "same --out continues after its newest published version)")
        if out.exists() and not out.is_dir():
            raise UsageError(f"{out}: --out is a file, not a folder; choose a folder for the run")
        out.mkdir(parents=True, exist_ok=True)
        with RunLock(out):
            res = train_online(cfg, out, args.data, timer=timer)
        for w in res["windows"]:
            ne = {k: None if v["ne"] is None else round(v["ne"], 4)  # None: NE undefined on this window
                  for k, v in w["eval"].items() if k.startswith("all/")}
            print(f"{w['window']}: v{w['version']:04d} rows={w['rows']} loss={w['loss']:.4f} "
                  f"progressive NE {ne}")
        print(f"stopped: {res['stopped']}; {res['versions']} versions in {out / 'versions'}; "
              f"{len(res['quarantined'])} partitions quarantined, {len(res['pending'])} not trained "
              "(reasons above and in online_summary.json)")
        # stopped by a signal: 128 + its number, as an offline run (a supervisor tells it from an end)
        return {"SIGINT": 128 + signal.SIGINT, "SIGTERM": 128 + signal.SIGTERM}.get(res["stopped"], 0)
    summary = train(cfg, out, args.data, resume=args.resume, force=args.force,
                    allow_config_change=args.allow_config_change, timer=timer)
    if summary.get("world_size", 1) == 1 or int(os.environ.get("RANK", 0)) == 0:
        print(json.dumps({k: v for k, v in summary.items() if k not in ("final_eval", "startup")}, indent=2))
        print(timer.format(summary["startup"].get("train_seconds")))
        print(f"run folder: {out}")
    return 0
