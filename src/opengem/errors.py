"""The errors a user can act on.

Every module raises its own subclass (ConfigError, DataError, CheckpointError, ...); the ``opengem``
command catches :class:`OpengemError` once, prints it as one line ``opengem <command>: error: ...`` and
exits with its ``exit_code`` (2 for usage and configuration, 1 for data and runtime). The traceback is
shown only under ``--debug`` (or ``OPENGEM_DEBUG=1``): a user's mistake is not a crash. Raise one of these
rather than printing a message and returning a code, so that every command reports errors the same way;
the message is one line that names the file, column, row, key or path and says what to do.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class OpengemError(Exception):
    """A problem with the user's input, files or environment, stated in one line."""

    exit_code = 1


class UsageError(OpengemError):
    """A command line or configuration that cannot work as given."""

    exit_code = 2


class DatasetError(OpengemError, ValueError):
    """A dataset folder that is missing, incomplete, or whose partitions cannot be selected as asked."""


class TrainError(OpengemError, RuntimeError):
    """A run that cannot go on: no device, a non-finite loss, a data selection with no full batch."""


def unknown_key(key: str, known: Iterable[str], listed_as: str = "known") -> str:
    """``unknown key 'stepz' (did you mean 'steps'? known: a, b, ...)``: the closest known key is offered
    when one is close (a typo), then every key, so the line alone says how to fix it."""
    names = sorted(known)
    close = difflib.get_close_matches(key, names, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown key {key!r} ({hint}{listed_as}: {', '.join(names)})"
