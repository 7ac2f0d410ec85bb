"""``opengem convert table``: the command's two ways in, a new dataset from source files or new rows encoded
with an existing dataset's encoders (``--encoders``), and what each prints. Above both table.py and
table_apply.py, so that neither imports the other's caller."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from opengem.data.adapters.common import bad_rows_line
from opengem.data.adapters.table import check_columns, convert_table, job_from_args
from opengem.data.adapters.table_apply import apply_encoders, apply_job_from_args
from opengem.data.commit import check_target
from opengem.errors import UsageError


def run(args: argparse.Namespace) -> int:
    check_target(args.out, args.force)  # refuse before reading the source, not after pass 1
    if getattr(args, "encoders", None):
        return _run_apply(args)
    if getattr(args, "split_name", None):
        raise UsageError("--split-name goes with --encoders DATASET (new rows into one split)")
    job = job_from_args(args)
    if args.infer_schema:
        out = Path(args.out)
        path = Path(args.schema_out) if args.schema_out else out.with_name(f"{out.name}.import.toml")
        if path.exists() and not args.force:
            raise UsageError(f"{path}: an import spec is already there (perhaps edited): re-run with "
                             f"--schema {path} to use it, or add --force to overwrite it")
        check_columns(job)  # a --label or --time the source lacks: no spec written, so no --force to re-run
        path.parent.mkdir(parents=True, exist_ok=True)  # the spec sits next to --out, whose parent may be new
        job.spec.save(path)
        job.spec_path = str(path)
        print(f"convert table: wrote the inferred import spec to {path} (edit it and re-run with "
              f"--schema {path})", file=sys.stderr)
        for note in job.notes:
            print(f"convert table: warning: {note} ({path})", file=sys.stderr)
    summary = convert_table(job, args.out, force=args.force)
    brief = {k: {"rows": v["rows"], "label_rates": v["label_rates"]} for k, v in summary["splits"].items()}
    print(json.dumps({"out": str(args.out), "split_rule": summary["split_rule"], "splits": brief,
                      "hashed": summary["hashed"], "bad_rows": summary["bad_rows"]["total"]}, indent=2))
    empty = [k for k, v in summary["vocab"].items() if v == 1]
    if empty:
        print(f"convert table: warning: {', '.join(empty)}: no value occurs {job.spec.min_count}+ times in "
              "train (an id per row?), so every row uses the OOV row: list them under ignore in "
              f"{job.spec_path or 'the spec'}", file=sys.stderr)
    _warn_skipped_rows(summary)
    return 0


def _run_apply(args: argparse.Namespace) -> int:
    a = apply_job_from_args(args)
    summary = apply_encoders(a, args.out, force=args.force)
    split = args.split_name or "test"
    print(json.dumps({"out": str(args.out), "encoders_from": str(a.dataset), "split": split,
                      "rows": summary["splits"][split]["rows"],
                      "label_rates": summary["splits"][split]["label_rates"],
                      "oov_share": summary["splits"][split]["oov_share"],
                      "unobserved_labels": summary["unobserved_labels"],
                      "bad_rows": summary["bad_rows"]["total"]}, indent=2))
    _warn_skipped_rows(summary)
    return 0


def _warn_skipped_rows(summary: dict) -> None:
    """Both ways in count the malformed source rows they skipped; a warning when there were any."""
    if summary["bad_rows"]["total"]:
        print(f"convert table: warning: skipped {summary['bad_rows']['total']} malformed source row(s): "
              f"{bad_rows_line(summary['bad_rows'])}", file=sys.stderr)
