"""Committing an output folder so that a reader never mistakes a partial write for a finished one.

Every data writer (``simulate``, ``convert``, ``generate``) goes through here. A folder is built under a
hidden temporary sibling name (``.NAME.tmp-HOST-PID-XXXX``), its files are fsynced, a completion marker
``_COMPLETE`` (JSON: writer, time, rows, partitions) is written last, and the folder is renamed into
place. A Ctrl-C, a SIGTERM, a full disk or an exception therefore leaves either nothing at ``NAME`` or the
previous complete folder: never a half-written day whose Parquet footer (written on close) makes it
look valid. Readers (:class:`opengem.data.dataset.Dataset`, the side-table reader) refuse a folder
without its marker and say how to proceed.

Replacing an existing folder needs ``force`` (a writer never deletes data it was not asked to), and even
then only a folder that holds what opengem writers write (schema, summary, markers, Parquet partitions):
``--force`` on a folder of unrelated files is refused instead of deleting them. The old folder is moved
aside, the new one renamed in, and only then is the old one removed.

The marker convention is Spark's ``_SUCCESS``: a dataset root holds ``_COMPLETE``, and so does each
partition folder, so a dataset that grows partition by partition (online training) can commit each new
partition atomically on its own. A dataset a person assembled by hand is marked with
:func:`mark_complete` (``opengem validate --data DIR --mark-complete``, after a clean validation).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pyarrow.parquet as pq

from opengem.errors import DatasetError, UsageError

MARKER = "_COMPLETE"
FORMAT = 1
# What a dataset folder written by opengem may hold besides its partitions: --force may replace these
# (.opengem_sim_config.json: the trainer's record of the simulator config of RUN/data).
DATASET_FILES = frozenset({"schema.toml", "summary.json", "manifest.json", "generate.json", MARKER,
                           ".opengem_sim_config.json", "encoders.json"})  # encoders: convert table
MARK_HINT = "opengem validate --data {path} --mark-complete"


class OutputExistsError(UsageError):
    """An output folder that already holds data and would be replaced or mixed without ``--force``."""


# --------------------------------------------------------------------------- partitions
TRUTH_DIR = "truth"  # simulator only: true label probabilities beside the partitions, never a partition


def partition_names(root: Path) -> list[str]:
    """Every partition folder of a dataset, sorted by name; a Parquet file outside any is an error."""
    stray = sorted(p.name for p in root.glob("*.parquet") if not p.name.startswith("."))
    if stray:
        raise DatasetError(f"{root / stray[0]}: a Parquet file at the dataset root belongs to no "
                           "partition: move it into a partition folder (e.g. train/ or day=000/) or "
                           "remove it")
    return sorted(p.name for p in root.iterdir()
                  if p.is_dir() and p.name != TRUTH_DIR and not p.name.startswith((".", "_")))


def partition_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.parquet") if not p.name.startswith("."))


# --------------------------------------------------------------------------- markers
def read_marker(folder: str | Path) -> dict[str, Any] | None:
    """The completion record of ``folder``, or None when it has no marker (never finished)."""
    path = Path(folder) / MARKER
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise DatasetError(f"{path}: cannot read the completion marker ({e}): re-run the writer") from None
    try:
        rec = json.loads(text)
    except json.JSONDecodeError:
        rec = None
    if not isinstance(rec, dict) or rec.get("complete") is not True:
        raise DatasetError(f"{path}: not a completion marker written by opengem: re-run the writer, or for "
                           f"a dataset assembled by hand run `{MARK_HINT.format(path=Path(folder))}`")
    return rec


def write_marker(folder: str | Path, writer: str, **record: Any) -> dict[str, Any]:
    """Write ``folder/_COMPLETE`` atomically (temp name, fsync, rename, fsync the folder); return it."""
    folder = Path(folder)
    rec = {"complete": True, "format": FORMAT, "writer": writer,
           "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **record}
    atomic_write_text(folder / MARKER, json.dumps(rec, indent=2, allow_nan=False) + "\n")
    return rec


def clear_marker(folder: str | Path) -> None:
    """Remove the marker before changing a folder in place: from now on it is not complete."""
    (Path(folder) / MARKER).unlink(missing_ok=True)
    _fsync_dir(Path(folder))


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``path`` so that a reader sees the old file or the whole new one, never a prefix."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


# --------------------------------------------------------------------------- fsync
def fsync_file(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    try:
        fsync_file(path)
    except OSError:  # some file systems cannot fsync a directory; the rename is still atomic there
        pass


def fsync_tree(root: str | Path) -> None:
    """fsync every file and folder under ``root`` (data first, so a rename never outruns its contents)."""
    for dirpath, _, files in os.walk(root, topdown=False):
        for name in files:
            fsync_file(Path(dirpath) / name)
        _fsync_dir(Path(dirpath))


# --------------------------------------------------------------------------- targets
def _is_ours(path: Path) -> bool:
    """True for what an opengem data writer leaves in an output folder (so --force may replace it)."""
    if path.name.startswith("."):
        return _is_staging(path.name) or path.name in DATASET_FILES  # never someone's .git or .env
    if path.is_dir() and not path.is_symlink():
        return all(_is_ours(p) for p in path.iterdir())
    return path.name in DATASET_FILES or path.name.endswith(".parquet")


def check_target(dest: str | Path, force: bool) -> None:
    """Refuse to write ``dest`` when that would replace or mix with what is there.

    ``dest`` may be missing or an empty folder. A non-empty folder needs ``force``, and ``force`` is
    refused on a folder holding anything an opengem writer does not write (it would be deleted).
    """
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise OutputExistsError(f"{dest}: is a file, not a folder: choose a folder path for the output")
    if not dest.is_dir():
        return
    entries = sorted(p for p in dest.iterdir() if not _is_staging(p.name))
    if not entries:
        return
    if not force:
        names = {p.name for p in entries}
        what = ("already holds a dataset" if names & {MARKER, "schema.toml"}
                else f"not empty (holds {entries[0].name})")
        raise OutputExistsError(f"{dest}: {what}; pass --force to replace it, or choose a new --out")
    foreign = [p for p in entries if not _is_ours(p)]
    if foreign:
        raise OutputExistsError(f"{dest}: holds {foreign[0].relative_to(dest)}, which no opengem writer "
                                "made: --force replaces only a dataset folder; choose a new --out")


def _is_staging(name: str) -> bool:
    return name.startswith(".") and (".tmp-" in name or ".old-" in name)


def _staging_prefix(dest: Path, kind: str) -> str:
    return f".{dest.name}.{kind}-"


def _alive(host: str, pid: int) -> bool:
    if host != socket.gethostname():
        return True  # another machine's write: not ours to judge
    return pid_alive(pid)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this machine is running (someone else's counts: alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def leftovers(dest: str | Path, dead_only: bool = True) -> list[Path]:
    """Temporary siblings of ``dest`` from writes that have not finished (``dead_only``: whose process
    is gone, so they never will)."""
    dest = Path(dest)
    out: list[Path] = []
    if not dest.parent.is_dir():
        return out
    for kind in ("tmp", "old"):
        for p in dest.parent.glob(_staging_prefix(dest, kind) + "*"):
            parts = p.name[len(_staging_prefix(dest, kind)):].rsplit("-", 2)
            if len(parts) != 3 or not parts[1].isdigit():
                continue
            if not dead_only or not _alive(parts[0], int(parts[1])):
                out.append(p)
    return sorted(out)


def _new_sibling(dest: Path, kind: str) -> Path:
    return dest.with_name(f"{_staging_prefix(dest, kind)}{socket.gethostname()}-{os.getpid()}-"
                          f"{secrets.token_hex(3)}")


# --------------------------------------------------------------------------- staged writes
@dataclass
class Staging:
    """The folder a writer fills (``path``) and what it wants recorded in the marker (``record``)."""

    path: Path
    dest: Path
    record: dict[str, Any] = field(default_factory=dict)


@contextmanager
def staged_dir(dest: str | Path, *, writer: str, force: bool = False,
               dataset: bool = True) -> Iterator[Staging]:
    """Build ``dest`` in a temporary sibling and rename it into place when the block ends cleanly.

    ``dataset``: write a marker into every partition and the dataset root (rows and files read back from
    the Parquet footers); otherwise only the root marker with ``record``. On any exception (Ctrl-C
    included) the temporary folder is removed and ``dest`` is untouched. Temporary siblings left by a
    killed writer (SIGKILL/SIGTERM give no chance to clean up) are removed at the next write.
    """
    dest = Path(dest).absolute()
    check_target(dest, force)
    st = Staging(_new_sibling(dest, "tmp"), dest)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        for p in leftovers(dest):
            shutil.rmtree(p, ignore_errors=True)
        st.path.mkdir()
    except OSError as e:
        _raise_naming_dest(e, st)
    try:
        yield st
        if dataset:
            mark_complete(st.path, writer, **st.record)
        else:
            write_marker(st.path, writer, **st.record)
        fsync_tree(st.path)
        _swap_in(st.path, dest, force)
    except OSError as e:
        shutil.rmtree(st.path, ignore_errors=True)
        _raise_naming_dest(e, st)
    except BaseException:
        shutil.rmtree(st.path, ignore_errors=True)
        raise


def _raise_naming_dest(e: OSError, st: Staging) -> NoReturn:
    """Raise ``e``, naming the output folder the user gave (``--out``) where it names the hidden temporary
    one: ``out/day=000/x.parquet: disk full``, not ``.out.tmp-host-123-abc/day=000/x.parquet``."""

    def shown(name: object) -> object:
        if not isinstance(name, (str, bytes)):
            return name  # None, or a file descriptor
        path = Path(os.fsdecode(name))
        try:
            return str(st.dest / path.relative_to(st.path))
        except ValueError:
            return name  # a path outside the temporary folder: already the one to name

    first, second = shown(e.filename), shown(e.filename2)
    if e.errno is None or (first, second) == (e.filename, e.filename2):
        raise e
    raise OSError(e.errno, e.strerror, first, None, None if second == first else second) from e


def _swap_in(tmp: Path, dest: Path, force: bool) -> None:
    """Rename ``tmp`` to ``dest``; a non-empty ``dest`` (checked again: another writer may have
    finished meanwhile) is moved aside first and removed only once the new folder is in place."""
    check_target(dest, force)
    old = None
    if dest.is_dir() and any(dest.iterdir()):  # a dataset (force) or only temporary leftovers
        old = _new_sibling(dest, "old")
        os.rename(dest, old)
    try:
        os.rename(tmp, dest)  # onto a missing or empty folder: atomic
    except BaseException:
        if old is not None and not dest.exists():
            os.rename(old, dest)
        raise
    _fsync_dir(dest.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# --------------------------------------------------------------------------- datasets
def _readable_marker(folder: Path) -> dict[str, Any] | None:
    try:
        return read_marker(folder)
    except DatasetError:
        return None


def parquet_rows(files: list[Path]) -> int:
    """Rows in ``files`` from their footers (no data read); an unreadable footer is a DatasetError."""
    rows = 0
    for f in files:
        try:
            rows += pq.read_metadata(f).num_rows
        except Exception as e:  # noqa: BLE001 - pyarrow raises ArrowInvalid, OSError ... for a bad footer
            raise DatasetError(f"{f}: not a readable Parquet file ({type(e).__name__}: {e}): fix or remove "
                               "it before marking the dataset complete") from None
    return rows


def mark_complete(root: str | Path, writer: str = "marked by hand", **record: Any) -> dict[str, Any]:
    """Write the partition markers that are missing and then the dataset marker of ``root``.

    For a writer, the last step of its staged write; for a person, the way to declare a dataset they
    assembled by hand complete, after ``opengem validate`` found it clean (validate's ``--mark-complete``
    calls this). Returns the dataset marker (partitions with their rows and files).
    """
    root = Path(root)
    if not (root / "schema.toml").exists():
        raise DatasetError(f"{root}: no schema.toml: not a dataset folder, nothing to mark complete")
    parts: dict[str, Any] = {}
    for name in partition_names(root):
        files = partition_files(root / name)
        rows = parquet_rows(files)
        parts[name] = {"rows": rows, "files": len(files)}
        if _readable_marker(root / name) is None:
            write_marker(root / name, writer, rows=rows, files=[f.name for f in files])
    return write_marker(root, writer, **{**record, "rows": sum(p["rows"] for p in parts.values()),
                                            "partitions": parts})
