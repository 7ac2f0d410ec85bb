"""Helpers for the CLI error tests: run ``opengem`` in process and read its one-line error."""

from __future__ import annotations

import pytest

from opengem.cli import main

TRACEBACK = "Traceback (most recent call last)"


def run_cli(capsys: pytest.CaptureFixture, argv: list[str]) -> tuple[int, str]:
    """(exit code, stderr) of ``opengem ARGV`` run in this process."""
    rc = main(argv)
    return rc, capsys.readouterr().err


def one_error_line(err: str, command: str) -> str:
    """The one stderr line ``opengem COMMAND: error: ...``, asserting there is nothing else."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert TRACEBACK not in err, err
    assert len(lines) == 1, err
    assert lines[0].startswith(f"opengem {command}: error: "), err
    return lines[0]
