"""Who owns a run folder, and what a restart may change in it.

A run folder (``opengem train --out RUN``) belongs to exactly one run, so that nothing a run wrote is
lost or mixed with another run's files:

- **Lock.** ``RUN/.lock`` is held with ``fcntl.flock`` for the life of a run (the kernel drops it when
  the process dies, even on kill -9, so it never goes stale); it holds the owner's pid, host and start
  time, and a second writer fails at once naming them. Under torchrun only rank 0 locks.
- **Run id.** ``RUN/run.json`` names the run (a uuid) and is written when the run starts; checkpoints
  carry the id, and ``evaluate``, ``--resume`` and checkpoint retention only consider the run's own.
- **Reuse.** A folder that already holds a run is refused unless ``--resume`` (continue that run) or
  ``--force`` (the old run is moved aside whole to ``RUN.old-<timestamp>``, never mixed into the new one).
- **Resume.** ``--resume`` with settings that change what the run computes (learning rate, batch size,
  seed, data selection, any model setting, ...) is refused naming the keys, unless
  ``--allow-config-change``; the trainer then records the change. The log is rolled back to the step of
  the checkpoint it resumes from, so no step is logged twice.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import socket
import tomllib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from opengem.config import ConfigError, flatten_dict, to_dict
from opengem.data.commit import atomic_write_text
from opengem.errors import OpengemError, UsageError
from opengem.train.config import RunConfig, load_run_config

LOCK_FILE = ".lock"
RUN_FILE = "run.json"
CONFIG_FILE = "config.toml"
LOG_FILE = "metrics.jsonl"
# What a run writes once it has started: any of them means the folder holds a run. (run.json and
# config.toml alone are left by a start that failed before logging anything; a new run may take over.)
RUN_OUTPUTS = (LOG_FILE, "tb", "checkpoints", "train_summary.json", "online_summary.json", "versions",
               "eval.json")

# Settings a resumed run may change freely: they say how long to train, how often to log, evaluate or
# checkpoint, and how the work is laid out on the machine, not what is computed. Everything else (a key
# added later included) is refused on --resume unless --allow-config-change.
RESUMABLE_KEYS = frozenset({
    "train.steps", "train.epochs", "train.log_every", "train.eval_every", "train.eval_max_batches",
    "train.checkpoint_every", "train.keep_checkpoints", "train.final_eval", "train.device", "train.threads",
    "train.progress", "train.dist_timeout_s", "train.sharding", "train.sparse_replicas",
    "train.dp_replicate", "train.dp_shard", "train.compile", "train.compile_backend",
    "train.compile_cache_dir", "train.activation_checkpointing", "train.online_poll_s",
    "train.online_max_idle_s", "train.online_until", "train.online_first",
    "data.eval_batch_size", "data.num_workers",
    # padding to max_len instead of each batch's longest (masked): set by train.compile, which may change
    "model.embedding.pad_to_max_len",
})


class RunLockedError(OpengemError, RuntimeError):
    """Another process is writing the run folder."""


class RunExistsError(UsageError):
    """The run folder holds another run and neither --resume nor --force says what to do with it."""


class ResumeConfigError(ConfigError):
    """--resume with settings that change what the run computes."""


# --------------------------------------------------------------------------- lock
class RunLock:
    """An exclusive ``flock`` on RUN/.lock, with the holder's pid, host and start time written in it."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self._file: IO[str] | None = None

    def acquire(self) -> RunLock:
        f = open(self.path, "a+")  # noqa: SIM115 - held open for the life of the run
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip()
            f.close()
            raise RunLockedError(f"{self.path.parent}: in use by another run ({_describe_holder(holder)}); "
                                 "wait for it to end or choose another --out") from None
        except OSError:
            f.close()
            raise
        f.seek(0)
        f.truncate()
        f.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": _now()}) + "\n")
        f.flush()
        self._file = f
        return self

    def release(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def run_in_use(run_dir: str | Path) -> str | None:
    """Who holds RUN's lock now (a run still training, say), or None; takes no lock that outlives the call
    and writes nothing."""
    path = Path(run_dir) / LOCK_FILE
    try:
        f = open(path)  # noqa: SIM115 - closed below; read-only: never creates or truncates the lock file
    except OSError:
        return None
    with f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _describe_holder(f.read().strip())
        except OSError:
            return None
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
    return None


def _describe_holder(text: str) -> str:
    try:
        h = json.loads(text)
        return f"pid {h['pid']} on {h['host']}, started {h['started']}"
    except (json.JSONDecodeError, KeyError, TypeError):
        return "pid unknown: the holder has not written its pid yet"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


# --------------------------------------------------------------------------- ownership
@dataclass
class RunClaim:
    """The outcome of :func:`claim`: which run the folder now belongs to and how it got there."""

    run_dir: Path
    run_id: str
    continuing: bool  # --resume of the run that was already in the folder
    legacy: bool  # that run predates run ids: its checkpoints carry none
    moved_aside: Path | None  # --force: where the previous run went

    @property
    def checkpoint_run_id(self) -> str | None:
        """The run id to look checkpoints up by (None: a pre-run-id run, whose checkpoints have none)."""
        return None if self.legacy else self.run_id


def read_run(run_dir: str | Path) -> dict[str, Any] | None:
    """RUN/run.json, or None for a folder written before run ids existed."""
    path = Path(run_dir) / RUN_FILE
    if not path.exists():
        return None
    try:
        run = json.loads(path.read_text())
        str(run["run_id"])
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
        raise RunExistsError(f"{path}: unreadable ({type(e).__name__}); it is not a run.json opengem wrote"
                             ) from None
    return run


def checkpoint_run_id(run_dir: str | Path) -> str | None:
    """The run id the run's checkpoints carry: None when there is no run.json or the run was adopted
    from a folder written before run ids (its older checkpoints carry none)."""
    run = read_run(run_dir)
    return None if run is None or run.get("adopted") else str(run["run_id"])


def holds_run(run_dir: str | Path) -> bool:
    run_dir = Path(run_dir)
    return any((run_dir / name).exists() for name in RUN_OUTPUTS)


def check_run_folder(run_dir: Path) -> None:
    """Refuse an --out that is a file, or a dataset (it would be written into)."""
    if run_dir.exists() and not run_dir.is_dir():
        raise UsageError(f"{run_dir}: --out is a file, not a folder; choose a folder for the run")
    if (run_dir / "schema.toml").exists() and not holds_run(run_dir):
        raise UsageError(f"{run_dir}: this is a dataset folder (it has schema.toml), not a run folder; "
                         "pass it as --data and choose another --out")


@contextlib.contextmanager
def claim(run_dir: str | Path, *, resume: bool = False, force: bool = False,
          data_dir: str | Path | None = None) -> Iterator[RunClaim]:
    """Lock RUN for the life of the ``with`` block and make it this run's (see the module docstring).

    ``data_dir``: the dataset the run reads; ``--force`` refuses when it lies inside RUN, which it would
    move away.
    """
    run_dir = Path(run_dir)
    if resume and force:
        raise UsageError("--resume continues the run in the folder and --force moves it aside: give one")
    check_run_folder(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = RunLock(run_dir).acquire()  # before looking inside: a run starting now cannot slip in between
    try:
        moved = None
        old = read_run(run_dir)
        exists = holds_run(run_dir)
        if exists and not resume:
            if not force:
                what = f"run {old['run_id']}" if old else "an earlier run"
                raise RunExistsError(f"{run_dir}: holds {what}; use --resume to continue it, --force to move "
                                     f"it aside to {run_dir.name}.old-<time>, or another --out")
            if data_dir is not None and _inside(Path(data_dir), run_dir):
                raise UsageError(f"{run_dir}: --force would move the dataset {data_dir} aside with the old "
                                 "run; copy it out of the run folder first")
            old_lock = lock  # held while the old run moves away (with its lock file) and the new one locks
            try:
                moved = move_aside(run_dir)
                run_dir.mkdir()
                lock = RunLock(run_dir).acquire()
            finally:
                old_lock.release()
            exists, old = False, None
        continuing = exists and resume
        if continuing and old is not None:  # the run id stays: its checkpoints are found by it
            run_id, legacy = str(old["run_id"]), bool(old.get("adopted"))
        else:
            # a new run, or --resume adopting a run written before run ids (its checkpoints carry none)
            run_id, legacy = uuid.uuid4().hex, continuing
            _write_json(run_dir / RUN_FILE, {"run_id": run_id, "created": _now(),
                                             "host": socket.gethostname(), "pid": os.getpid(),
                                             "adopted": legacy})
        yield RunClaim(run_dir, run_id, continuing, legacy=legacy, moved_aside=moved)
    finally:
        lock.release()


def _inside(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


def move_aside(run_dir: str | Path) -> Path:
    """Rename RUN to RUN.old-<UTC time> (never overwriting); a config.toml naming data inside the old
    folder (the embedded default, RUN/data) is updated to the new place, so the old run still
    evaluates on its own data."""
    run_dir = Path(run_dir)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    dest = run_dir.with_name(f"{run_dir.name}.old-{stamp}")
    n = 1
    while dest.exists():
        dest = run_dir.with_name(f"{run_dir.name}.old-{stamp}-{n}")
        n += 1
    old_root = str(run_dir.resolve())
    run_dir.rename(dest)
    cfg_file = dest / CONFIG_FILE
    with contextlib.suppress(OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        text = cfg_file.read_text()
        data_path = tomllib.loads(text).get("data", {}).get("path", "")
        if isinstance(data_path, str) and data_path.startswith(old_root + os.sep):
            moved_path = str(dest.resolve()) + data_path[len(old_root):]
            new_text = text.replace(data_path, moved_path)
            if tomllib.loads(new_text)["data"]["path"] == moved_path:
                cfg_file.write_text(new_text)
    return dest


def _write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2) + "\n")


# --------------------------------------------------------------------------- resume
def config_changes(old: RunConfig, new: RunConfig, *, simulated: bool = True,
                   counted: frozenset[str] = frozenset()) -> dict[str, list[Any]]:
    """{key: [old, new]} for every setting that differs and that a resumed run may not change silently.

    ``data.sim.*`` counts only when the run trains on the embedded default (``simulated``: the data is
    made from it); ``train.steps`` counts when the lr schedule decays over it; ``counted`` keys count
    even where a resumed run may change them (a finished artifact's training length).
    """
    a, b = flatten_dict(to_dict(old)), flatten_dict(to_dict(new))
    out: dict[str, list[Any]] = {}
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        if va == vb or (key.startswith("data.sim.") and not simulated):
            continue
        if key in RESUMABLE_KEYS and key not in counted and not (
                key == "train.steps" and "none" not in (old.train.lr_decay, new.train.lr_decay)):
            continue
        out[key] = [va, vb]
    return out


def saved_config_changes(run_dir: Path, new: RunConfig, counted: frozenset[str] = frozenset()
                         ) -> dict[str, list[Any]]:
    """:func:`config_changes` of ``new`` against RUN/config.toml ({} when there is none): what a run that
    continues RUN's checkpoints (``--resume``) or published versions (an online restart) may not change.

    ``new`` must already carry the resolved dataset path, as the saved config does.
    """
    saved = run_dir / CONFIG_FILE
    if not saved.exists():
        return {}
    simulated = Path(new.data.path).resolve() == (run_dir / "data").resolve()
    return config_changes(load_run_config(saved), new, simulated=simulated, counted=counted)


def shown_changes(changes: dict[str, list[Any]]) -> str:
    """``key old -> new; ...``, as the refusals name them."""
    return "; ".join(f"{k} {v[0]!r} -> {v[1]!r}" for k, v in changes.items())


def check_resume_config(run: RunClaim, new: RunConfig, allow: bool = False) -> dict[str, list[Any]]:
    """The config changes of a resumed run against RUN/config.toml; refused (naming them) unless ``allow``."""
    if not run.continuing:
        return {}
    changes = saved_config_changes(run.run_dir, new)
    if changes and not allow:
        raise ResumeConfigError(f"{run.run_dir / CONFIG_FILE}: --resume with a changed config "
                                f"({shown_changes(changes)}); resume with the saved settings, or add "
                                "--allow-config-change to continue anyway (recorded)")
    return changes


def rollback_log(run_dir: str | Path, step: int, redo_final: bool = False) -> int:
    """Drop the records logged after ``step`` (the checkpoint a resume starts from) from RUN/metrics.jsonl,
    so the resumed run logs no step twice; returns how many were dropped. ``redo_final``: the resumed run
    ends with its own final evaluation, so the old one at ``step`` (resuming a finished run) goes too.
    Records without a step (the setup record of each start) stay. The file is rewritten whole and renamed
    into place."""
    path = Path(run_dir) / LOG_FILE
    if not path.exists():
        return 0
    kept, dropped = [], 0
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            dropped += 1  # a line cut by a crash mid-write
            continue
        at = rec.get("step") if isinstance(rec, dict) else None
        if isinstance(at, int) and (at > step or (redo_final and at == step and rec.get("final"))):
            dropped += 1
            continue
        kept.append(line)
    if dropped:
        atomic_write_text(path, "".join(line + "\n" for line in kept))
    return dropped
