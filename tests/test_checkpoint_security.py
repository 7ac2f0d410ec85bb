"""No code runs from a checkpoint file (issue 10, section 1).

A checkpoint folder may come from anyone (a shared drive, a downloaded run), and DCP's ``.metadata`` is a
pickle. Every crafted ``.metadata`` here is first shown to be live (plain ``pickle`` runs it: the marker
appears), then fed to every entry point that loads a checkpoint: ``evaluate``, ``train --resume``,
``generate --fm`` (through ``versions/vNNNN``) and an online restart, in process and through the CLI. Each
must refuse with a CheckpointError and the marker must not appear. The payloads:

- ``dotted``: protocol 4 ``STACK_GLOBAL`` of module ``torch.distributed.checkpoint.filesystem``, name
  ``os.system`` (a prefix allow-list admitted the module, pickle then walked ``.os.system``);
- ``reduce``: the classic ``__reduce__`` to ``os.system``;
- ``reduce_dcp``: a ``__reduce__`` to a function inside DCP's own package (``torch_save_to_dcp``, which
  ``torch.load``s any file with ``weights_only=False``): admitted by a module-prefix allow-list;
- ``prefix``: a real ``.metadata`` with the dotted payload spliced in before its STOP: plain pickle runs
  it AND returns the real metadata, so the run would go on with correct metrics (the stealth variant).

Each payload is planted twice: with meta.json's recorded sha256 left alone (the digest check refuses it
before anything is unpickled) and with the digest updated by the attacker (the unpickler must refuse it).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import shlex
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint.filesystem as dcp_fs
from torch.distributed.checkpoint import format_utils
from torch.distributed.checkpoint.metadata import Metadata

from opengem.train import checkpoint as ckpt
from opengem.train.config import load_run_config
from opengem.train.data import prepare_data
from opengem.train.evaluate import evaluate_run
from opengem.train.online import train_online
from opengem.train.trainer import train
from opengem.transfer.generate import generate
from opengem.transfer.versions import VersionError, list_versions

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.toml"
SMALL = ["train.progress=false", "train.threads=1", "train.warmup_steps=2", "data.sim.rows=900",
         "data.batch_size=64", "train.final_eval=false"]
ONLINE = ["train.online_poll_s=0.05", "train.online_max_idle_s=0"]


# --------------------------------------------------------------------------- payloads
def _short_str(s: str) -> bytes:
    b = s.encode()
    return b"\x8c" + bytes([len(b)]) + b  # SHORT_BINUNICODE


def _dotted_call(cmd: str) -> bytes:
    """Protocol-4 opcodes pushing os.system(cmd), os.system reached as a dotted name inside a DCP module."""
    c = cmd.encode()
    return (_short_str("torch.distributed.checkpoint.filesystem") + _short_str("os.system") + b"\x93"
            + b"X" + struct.pack("<I", len(c)) + c + b"\x85" + b"R")  # STACK_GLOBAL, (cmd,), REDUCE


class _System:
    def __init__(self, cmd: str) -> None:
        self.cmd = cmd

    def __reduce__(self):
        return (os.system, (self.cmd,))


class _ViaDcpPackage:
    def __init__(self, torch_file: Path, out_dir: Path) -> None:
        self.args = (str(torch_file), str(out_dir))

    def __reduce__(self):
        return (format_utils.torch_save_to_dcp, self.args)


def _payload(kind: str, real: bytes, marker: Path) -> bytes:
    cmd = f"touch {shlex.quote(str(marker))}"
    if kind == "dotted":
        return b"\x80\x04" + _dotted_call(cmd) + b"."
    if kind == "reduce":
        return pickle.dumps(_System(cmd))
    if kind == "reduce_dcp":
        inner = marker.with_name(marker.name + ".pt")  # the attacker's torch.save file, run by torch.load
        torch.save({"x": _System(cmd)}, inner)
        return pickle.dumps(_ViaDcpPackage(inner, marker.with_name(marker.name + ".dcp")), protocol=2)
    if kind == "prefix":
        assert real.endswith(b".")
        return real[:-1] + _dotted_call(cmd) + b"0."  # ... payload, POP its result, STOP: the real Metadata
    raise AssertionError(kind)


PAYLOADS = ["dotted", "reduce", "reduce_dcp", "prefix"]


def _side_effects(marker: Path) -> list[Path]:
    return [p for p in (marker, marker.with_name(marker.name + ".dcp")) if p.exists()]


def _plant(run: Path, kind: str, marker: Path, update_digest: bool) -> int:
    """Replace every ``.metadata`` under ``run`` (checkpoints/, versions/) by a payload; returns how many."""
    planted = 0
    for md in sorted(run.rglob(ckpt.METADATA)):
        data = _payload(kind, md.read_bytes(), marker)
        md.write_bytes(data)
        if update_digest:
            meta_file = md.parent / ckpt.META
            meta = json.loads(meta_file.read_text())
            meta_file.write_text(json.dumps({**meta, ckpt.DIGEST: hashlib.sha256(data).hexdigest()}))
        planted += 1
    assert planted
    return planted


# --------------------------------------------------------------------------- runs to attack
@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return prepare_data(load_run_config(TINY, SMALL).data, tmp_path_factory.mktemp("secdata"))


@pytest.fixture(scope="module")
def batch_run(tmp_path_factory, data) -> Path:
    """A tiny trained run: checkpoints/step-00000002, step-00000004 and final."""
    run = tmp_path_factory.mktemp("secrun") / "run"
    train(load_run_config(TINY, [*SMALL, "train.steps=4", "train.checkpoint_every=2"]), run, data)
    return run


@pytest.fixture(scope="module")
def online_run(tmp_path_factory, data) -> Path:
    """A tiny online run: one published version per day under versions/vNNNN."""
    run = tmp_path_factory.mktemp("seconline") / "run"
    train_online(load_run_config(TINY, [*SMALL, *ONLINE]), run, data)
    assert len(list((run / "versions").glob("v0*"))) >= 2
    return run


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _evaluate(run: Path, data: Path, tmp: Path) -> None:
    evaluate_run(run, write=False)


def _resume(run: Path, data: Path, tmp: Path) -> None:
    train(load_run_config(run / "config.toml"), run, data, resume=True)


def _generate(run: Path, data: Path, tmp: Path) -> None:
    generate(run, data, tmp / "side")


def _online_restart(run: Path, data: Path, tmp: Path) -> None:
    train_online(load_run_config(TINY, [*SMALL, *ONLINE]), run, data)


ENTRY: dict[str, tuple[str, Callable[[Path, Path, Path], None]]] = {
    "evaluate": ("batch", _evaluate), "resume": ("batch", _resume),
    "generate": ("online", _generate), "online_restart": ("online", _online_restart),
}


# --------------------------------------------------------------------------- the payloads are real
@pytest.mark.parametrize("kind", PAYLOADS)
def test_payloads_are_live_against_plain_pickle(tmp_path, batch_run, kind):
    """What the tests below plant does run code when a file reaches plain pickle (as DCP's reader did); the
    prefix variant even returns the real metadata, so nothing would look wrong."""
    marker = tmp_path / "pwned"
    real = (batch_run / "checkpoints" / "final" / ckpt.METADATA).read_bytes()
    out = pickle.loads(_payload(kind, real, marker))
    assert marker.exists()
    if kind == "prefix":
        assert isinstance(out, Metadata) and out.state_dict_metadata == pickle.loads(real).state_dict_metadata


# --------------------------------------------------------------------------- every entry point, in process
@pytest.mark.parametrize("update_digest", [True, False], ids=["digest-forged", "digest-kept"])
@pytest.mark.parametrize("kind", PAYLOADS)
@pytest.mark.parametrize("entry", list(ENTRY))
def test_crafted_metadata_never_runs(tmp_path, data, batch_run, online_run, entry, kind, update_digest):
    src, fn = ENTRY[entry]
    run = _copy(batch_run if src == "batch" else online_run, tmp_path / "run")
    marker = tmp_path / "pwned"
    _plant(run, kind, marker, update_digest)
    expect = "never needs" if update_digest else "sha256 is not the one recorded"
    with pytest.raises(ckpt.CheckpointError, match=expect):
        fn(run, data, tmp_path)
    assert _side_effects(marker) == []


# --------------------------------------------------------------------------- every entry point, CLI
def _cli(args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "opengem.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("entry", ["evaluate", "resume", pytest.param("generate", marks=pytest.mark.slow),
                                   pytest.param("online_restart", marks=pytest.mark.slow)])
def test_cli_refuses_stealth_payload(tmp_path, data, batch_run, online_run, entry):
    """The stealth payload (real metadata + spliced call, digest forged) through the command a user runs:
    exit 1 with one line ``opengem <cmd>: error: ...`` naming the refused global, no traceback, no side
    effect."""
    src = batch_run if ENTRY[entry][0] == "batch" else online_run
    run = _copy(src, tmp_path / "run")
    marker = tmp_path / "pwned"
    _plant(run, "prefix", marker, update_digest=True)
    base = ["--config", str(TINY), "--data", str(data), *SMALL]
    args = {"evaluate": ["evaluate", "--run", str(run)],
            "resume": ["train", "--resume", "--config", str(run / "config.toml"), "--data", str(data),
                       "--out", str(run)],
            "generate": ["generate", "--fm", str(run), "--data", str(data), "--out", str(tmp_path / "side")],
            "online_restart": ["train", "--online", "--out", str(run), *base, *ONLINE]}[entry]
    r = _cli(args)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    last = [line for line in r.stderr.splitlines() if line.strip()][-1]
    assert last.startswith(f"opengem {args[0]}: error: ") and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "os.system, which a checkpoint never needs" in last
    assert _side_effects(marker) == []


# --------------------------------------------------------------------------- the two defences, one by one
def test_digest_mismatch_is_refused_before_unpickling(tmp_path, batch_run, monkeypatch):
    """A harmless but different .metadata (another checkpoint's) is refused by the recorded sha256 alone:
    the unpickler is never reached."""
    run = _copy(batch_run, tmp_path / "run")
    final = run / "checkpoints" / "final"
    shutil.copy(run / "checkpoints" / "step-00000002" / ckpt.METADATA, final / ckpt.METADATA)
    called = []
    monkeypatch.setattr(ckpt._MetadataUnpickler, "load", lambda self: called.append(1))
    with pytest.raises(ckpt.CheckpointError, match="sha256 is not the one recorded"):
        evaluate_run(run, write=False)
    assert called == []


def test_checkpoint_without_recorded_digest_is_refused(tmp_path, batch_run):
    run = _copy(batch_run, tmp_path / "run")
    meta_file = run / "checkpoints" / "final" / ckpt.META
    meta = json.loads(meta_file.read_text())
    del meta[ckpt.DIGEST]
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(ckpt.CheckpointError, match="records no sha256"):
        evaluate_run(run, write=False)


def test_dcp_own_pickle_load_is_never_called(tmp_path, batch_run, monkeypatch):
    """DCP's FileSystemReader.read_metadata unpickles with plain pickle: loading must not go through it."""

    class NoPickle:
        @staticmethod
        def load(*args, **kwargs):
            raise AssertionError("DCP's plain pickle.load was called on a checkpoint file")

        dump = staticmethod(pickle.dump)

    monkeypatch.setattr(dcp_fs, "pickle", NoPickle)
    out = evaluate_run(_copy(batch_run, tmp_path / "run"), write=False)
    assert out["step"] == 4 and out["rows"] > 0


def test_allow_list_is_exact():
    """Exact (module, name) pairs: nothing else in DCP's modules, no dotted names, no other modules."""
    refuse = [("torch.distributed.checkpoint.filesystem", "os"),
              ("torch.distributed.checkpoint.filesystem", "os.system"),
              ("torch.distributed.checkpoint.metadata", "Metadata.__init__"),
              ("torch.distributed.checkpoint.format_utils", "torch_save_to_dcp"),
              ("torch.distributed.checkpoint.planner", "reduce"),
              ("torch", "load"), ("torch", "Size.__new__"), ("builtins", "eval"), ("posix", "system")]
    u = ckpt._MetadataUnpickler(io.BytesIO(b""))
    for module, name in refuse:
        with pytest.raises(ckpt.CheckpointError, match="never needs"):
            u.find_class(module, name)
    assert u.find_class("torch.distributed.checkpoint.metadata", "Metadata") is Metadata
    assert u.find_class("torch", "bfloat16") is torch.bfloat16 and u.find_class("torch", "Size") is torch.Size


def test_data_file_outside_the_checkpoint_is_refused(tmp_path, batch_run):
    """Metadata (digest forged) naming a data file outside the folder: refused before DCP reads it."""
    run = _copy(batch_run, tmp_path / "run")
    final = run / "checkpoints" / "final"
    md = pickle.loads((final / ckpt.METADATA).read_bytes())  # our own file, in a test
    for info in md.storage_data.values():
        info.relative_path = "../../config.toml"
    data = pickle.dumps(md)
    (final / ckpt.METADATA).write_bytes(data)
    meta = json.loads((final / ckpt.META).read_text())
    (final / ckpt.META).write_text(json.dumps({**meta, ckpt.DIGEST: hashlib.sha256(data).hexdigest()}))
    with pytest.raises(ckpt.CheckpointError, match="outside the checkpoint folder"):
        evaluate_run(run, write=False)


def test_incomplete_checkpoints_are_never_read(tmp_path, batch_run):
    """A ``.tmp`` folder or one without meta.json (both a crash mid-save) is never picked nor unpickled,
    even holding a payload and a higher step."""
    run = _copy(batch_run, tmp_path / "run")
    root = run / "checkpoints"
    marker = tmp_path / "pwned"
    evil = _payload("reduce", b"", marker)
    for name in ("step-00000099", "step-00000098.tmp", "final.tmp"):
        (root / name).mkdir()
        (root / name / ckpt.METADATA).write_bytes(evil)
    meta = json.loads((root / "final" / ckpt.META).read_text())
    (root / "step-00000098.tmp" / ckpt.META).write_text(json.dumps({**meta, "step": 98}))
    assert ckpt.latest_checkpoint(run).name == "final"
    assert [p.name for p in ckpt.periodic_checkpoints(root)] == ["step-00000002", "step-00000004"]
    with pytest.raises(ckpt.CheckpointError, match="not an opengem checkpoint"):
        ckpt.load(root / "step-00000099", torch.nn.Linear(1, 1))
    with pytest.raises(ckpt.CheckpointError, match="incomplete"):
        ckpt.load(root / "step-00000098.tmp", torch.nn.Linear(1, 1))
    assert evaluate_run(run, write=False)["step"] == 4
    assert _side_effects(marker) == []


@pytest.mark.parametrize("text,expect", [("{not json", "unreadable manifest"), ("[1, 2]", "JSON object"),
                                         ('{"version": "abc", "trained_through_ts": 5}', "must be integers"),
                                         ('{"version": 1, "trained_through_ts": 5, "partitions": "day=0"}',
                                          "list of partition names")])
def test_damaged_version_manifest_is_named(tmp_path, text, expect):
    """``generate --fm`` reads versions/vNNNN/manifest.json: a damaged one is a VersionError naming it."""
    m = tmp_path / "versions" / "v0001" / "manifest.json"
    m.parent.mkdir(parents=True)
    m.write_text(text)
    with pytest.raises(VersionError, match=expect) as e:
        list_versions(tmp_path)
    assert str(m) in str(e.value)
