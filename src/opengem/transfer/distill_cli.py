"""``opengem distill --fm RUN[@version] --vm-config VM.toml --data DIR --out RUN [--knowledge DIR] [--online]
[section.key=value ...]``: train a vertical model from an existing FM run.

The transfer methods are switches in the VM recipe's ``[distill]`` section (configs/distill-example.toml):
KD with weight and temperature, the Auxiliary Head, the Student Adapter, FM embeddings as features,
parameter sharing and hierarchical transfer through a domain FM run. Output is an ordinary run folder
(config.toml, metrics.jsonl, checkpoints) that ``opengem evaluate``, ``predict`` and ``report`` read.
Single shot: see :mod:`opengem.transfer.distill_run`; ``--online``: :mod:`opengem.transfer.distill_online`.
"""

from __future__ import annotations

import argparse
import json
import os
import warnings

from opengem.errors import UsageError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fm", required=True,
                   help="FM run folder (from `opengem train`, or with versions/ from `--online`); RUN@N pins "
                        "version N")
    p.add_argument("--vm-config", required=True, help="the VM recipe: [vm], [data], [train], [distill]")
    p.add_argument("--data", required=True, help="dataset folder with the FM's schema (canonical Parquet)")
    p.add_argument("--out", required=True, help="run folder of the vertical model")
    p.add_argument("--knowledge", default=None,
                   help="a side table from `opengem generate --fm RUN` to distil from (default: generate it "
                        "into RUN/knowledge)")
    p.add_argument("--online", action="store_true",
                   help="consume partitions of --data as they appear, each with the FM's newest version "
                        "trained strictly before its rows (train.online_*)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out from its newest checkpoint")
    p.add_argument("--force", action="store_true", help="--out holds another run: move it aside first")
    p.add_argument("--allow-config-change", action="store_true",
                   help="with --resume: accept settings that differ from the saved ones (recorded)")
    p.add_argument("overrides", nargs="*", metavar="section.key=value",
                   help="overrides of the VM recipe, e.g. distill.kd.weight=1.0 train.steps=100")


def run(args: argparse.Namespace) -> int:
    warnings.filterwarnings("ignore", category=FutureWarning)  # TorchRec/DCP deprecation notices
    from opengem.transfer.distill_config import load_distill_config  # torch is imported only now

    if int(os.environ.get("WORLD_SIZE", "1")) != 1:
        raise UsageError("opengem distill runs in one process for now (not under torchrun): knowledge "
                         "generation and the VM dataset are written by one writer")
    cfg = load_distill_config(args.vm_config, args.overrides)
    if args.online:
        from opengem.transfer.distill_online import distill_online

        if args.force or args.allow_config_change or args.resume:
            raise UsageError("--resume, --force and --allow-config-change do not apply to --online (a "
                             "restart on the same --out continues after the last window it trained)")
        res = distill_online(cfg, args.fm, args.data, args.out, knowledge_dir=args.knowledge)
        for w in res["windows"]:
            print(f"{w['window']}: rows={w['rows']} loss={w['loss']:.4f} FM versions {w['fm_versions_used']} "
                  f"({w['rows_with_teacher']} rows with a teacher) progressive NE {w['progressive_ne']}")
        print(f"stopped: {res['stopped']}; {len(res['windows'])} windows trained; run folder {args.out}")
        return 0
    from opengem.transfer.distill_run import distill

    res = distill(cfg, args.fm, args.data, args.out, knowledge_dir=args.knowledge, resume=args.resume,
                  force=args.force, allow_config_change=args.allow_config_change)
    long = ("final_eval", "fm_embedding_features", "shared_params")
    shown = {k: v for k, v in res.items() if k not in long}
    print(json.dumps(shown, indent=2))
    final = res["final_eval"] or {}
    ne = {k: round(v["ne"], 4) for k, v in final.items() if k.startswith("all/") and v.get("ne") is not None}
    print(f"final NE on data.eval: {ne}; run folder: {args.out} (opengem evaluate --run {args.out})")
    return 0
