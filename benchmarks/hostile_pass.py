"""Hostile and careless use of the ``opengem`` command, case by case (issue 10, sections 4 and 5).

    .venv/bin/python benchmarks/hostile_pass.py [--only SUBSTR[,SUBSTR...]] [--keep DIR] [--json OUT]
                                                [--timeout S]

Each case runs the real CLI in a fresh process inside one temporary folder: bad configs and overrides,
missing paths, folders given for files and files for folders, non-UTF-8 files, wrong types and negative
sizes, corrupt Parquet, a corrupt or crafted checkpoint, a read-only and a full disk (tmpfs mounts when
the machine allows them; skipped otherwise), on every subcommand. It prints one row per case: exit code,
whether a Python traceback appeared, and the line a person reads. The target is zero tracebacks without
``--debug``: a user's mistake must end in one line ``opengem <cmd>: error: ...`` naming what to fix. A
hostile case that exits 0 is listed as "accepted" (silently wrong, or a recovery: read its line).
Tiny sizes throughout: the whole pass takes a few minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.toml"
TRACEBACK = "Traceback (most recent call last)"
AVAZU = Path(os.environ.get("OPENGEM_DATA", ROOT.parent / "shared" / "data")) / "avazu_head"
SIM = ["--rows", "2000", "--days", "3", "--surfaces", "2", "--users", "200", "--ads", "100",
       "--advertisers", "20", "--topics", "10", "--seq-mean", "4", "--seq-max", "8", "--recent-k", "2",
       "--emb-dim", "4", "--chunk-rows", "500", "--quiet"]
FAST = ["train.steps=2", "train.progress=false", "train.warmup_steps=1", "train.threads=1"]
PWNED = "PWNED"  # the file a crafted checkpoint tries to create


@dataclass
class Case:
    name: str
    argv: list[str]
    expect: str = "error"  # "error": a hostile or careless call; "ok": a control that must work
    setup: Callable[[Path], object] | None = None
    needs: str = ""  # "tmpfs" / "avazu": skipped when the machine cannot provide it
    debug: bool = False  # a traceback is expected (--debug)
    cwd_file: str = ""  # a file whose existence after the run means a crafted payload ran


@dataclass
class Result:
    case: str
    expect: str
    rc: int | None
    traceback: bool
    line: str
    seconds: float
    outcome: str
    extra: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------- helpers for setups
def write(path: Path, data: bytes | str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        path.write_text(data, encoding="utf-8")
    else:
        path.write_bytes(data)


def copy_tree(src: Path, dst: Path) -> Path:
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    return dst


def first_part(dataset: Path) -> Path:
    return sorted(dataset.rglob("part-*.parquet"))[0]


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


class Payload:
    """A pickle that, when loaded by an unrestricted unpickler, creates the PWNED file (section 1)."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"touch {self.target}",))


@contextlib.contextmanager
def tmpfs(path: Path, size: str, readonly: bool = False) -> Iterator[bool]:
    """Mount a small tmpfs at ``path`` (root only); yields False when the machine refuses."""
    path.mkdir(parents=True, exist_ok=True)
    opts = f"size={size}" + (",ro" if readonly else "")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)],
                             capture_output=True).returncode == 0 if shutil.which("mount") else False
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", str(path)], capture_output=True)


# ----------------------------------------------------------------------------- the cases
def cases(w: Path) -> list[Case]:
    D, R = str(w / "D"), str(w / "R")
    tiny = str(TINY)
    nonutf8 = b'[train]\nsteps = 2 # caf\xe9 \xff\n'
    out: list[Case] = []
    add = out.append

    # --- simulate
    add(Case("simulate: --out is a file", ["simulate", "--out", "afile", *SIM],
             setup=lambda w: write(w / "afile", "x")))
    add(Case("simulate: --rows 0", ["simulate", "--out", "s0", *SIM, "--rows", "0"]))
    add(Case("simulate: --rows -5", ["simulate", "--out", "s1", *SIM, "--rows", "-5"]))
    add(Case("simulate: --rows abc", ["simulate", "--out", "s2", *SIM, "--rows", "abc"]))
    add(Case("simulate: --days 0", ["simulate", "--out", "s3", *SIM, "--days", "0"]))
    add(Case("simulate: --topics 0", ["simulate", "--out", "s4", *SIM, "--topics", "0"]))
    add(Case("simulate: --compression bogus", ["simulate", "--out", "s5", *SIM, "--compression", "bogus"]))
    add(Case("simulate: existing dataset, no --force", ["simulate", "--out", D, *SIM]))
    add(Case("simulate: read-only --out", ["simulate", "--out", "ro/d", *SIM], needs="tmpfs:ro"))
    add(Case("simulate: disk full", ["simulate", "--out", "full/d", *SIM, "--rows", "40000",
                                     "--chunk-rows", "5000"], needs="tmpfs:full"))

    # --- convert
    add(Case("convert: unknown dataset", ["convert", "nosuch", "--out", "c0"]))
    add(Case("convert: --src missing", ["convert", "avazu_head", "--src", "nope", "--out", "c1"]))
    add(Case("convert: --src is a file", ["convert", "avazu_head", "--src", "afile2", "--out", "c2"],
             setup=lambda w: write(w / "afile2", "x")))
    add(Case("convert: --limit 0", ["convert", "avazu_head", "--src", str(AVAZU), "--out", "c3",
                                    "--limit", "0"], needs="avazu"))
    add(Case("convert: binary garbage CSVs", ["convert", "avazu_head", "--src", "garbage", "--out", "c4"],
             setup=lambda w: [write(w / "garbage" / n, os.urandom(4096)) for n in
                              ("train.csv", "dev.csv", "test.csv")]))
    add(Case("convert: source cut mid-file", ["convert", "avazu_head", "--src", "cut", "--out", "c5"],
             setup=_cut_avazu, needs="avazu"))
    add(Case("convert: into a folder holding a dataset", ["convert", "avazu_head", "--src", str(AVAZU),
                                                          "--out", "Dcopy", "--limit", "500"],
             setup=lambda w: copy_tree(w / "D", w / "Dcopy"), needs="avazu"))
    add(Case("convert table: --encoders of a dataset the importer did not write (the simulator's)",
             ["convert", "table", "--src", "log.csv", "--encoders", D, "--out", "c6"], setup=_log_csv))
    add(Case("convert table: --encoders, a surface the encoders never saw",
             ["convert", "table", "--src", "log_odd.csv", "--encoders", "T", "--out", "c7"],
             setup=_converted_log))
    add(Case("convert table: --encoders with --label", ["convert", "table", "--src", "log.csv", "--encoders",
                                                         "T", "--label", "click", "--out", "c8"],
             setup=_converted_log))
    add(Case("convert table: a spec whose history shares a feature it does not have",
             ["convert", "table", "--src", "log.csv", "--schema", "bad_share.toml", "--out", "c9"],
             setup=lambda w: (_log_csv(w), write(w / "bad_share.toml", 'name = "x"\nlabels = ["click"]\n'
                                                 'sequence = [{ name = "hist", separator = "^", '
                                                 'share = "nope" }]\n'))))
    add(Case("convert table: a history spread over columns, one of them not in the file",
             ["convert", "table", "--src", "log.csv", "--schema", "spread.toml", "--out", "c11"],
             setup=lambda w: (_log_csv(w), write(w / "spread.toml", 'name = "x"\nlabels = ["click"]\n'
                                                 'sequence = [{ name = "seen", columns = ["ad", "ad2"], '
                                                 'pad = "0" }]\n'))))
    add(Case("convert table: a grouped history whose row holds another number of events than its group",
             ["convert", "table", "--src", "log.csv", "--schema", "grouped.toml", "--out", "c12"],
             setup=lambda w: (_log_csv(w), write(w / "grouped.toml", 'name = "x"\nlabels = ["click"]\n'
                                                 'sequence = [{ name = "hist", separator = "^" }, '
                                                 '{ name = "ad", separator = "^", group = "hist" }]\n'))))
    add(Case("convert table: a history of ints sharing a string-keyed feature that is not one",
             ["convert", "table", "--src", "log.parquet", "--schema", "share_int.toml", "--out", "c10"],
             setup=_int_history_parquet))

    # --- validate
    add(Case("validate: a good dataset (control)", ["validate", "--data", D], expect="ok"))
    add(Case("validate: --data missing", ["validate", "--data", "nope"]))
    add(Case("validate: --data is a file", ["validate", "--data", "afile3"],
             setup=lambda w: write(w / "afile3", "x")))
    add(Case("validate: --schema non-UTF-8", ["validate", "--data", D, "--schema", "bad_schema.toml"],
             setup=lambda w: write(w / "bad_schema.toml", b'name = "caf\xe9"\n')))
    add(Case("validate: --schema is a folder", ["validate", "--data", D, "--schema", str(w)]))
    add(Case("validate: --schema not TOML", ["validate", "--data", D, "--schema", "notoml.toml"],
             setup=lambda w: write(w / "notoml.toml", "name = [unclosed\n")))
    add(Case("validate: corrupt Parquet", ["validate", "--data", "Dcorrupt"],
             setup=lambda w: truncate(first_part(copy_tree(w / "D", w / "Dcorrupt")))))
    add(Case("validate: stray Parquet at the root", ["validate", "--data", "Dstray"],
             setup=lambda w: shutil.copy(first_part(copy_tree(w / "D", w / "Dstray")),
                                         w / "Dstray" / "stray.parquet")))
    add(Case("validate: emptied partition", ["validate", "--data", "Dempty"],
             setup=lambda w: [p.unlink() for p in (copy_tree(w / "D", w / "Dempty") / "day=001")
                              .glob("*.parquet")]))
    add(Case("validate: --partitions matches nothing", ["validate", "--data", D, "--partitions", "day=9*"]))

    # --- train
    add(Case("train: overrides before --out (control)", ["train", "--config", tiny, *FAST, "--out", "Rok",
                                                         "--data", D, "train.seed=1"], expect="ok"))
    add(Case("train: --config missing", ["train", "--config", "nope.toml"]))
    add(Case("train: --config is a folder", ["train", "--config", str(w)]))
    add(Case("train: --config non-UTF-8", ["train", "--config", "bad.toml"],
             setup=lambda w: write(w / "bad.toml", nonutf8)))
    add(Case("train: --config not TOML", ["train", "--config", "notoml.toml"],
             setup=lambda w: write(w / "notoml.toml", "name = [unclosed\n")))
    add(Case("train: unknown key in config", ["train", "--config", "typo.toml"],
             setup=lambda w: write(w / "typo.toml", "[train]\nstepz = 3\n")))
    add(Case("train: data.sim.rows=abc", ["train", "--config", tiny, "data.sim.rows=abc", "--out", "x1"]))
    add(Case('train: data.sim.rows="abc" (quoted)', ["train", "--config", tiny, 'data.sim.rows="abc"',
                                                     "--out", "x1b"]))
    add(Case("train: train.lr=abc", ["train", "--config", tiny, "train.lr=abc", "--out", "x2"]))
    add(Case("train: train.steps=-1", ["train", "--config", tiny, "train.steps=-1", "--out", "x3"]))
    add(Case("train: data.batch_size=0", ["train", "--config", tiny, "data.batch_size=0", "--out", "x4"]))
    add(Case("train: data.skip_batches past the split", ["train", "--config", tiny, *FAST, "--data", D,
                                                         "data.skip_batches=100000", "--out", "x4b"]))
    add(Case("train: model.embedding.d=-4", ["train", "--config", tiny, *FAST, "--data", D,
                                             "model.embedding.d=-4", "--out", "x5"]))
    add(Case("train: model.name=nosuch", ["train", "--config", tiny, *FAST, "--data", D,
                                          "model.name=nosuch", "--out", "x6"]))
    add(Case("train: override without '='", ["train", "--config", tiny, "trainsteps", "--out", "x7"]))
    add(Case("train: --out is a file", ["train", "--config", tiny, *FAST, "--data", D, "--out", "afile4"],
             setup=lambda w: write(w / "afile4", "x")))
    add(Case("train: --data missing", ["train", "--config", tiny, *FAST, "--data", "nope", "--out", "x8"]))
    add(Case("train: --data with corrupt Parquet", ["train", "--config", tiny, *FAST, "--data", "Dcorrupt2",
                                                   "--out", "x9"],
             setup=lambda w: truncate(first_part(copy_tree(w / "D", w / "Dcorrupt2")))))
    add(Case("train: --out on a read-only disk", ["train", "--config", tiny, *FAST, "--data", D,
                                                  "--out", "ro/run"], needs="tmpfs:ro"))
    add(Case("train: --out on a full disk", ["train", "--config", tiny, *FAST, "--data", D,
                                             "--out", "full/run"], needs="tmpfs:full"))
    add(Case("train: --debug shows the traceback", ["train", "--debug", "--config", "nope.toml"], debug=True))

    # --- evaluate
    add(Case("evaluate: the fixture run (control)", ["evaluate", "--run", R], expect="ok"))
    add(Case("evaluate: --run missing", ["evaluate", "--run", "nope"]))
    add(Case("evaluate: --run is a file", ["evaluate", "--run", "afile5"],
             setup=lambda w: write(w / "afile5", "x")))
    add(Case("evaluate: --run without config.toml", ["evaluate", "--run", "emptyrun"],
             setup=lambda w: (w / "emptyrun").mkdir(exist_ok=True)))
    add(Case("evaluate: config.toml non-UTF-8", ["evaluate", "--run", "Rbadcfg"],
             setup=lambda w: write(copy_tree(w / "R", w / "Rbadcfg") / "config.toml", nonutf8)))
    add(Case("evaluate: checkpoint .metadata garbage", ["evaluate", "--run", "Rgarbage"],
             setup=lambda w: [write(p, os.urandom(512)) for p in
                              copy_tree(w / "R", w / "Rgarbage").rglob(".metadata")]))
    add(Case("evaluate: checkpoint .metadata __reduce__ payload", ["evaluate", "--run", "Rpwn"],
             setup=lambda w: [write(p, pickle.dumps(Payload(w / PWNED))) for p in
                              copy_tree(w / "R", w / "Rpwn").rglob(".metadata")], cwd_file=PWNED))
    add(Case("evaluate: checkpoint shard truncated", ["evaluate", "--run", "Rtrunc"],
             setup=lambda w: [truncate(p) for p in copy_tree(w / "R", w / "Rtrunc").rglob("*.distcp")]))
    add(Case("evaluate: --partitions matches nothing", ["evaluate", "--run", R, "--partitions", "day=9*"]))
    add(Case("evaluate: --data missing", ["evaluate", "--run", R, "--data", "nope"]))
    add(Case("evaluate: run trained with model.head.hidden=[] (control)", ["evaluate", "--run", "Rempty"],
             expect="ok", setup=lambda w: _train(w, "Rempty", "model.head.hidden=[]")))

    # --- predict, export, serve, bench serve, distill (issues 11, 15, 16)
    add(Case("predict: the fixture run (control)", ["predict", "--run", R, "--out", "p_ok.parquet"],
             expect="ok"))
    add(Case("predict: --run missing", ["predict", "--run", "nope", "--out", "p0.parquet"]))
    add(Case("predict: --data with corrupt Parquet", ["predict", "--run", R, "--data", "Dcorrupt3", "--out",
                                                      "p1.parquet"],  # every part: predict reads eval days
             setup=lambda w: [truncate(p) for p in
                              copy_tree(w / "D", w / "Dcorrupt3").rglob("part-*.parquet")]))
    add(Case("predict: --out is a folder", ["predict", "--run", R, "--out", str(w)]))
    add(Case("export: the fixture run, eager (control)", ["export", R, "--out", "E", "--backend", "eager"],
             expect="ok"))
    add(Case("export: run missing", ["export", "nope", "--out", "e0"]))
    add(Case("export: RUN@version that does not exist", ["export", f"{R}@99", "--out", "e1"]))
    add(Case("export: --out is a file", ["export", R, "--out", "afile7"],
             setup=lambda w: write(w / "afile7", "x")))
    add(Case("export: checkpoint .metadata __reduce__ payload", ["export", "Rpwn2", "--out", "e2"],
             setup=lambda w: [write(p, pickle.dumps(Payload(w / PWNED))) for p in
                              copy_tree(w / "R", w / "Rpwn2").rglob(".metadata")], cwd_file=PWNED))
    add(Case("serve: --model missing", ["serve", "--model", "nope", "--port", "0"]))
    add(Case("serve: --model is a file", ["serve", "--model", "afile8", "--port", "0"],
             setup=lambda w: write(w / "afile8", "x")))
    add(Case("serve: --model an empty folder", ["serve", "--model", "emptymodel", "--port", "0"],
             setup=lambda w: (w / "emptymodel").mkdir(exist_ok=True)))
    add(Case("serve: artifact with a tampered weight file", ["serve", "--model", "Etamper", "--port", "0"],
             setup=lambda w: _tamper(_export(w), w / "Etamper", "weights.pt", b"\0" * 64)))
    add(Case("serve: artifact weights replaced by a __reduce__ payload",
             ["serve", "--model", "Epwn", "--port", "0"],
             setup=lambda w: _tamper(_export(w), w / "Epwn", "weights.pt", pickle.dumps(Payload(w / PWNED))),
             cwd_file=PWNED))
    add(Case("serve: artifact manifest not JSON", ["serve", "--model", "Ebadman", "--port", "0"],
             setup=lambda w: _tamper(_export(w), w / "Ebadman", "manifest.json", b"{\xff not json")))
    add(Case("serve: --backend aoti on an artifact without one", ["serve", "--model", "Eonly", "--backend",
                                                                 "aoti", "--port", "0"],
             setup=lambda w: copy_tree(_export(w), w / "Eonly")))
    add(Case("serve: --port abc", ["serve", "--model", "Eport", "--port", "abc"],
             setup=lambda w: copy_tree(_export(w), w / "Eport")))
    add(Case("serve: --port 70000", ["serve", "--model", "Eport2", "--port", "70000"],
             setup=lambda w: copy_tree(_export(w), w / "Eport2")))
    add(Case("serve: --cpus 999", ["serve", "--model", "Ecpu", "--port", "0", "--cpus", "999"],
             setup=lambda w: copy_tree(_export(w), w / "Ecpu")))
    add(Case("serve: --config non-UTF-8", ["serve", "--model", "Ecfg", "--config", "bad_serve.toml"],
             setup=lambda w: [copy_tree(_export(w), w / "Ecfg"), write(w / "bad_serve.toml", nonutf8)]))
    add(Case("serve: --config unknown key", ["serve", "--model", "Ecfg2", "--config", "typo_serve.toml"],
             setup=lambda w: [copy_tree(_export(w), w / "Ecfg2"),
                              write(w / "typo_serve.toml", "max_candidatez = 3\n")]))
    add(Case("serve: --canary not JSON", ["serve", "--model", R, "--canary", "canary.json", "--port", "0"],
             setup=lambda w: write(w / "canary.json", "[{unclosed")))
    add(Case("bench serve: --model missing", ["bench", "serve", "--model", "nope", "--data", D]))
    add(Case("bench serve: --candidates 0", ["bench", "serve", "--model", R, "--data", D,
                                             "--candidates", "0"]))
    add(Case("bench serve: --clients x", ["bench", "serve", "--model", R, "--data", D, "--clients", "x"]))
    add(Case("distill: --fm missing", ["distill", "--fm", "nope", "--vm-config",
                                       str(ROOT / "configs" / "distill-example.toml"), "--data", D,
                                       "--out", "d0"]))
    add(Case("distill: --vm-config is a training config", ["distill", "--fm", R, "--vm-config", tiny,
                                                           "--data", D, "--out", "d2"]))
    add(Case("distill: --vm-config missing", ["distill", "--fm", R, "--vm-config", "nope.toml", "--data", D,
                                              "--out", "d1"]))

    # --- generate
    add(Case("generate: --fm missing", ["generate", "--fm", "nope", "--data", D, "--out", "g0"]))
    add(Case("generate: --fm a batch-trained run (version 0, as distill reads it; control)",
             ["generate", "--fm", R, "--data", D, "--out", "g1"], expect="ok"))
    add(Case("generate: --fm is a file", ["generate", "--fm", "afile6", "--data", D, "--out", "g2"],
             setup=lambda w: write(w / "afile6", "x")))
    add(Case("generate: --lag -1", ["generate", "--fm", R, "--data", D, "--out", "g3", "--lag", "-1"]))
    add(Case("generate: --batch-size 0", ["generate", "--fm", R, "--data", D, "--out", "g4",
                                          "--batch-size", "0"]))

    # --- transfer, bench, scale, report
    add(Case("transfer: --config missing", ["transfer", "--config", "nope.toml", "--out", "t0"]))
    add(Case("transfer: unknown key", ["transfer", "--config", "ttypo.toml", "--out", "t1"],
             setup=lambda w: write(w / "ttypo.toml", "seedz = [0]\n")))
    add(Case("transfer: seeds=abc", ["transfer", "--config", str(ROOT / "configs" / "transfer-tiny.toml"),
                                     "--out", "t2", "seeds=abc"]))
    add(Case("bench: --config non-UTF-8", ["bench", "train", "--config", "bad.toml", "--steps", "1"],
             setup=lambda w: write(w / "bad.toml", nonutf8)))
    add(Case("bench: bad override", ["bench", "train", "--config", tiny, "train.steps=abc", "--steps", "1"]))
    add(Case("bench: --steps -1", ["bench", "train", "--config", tiny, "--data", D, "--steps", "-1",
                                   "--out", "b0", *FAST]))
    add(Case("scale: --config missing", ["scale", "--config", "nope.toml", "--out", "sc0"]))
    add(Case("scale: --set bad key", ["scale", "--config", str(ROOT / "configs" / "scaling-tiny.toml"),
                                      "--set", "proxy.enabld=true", "--out", "sc1"]))
    add(Case("report: path missing", ["report", "nope"]))
    add(Case("report: metrics.jsonl corrupt", ["report", "Rbadmetrics", "--out", "rep.html"],
             setup=lambda w: write(copy_tree(w / "R", w / "Rbadmetrics") / "metrics.jsonl",
                                   b"{\xff not json\n")))
    add(Case("report: --out is a folder", ["report", R, "--out", str(w)]))
    add(Case("(no command) opengem nosuch", ["nosuch"]))
    return out


def _export(w: Path) -> Path:
    """The fixture run exported once (eager: no compiler needed), for the serve cases to copy and damage."""
    out = w / "Efix"
    if not (out / "manifest.json").is_file():
        p = opengem(["export", "R", "--out", "Efix", "--backend", "eager"], w, 600)
        if p.returncode != 0:
            raise RuntimeError(f"fixture export failed:\n{p.stderr[-3000:]}")
    return out


def _tamper(src: Path, dst: Path, name: str, data: bytes) -> None:
    write(copy_tree(src, dst) / name, data)


def _log_csv(w: Path) -> None:
    """A small click log with a '^'-joined history and two surfaces."""
    lines = ["place,ad,hist,click"] + [f"{['feed', 'search'][i % 2]},a{i % 7},{i % 5}^{i % 3},{i % 2}"
                                       for i in range(200)]
    write(w / "log.csv", "\n".join(lines) + "\n")
    write(w / "log_odd.csv", "\n".join([*lines[:50], "video,a1,1^2,1", *lines[50:]]) + "\n")


def _converted_log(w: Path) -> None:
    _log_csv(w)
    if (w / "T" / "encoders.json").is_file():  # made by an earlier case
        return
    r = opengem(["convert", "table", "--src", "log.csv", "--label", "click", "--surface", "place",
                 "--infer-schema", "--out", "T"], w, 120)
    assert r.returncode == 0, r.stderr


def _int_history_parquet(w: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"ad": pa.array([1, 2, 3] * 30, pa.int64()), "hist": ["1^2", "x^3", ""] * 30,
                             "click": [1.0, 0.0, 0.0] * 30}), w / "log.parquet")
    write(w / "share_int.toml", 'name = "p"\nlabels = ["click"]\nsparse = [{ name = "ad" }]\n'
                                'sequence = [{ name = "hist", separator = "^", share = "ad" }]\n')


def _cut_avazu(w: Path) -> None:
    src = w / "cut"
    src.mkdir(exist_ok=True)
    for name in ("train.csv", "dev.csv", "test.csv"):
        shutil.copy(AVAZU / name, src / name)
    data = (src / "train.csv").read_bytes()
    (src / "train.csv").write_bytes(data[: len(data) // 3 + 17])  # mid-line


def opengem(argv: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("OPENGEM_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "opengem.cli", *argv], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=timeout, errors="replace")


def _train(w: Path, out: str, *overrides: str) -> None:
    p = opengem(["train", "--config", str(TINY), "--data", str(w / "D"), "--out", out, *FAST, *overrides],
                w, 600)
    if p.returncode != 0:
        raise RuntimeError(f"fixture train {out} failed:\n{p.stderr[-3000:]}")


def prepare(w: Path) -> None:
    """The fixtures most cases start from: a tiny simulated dataset D and a tiny trained run R."""
    if not (w / "D" / "schema.toml").exists():
        p = opengem(["simulate", "--out", "D", *SIM], w, 600)
        if p.returncode != 0:
            raise RuntimeError(f"fixture simulate failed:\n{p.stderr[-3000:]}")
    if not (w / "R" / "config.toml").exists():
        _train(w, "R")


def person_line(stderr: str, stdout: str) -> str:
    """The line a person reads: the ``error:`` line if any, else the first line that is not log noise."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for ln in lines:
        if ": error:" in ln or ln.startswith("error:"):
            return ln
    noise = ("WARNING:", "[W", "warnings.warn", "I0", "W0")
    for ln in lines:
        if not ln.startswith(noise):
            return ln
    out = [ln.strip() for ln in stdout.splitlines() if ln.strip()]
    return out[0] if out else ""


def run_case(case: Case, w: Path, timeout: float) -> Result:
    mount = case.needs.split(":")[1] if case.needs.startswith("tmpfs:") else ""
    if case.needs == "avazu" and not AVAZU.is_dir():
        return Result(case.name, case.expect, None, False, f"skipped: no {AVAZU}", 0.0, "skipped")
    t0 = time.perf_counter()
    try:
        if case.setup is not None:
            case.setup(w)
        with contextlib.ExitStack() as stack:
            if mount:
                ok = stack.enter_context(tmpfs(w / mount, "256k" if mount == "full" else "1m",
                                               readonly=mount == "ro"))
                if not ok:
                    return Result(case.name, case.expect, None, False, "skipped: cannot mount a tmpfs here",
                                  0.0, "skipped")
            p = opengem(case.argv, w, timeout)
    except subprocess.TimeoutExpired:
        return Result(case.name, case.expect, None, False, f"timed out after {timeout:.0f}s",
                      time.perf_counter() - t0, "timeout")
    seconds = time.perf_counter() - t0
    tb = TRACEBACK in p.stderr or TRACEBACK in p.stdout
    line = person_line(p.stderr, p.stdout)
    pwned = bool(case.cwd_file) and (w / case.cwd_file).exists()
    if pwned:
        outcome = "CODE RAN"
    elif case.debug:
        outcome = "debug ok" if tb and p.returncode != 0 else "debug: no traceback"
    elif tb:
        outcome = "TRACEBACK"
    elif case.expect == "ok":
        outcome = "ok" if p.returncode == 0 else "control failed"
    elif p.returncode == 0:
        outcome = "accepted"
    else:
        one_line = line.startswith("opengem") and ": error:" in line
        outcome = "one line" if one_line else "error, other form"
    return Result(case.name, case.expect, p.returncode, tb, line, seconds, outcome)


def format_table(results: list[Result]) -> str:
    w = max(len(r.case) for r in results)
    rows = [f"{'#':>3}  {'case':<{w}}  {'rc':>4}  {'tb':<3}  {'outcome':<18}  first line a person reads"]
    for i, r in enumerate(results, 1):
        rc = "-" if r.rc is None else str(r.rc)
        line = r.line if len(r.line) <= 150 else r.line[:147] + "..."
        tb = "yes" if r.traceback else "no"
        rows.append(f"{i:>3}  {r.case:<{w}}  {rc:>4}  {tb:<3}  {r.outcome:<18}  {line}")
    return "\n".join(rows)


def summarize(results: list[Result]) -> dict[str, int]:
    counts: dict[str, int] = {"cases": len(results)}
    for r in results:
        counts[r.outcome] = counts.get(r.outcome, 0) + 1
    counts["tracebacks without --debug"] = sum(
        1 for r in results if r.traceback and not r.outcome.startswith("debug"))
    return counts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="",
                    help="run only the cases whose name contains one of these comma-separated texts")
    ap.add_argument("--keep", default="", help="work in this folder and keep it (default: a temporary one)")
    ap.add_argument("--json", default="", help="also write the results as JSON here")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per case")
    args = ap.parse_args()
    with contextlib.ExitStack() as stack:
        if args.keep:
            w = Path(args.keep).resolve()
            w.mkdir(parents=True, exist_ok=True)
        else:
            w = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="opengem-hostile-")))
        t0 = time.perf_counter()
        prepare(w)
        print(f"fixtures ready in {time.perf_counter() - t0:.0f}s ({w})", flush=True)
        results = []
        for case in cases(w):
            if args.only and not any(part in case.name for part in args.only.split(",")):
                continue
            r = run_case(case, w, args.timeout)
            results.append(r)
            print(f"  {r.outcome:<18} {r.seconds:5.1f}s  {r.case}", flush=True)
    print()
    print(format_table(results))
    counts = summarize(results)
    print()
    print("summary: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": counts, "results": [r.__dict__ for r in results]},
                                              indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
