"""Helpers for the multi-process tests: an aligned tiny dataset, torchrun/CLI subprocesses, metrics."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import torch

from opengem.data.commit import mark_complete

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.toml"
PY = sys.executable
BASE = ["train.progress=false", "train.threads=1", "train.warmup_steps=3", "train.dist_timeout_s=120"]


def aligned_dataset(src: Path, dst: Path, rows_per_group: int) -> Path:
    """A copy of dataset ``src`` whose files hold an even number of row groups of exactly
    ``rows_per_group`` rows: then N ranks reading every N-th row group see, step by step, the same rows
    as one rank reading N row groups per batch."""
    if dst.exists():
        return dst
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    shutil.copy(src / "schema.toml", tmp / "schema.toml")
    for f in sorted(src.glob("day=*/*.parquet")):
        t = pq.read_table(f)
        n = (t.num_rows // (2 * rows_per_group)) * 2 * rows_per_group
        out = tmp / f.relative_to(src)
        out.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(t.slice(0, n), out, row_group_size=rows_per_group)
    mark_complete(tmp, writer="tests.aligned_dataset")
    tmp.rename(dst)
    return dst


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONWARNINGS"] = "ignore"
    e["OMP_NUM_THREADS"] = "1"
    return e


def train_cmd(nproc: int, out: Path, data: Path, overrides: list[str], resume: bool = False) -> list[str]:
    args = ["--config", str(TINY), "--data", str(data), "--out", str(out), *BASE, *overrides]
    if resume:
        args.insert(0, "--resume")
    if nproc == 1:
        return [PY, "-m", "opengem.cli", "train", *args]
    # --standalone: torchrun binds its rendezvous store to a free port itself (no pick-then-bind race)
    return [PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
            "-m", "opengem.cli", "train", *args]


def run_train(nproc: int, out: Path, data: Path, overrides: list[str], resume: bool = False,
              timeout: float = 300) -> dict:
    r = subprocess.run(train_cmd(nproc, out, data, overrides, resume), env=env(), cwd=ROOT,
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    return json.loads((out / "train_summary.json").read_text())


def losses(run: Path) -> dict[int, float]:
    """step -> training loss logged at that step (last record wins: a resumed run re-logs some steps)."""
    out = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["kind"] == "train":
            out[r["step"]] = r["loss"]
    return out


def final_tensors(run: Path) -> dict[str, torch.Tensor]:
    """The final checkpoint's model tensors, read back through DCP into full (unsharded) tensors."""
    import torch.distributed.checkpoint as dcp

    from opengem.train import checkpoint as ckpt

    md = ckpt.SafeReader(str(run / "checkpoints" / "final")).read_metadata()
    out = {k: torch.empty(v.size, dtype=v.properties.dtype) for k, v in md.state_dict_metadata.items()
           if k.startswith("model.") and hasattr(v, "size")}
    dcp.load(out, storage_reader=ckpt.SafeReader(str(run / "checkpoints" / "final")), no_dist=True)
    return out


def assert_same_params(a: Path, b: Path) -> None:
    ta, tb = final_tensors(a), final_tensors(b)
    assert ta.keys() == tb.keys() and ta
    for k in ta:
        assert torch.equal(ta[k], tb[k]), k
