"""The one ``opengem`` command.

Each subcommand lives in the module that owns its job; that module exposes
``add_arguments(parser)`` and ``run(args) -> int``. Modules are imported only when their
subcommand runs, so ``opengem simulate`` does not pay for importing the model stack.

Errors are handled once, here: an :class:`~opengem.errors.OpengemError` (a user's input, files or
environment) and the OS errors a user causes (a missing path, a folder given for a file, a read-only or
full disk, a file that is not UTF-8 or not TOML) are printed as one line, ``opengem <command>: error:
...``, with exit code 2 for usage and configuration and 1 otherwise; the traceback only under
``--debug`` (or ``OPENGEM_DEBUG=1``). Anything else is a bug in opengem: it keeps its traceback and
ends with a line that says so.
"""

from __future__ import annotations

import argparse
import errno
import gc
import importlib
import importlib.util
import json
import os
import sys
import tomllib
import traceback
from collections.abc import Callable
from types import TracebackType
from typing import NoReturn

from opengem.errors import OpengemError
from opengem.run_arg import NOT_A_RUN

# model.name values, as opengem.model.registry.MODEL_NAMES (not imported here: it pulls in torch; a test
# keeps the two equal)
MODEL_NAMES = ("gem", "wukong", "dlrm", "dcnv2", "din", "lr")

COMMANDS: dict[str, tuple[str, str]] = {
    "simulate": ("opengem.data.simulate", "generate a dataset with the ads-platform simulator"),
    "convert": ("opengem.data.adapters", "convert a named public dataset, or your own CSV/TSV/Parquet/libsvm "
                                         "table ('convert table'), to canonical Parquet"),
    "validate": ("opengem.data.validate", "check a dataset against its schema"),
    "train": ("opengem.train.cli", f"train a model: model.name = {' | '.join(MODEL_NAMES)}"),
    "evaluate": ("opengem.train.evaluate", "evaluate a run: NE, AUC, calibration per surface x task"),
    "calibrate": ("opengem.train.calibrate", "fit a run's probability level per surface x task on held-out "
                  "data (Platt scaling); evaluate, predict, export and serve apply it"),
    "predict": ("opengem.train.predict", "score rows with a trained run: example_id, surface, one "
                "probability per task -> Parquet"),
    "export": ("opengem.serve.export_cli", "export a trained run for serving: weights + data contract, "
               "torch.export program, AOTInductor package"),
    "generate": ("opengem.transfer.generate", "knowledge generation: FM soft labels and embeddings"),
    "transfer": ("opengem.transfer.experiment", "the FM -> VM transfer experiment"),
    "distill": ("opengem.transfer.distill_cli", "train a vertical model from an FM run by distillation"),
    "serve": ("opengem.serve.serve_cli", "serve a model over HTTP: JSON/Arrow, dynamic batching, hot swap"),
    "bench": ("opengem.bench.cli", "throughput, MFU, memory and start-up benchmarks"),
    "scale": ("opengem.bench.scale", "scaling-law sweeps and the iso-FLOP (compute-optimal) study"),
    "report": ("opengem.bench.report", "HTML report of runs"),
}

DEBUG_FLAG = "--debug"
DEBUG_HELP = "on an error, print the full traceback (also OPENGEM_DEBUG=1)"
OVERRIDE_COMMANDS = ("opengem train", "opengem bench train", "opengem transfer", "opengem scale",
                     "opengem distill")
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a Ctrl-C


class IntermixedParser(argparse.ArgumentParser):
    """An ArgumentParser that takes options and positionals in any order.

    ``opengem train --config c.toml train.steps=3 --out RUN`` must mean what it says: plain argparse
    stops collecting ``section.key=value`` overrides at the first option after them. Sub-parsers
    (``opengem bench train``) are built with this class too, so the rule holds at every level; a
    parser that itself holds sub-commands parses normally (argparse cannot intermix those).
    """

    _intermixing = False

    def error(self, message: str) -> NoReturn:
        """argparse's usage error, plus where ``section.key=value`` went when this command takes none."""
        takes_overrides = any(a.dest == "overrides" for a in self._actions)
        misplaced = message.startswith("unrecognized arguments") or NOT_A_RUN in message
        if misplaced and "=" in message and not takes_overrides:
            message += (f" ({self.prog} takes no section.key=value overrides; they go to "
                        f"{', '.join(OVERRIDE_COMMANDS)})")
        super().error(message)

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[no-untyped-def, override]
        if self._intermixing or self._subparsers is not None:
            return super().parse_known_args(args, namespace)
        self._intermixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False


def available_commands() -> dict[str, tuple[str, str]]:
    return {k: v for k, v in COMMANDS.items() if importlib.util.find_spec(v[0]) is not None}


def split_debug(argv: list[str]) -> tuple[bool, list[str]]:
    """Remove ``--debug`` wherever it stands before a ``--`` (before or after the subcommand name)."""
    end = argv.index("--") if "--" in argv else len(argv)
    head = [a for a in argv[:end] if a != DEBUG_FLAG]
    debug = len(head) != end or os.environ.get("OPENGEM_DEBUG", "") not in ("", "0")
    return debug, head + argv[end:]


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    finally:
        # Arrow objects a failed command leaves in reference cycles (an exception's frames hold its readers)
        # are otherwise destroyed at interpreter teardown, after Arrow's thread pools: "terminate called
        # without an active exception", exit 134, after the one-line error (convert, ~1 run in 25)
        gc.collect()


def _main(argv: list[str] | None) -> int:
    debug, argv = split_debug(list(sys.argv[1:] if argv is None else argv))
    cmds = available_commands()
    command = argv[0] if argv and argv[0] in cmds else None
    prog = f"opengem {command}" if command else "opengem"
    try:
        return _dispatch(argv, cmds, command)
    except KeyboardInterrupt:
        return _fail(prog, "interrupted (Ctrl-C)", EXIT_INTERRUPTED, debug)
    except OpengemError as e:
        return _fail(prog, _message(e, cmds.get(command or "")), e.exit_code, debug)
    except Exception as e:  # the one place that decides how an error reaches the user
        message = user_error_message(e)
        if message is not None:
            return _fail(prog, message, 1, debug)
        return _bug(prog, e)
    except BaseException as e:  # DCP's CheckpointException derives from BaseException, not Exception
        failure = _checkpoint_failure(e)
        if failure is None:
            raise
        rank, inner = failure
        if isinstance(inner, OpengemError):
            return _fail(prog, f"checkpoint on rank {rank}: {inner}", inner.exit_code, debug)
        message = user_error_message(inner, context=e)
        if message is not None:
            return _fail(prog, f"checkpoint on rank {rank}: {message}", 1, debug)
        return _bug(prog, inner)


def _message(e: OpengemError, command: tuple[str, str] | None) -> str:
    """The error's message, with the command's own way to go on after an interrupted training where it
    has one (``INTERRUPTED_ADVICE`` in its module: the commands without ``--resume``)."""
    module = sys.modules.get(command[0]) if command else None
    advice = getattr(module, "INTERRUPTED_ADVICE", None)
    if advice and callable(getattr(e, "advising", None)):
        return e.advising(advice)  # type: ignore[attr-defined]
    return str(e) or type(e).__name__


def _dispatch(argv: list[str], cmds: dict[str, tuple[str, str]], command: str | None) -> int:
    if command is not None:
        module = importlib.import_module(cmds[command][0])
        parser = IntermixedParser(prog=f"opengem {command}", description=cmds[command][1])
        module.add_arguments(parser)
        _add_debug_help(parser)
        args = parser.parse_args(argv[1:])
        return int(module.run(args) or 0)
    parser = IntermixedParser(prog="opengem", description="GEM-style ads foundation model")
    _add_debug_help(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (_, help_text) in cmds.items():
        sub.add_parser(name, help=help_text)
    parser.parse_args(argv)
    return 2


def _bug(prog: str, e: BaseException) -> int:
    traceback.print_exc()
    print(f"{prog}: internal error (a bug in opengem, not in your input): {type(e).__name__}: "
          f"{_one_line(str(e))}; please report it with the traceback above", file=sys.stderr)
    return 1


def _checkpoint_failure(e: BaseException) -> tuple[int, BaseException] | None:
    """(rank, first per-rank error) of a ``torch.distributed.checkpoint`` CheckpointException, else None.

    DCP wraps each rank's error (a full disk, a read-only folder) in one BaseException whose text is a
    traceback per rank; unwrapped, the cause gets the same one line as anywhere else.
    """
    api = sys.modules.get("torch.distributed.checkpoint.api")
    kind = getattr(api, "CheckpointException", None)
    if kind is None or not isinstance(e, kind) or not e.failures:
        return None
    rank, (inner, _trace) = sorted(e.failures.items(), key=lambda kv: kv[0])[0]
    return rank, inner


def _add_debug_help(parser: argparse.ArgumentParser) -> None:
    """List --debug in --help; main() has already taken it out of argv, wherever it stood."""
    try:
        parser.add_argument(DEBUG_FLAG, action="store_true", help=DEBUG_HELP)
    except argparse.ArgumentError:
        pass  # the subcommand defines its own --debug: leave it


def _fail(prog: str, message: str, code: int, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    print(f"{prog}: error: {_one_line(message)}", file=sys.stderr)
    return code


def _one_line(message: str) -> str:
    return "; ".join(line.strip() for line in message.strip().splitlines() if line.strip())


# ----------------------------------------------------------------------------- user errors from Python
_OS_REASONS: dict[int, str] = {
    errno.ENOSPC: "no space left on the device (disk full); free some space or write elsewhere, then re-run",
    errno.EDQUOT: "disk quota exceeded; free some space or write elsewhere, then re-run",
    errno.EROFS: "read-only file system; choose a writable output folder",
    errno.EACCES: "permission denied; choose a path you may read and write",
    errno.EPERM: "operation not permitted; choose a path you may read and write",
    errno.ENOENT: "no such file or folder",
    errno.EISDIR: "is a folder, but a file is needed here",
    errno.ENOTDIR: "a file stands where a folder is needed (part of this path is a file)",
    errno.EEXIST: "already exists and is in the way (a file where a folder is needed?)",
    errno.ENAMETOOLONG: "file name too long",
    errno.EMFILE: "too many open files; raise the limit (ulimit -n) or use fewer workers",
}


def user_error_message(e: BaseException, context: BaseException | None = None) -> str | None:
    """One line for an error a user caused outside opengem's own checks, or None for a bug.

    ``context`` is the exception whose traceback says where in opengem it happened, when ``e`` was
    raised elsewhere and wrapped (a DCP worker's error).
    """
    for kind, describe in _DESCRIBERS:
        if isinstance(e, kind):
            return describe(e, context or e)
    return None


def _describe_os_error(e: BaseException, context: BaseException) -> str | None:
    assert isinstance(e, OSError)
    reason = _OS_REASONS.get(e.errno or -1)
    if reason is None:
        if e.filename is None:
            return None  # an OSError with no path and no known cause: treat as a bug, keep the traceback
        reason = e.strerror or str(e)
    paths = [p for p in (e.filename, e.filename2) if p is not None]
    if not paths:
        return f"{reason} ({_where(context)})"
    return f"{' -> '.join(os.fsdecode(p) for p in paths)}: {reason}"


def _describe_unicode(e: BaseException, context: BaseException) -> str:
    assert isinstance(e, UnicodeDecodeError)
    return f"a file is not UTF-8 text ({e.reason} at byte {e.start}); save it as UTF-8 ({_where(context)})"


def _describe_toml(e: BaseException, context: BaseException) -> str:
    return f"a file is not valid TOML: {e} ({_where(context)})"


def _describe_json(e: BaseException, context: BaseException) -> str:
    return f"a JSON file is corrupt: {e}; restore or delete it ({_where(context)})"


def _where(e: BaseException) -> str:
    """The innermost opengem frame of ``e``: all a path-less error (a decode error) can tell a user."""
    tb: TracebackType | None = e.__traceback__
    found = "in opengem"
    while tb is not None:
        code = tb.tb_frame.f_code
        module = tb.tb_frame.f_globals.get("__name__", "")
        if module.startswith("opengem.") and module != __name__:
            found = f"in {module}.{code.co_name}, line {tb.tb_lineno}; --debug shows the traceback"
        tb = tb.tb_next
    return found


_DESCRIBERS: list[tuple[type[BaseException], Callable[[BaseException, BaseException], str | None]]] = [
    (OSError, _describe_os_error),
    (UnicodeDecodeError, _describe_unicode),
    (tomllib.TOMLDecodeError, _describe_toml),
    (json.JSONDecodeError, _describe_json),
]


if __name__ == "__main__":
    sys.exit(main())
