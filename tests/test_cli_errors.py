"""Errors reach a person as one line (issue 10, section 5).

``opengem <command>: error: <what, naming the path>`` on stderr, exit 2 for usage and configuration, 1
for data and runtime, 130 for Ctrl-C; a traceback only under ``--debug``; a bug keeps its traceback and
says it is one. Most cases replace a subcommand's ``run`` with one that raises, so they test the one
handler in ``opengem.cli.main`` without training anything; the config cases go through the real loader.
"""

from __future__ import annotations

import argparse
import errno
import json
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
from torch.distributed.checkpoint.api import CheckpointException

import opengem.bench.cli as bench_cmd
import opengem.data.adapters as convert_cmd
import opengem.data.simulate as simulate_cmd
import opengem.data.validate as validate_cmd
import opengem.train.cli as train_cmd
from cli_helpers import TRACEBACK, one_error_line, run_cli
from opengem.cli import main
from opengem.config import ConfigError
from opengem.data.parquet import DataError
from opengem.data.schema import FeatureSchema, SchemaError
from opengem.errors import OpengemError
from opengem.train.config import load_run_config

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.toml"


def _raising(exc: BaseException) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        raise exc

    return run


# ------------------------------------------------------------------ errors raised by a subcommand
@pytest.mark.parametrize(
    "exc, code, needle",
    [
        (DataError("/d/day=000/part-0.parquet", "missing", column="ts"), 1,
         "/d/day=000/part-0.parquet: column 'ts': missing"),
        (ConfigError("train.steps: must be >= 0 (got -1)"), 2, "train.steps"),
        (OpengemError("first line\n  second line"), 1, "first line; second line"),
        (FileNotFoundError(errno.ENOENT, "No such file or directory", "/no/such/run"), 1,
         "/no/such/run: no such file"),
        (IsADirectoryError(errno.EISDIR, "Is a directory", "/a/folder"), 1, "/a/folder: is a folder"),
        (NotADirectoryError(errno.ENOTDIR, "Not a directory", "/a/file/x"), 1, "/a/file/x: a file stands"),
        (PermissionError(errno.EACCES, "Permission denied", "/ro/out"), 1, "/ro/out: permission denied"),
        (OSError(errno.EROFS, "Read-only file system", "/ro/out/x"), 1, "/ro/out/x: read-only file system"),
        (OSError(errno.ENOSPC, "No space left on device", "/full/part-0.parquet"), 1,
         "/full/part-0.parquet: no space left on the device"),
        (FileExistsError(errno.EEXIST, "File exists", "/out/is/a/file"), 1, "/out/is/a/file: already exists"),
        (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), 1, "not UTF-8"),
        (tomllib.TOMLDecodeError("Invalid value (at line 1, column 5)"), 1, "not valid TOML"),
        (json.JSONDecodeError("Expecting value", "", 0), 1, "JSON file is corrupt"),
    ],
    ids=lambda x: type(x).__name__ if isinstance(x, BaseException) else None,
)
def test_user_errors_are_one_line(monkeypatch, capsys, exc: BaseException, code: int, needle: str) -> None:
    monkeypatch.setattr(validate_cmd, "run", _raising(exc))
    rc, err = run_cli(capsys, ["validate", "--data", "D"])
    assert rc == code
    assert needle in one_error_line(err, "validate")


def test_disk_full_from_a_writer_without_a_path_says_so(monkeypatch, capsys, tmp_path: Path) -> None:
    """A real writer (pyarrow) raising ENOSPC with no file name still gives one line that says disk full."""
    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(simulate_cmd, "simulate", full)
    rc, err = run_cli(capsys, ["simulate", "--out", str(tmp_path / "d"), "--rows", "10", "--quiet"])
    assert rc == 1
    line = one_error_line(err, "simulate")
    assert "disk full" in line and "opengem.data.simulate.run" in line


def test_a_checkpoint_write_failing_on_a_full_disk_is_one_line(monkeypatch, capsys) -> None:
    """DCP wraps a rank's ENOSPC in CheckpointException, a BaseException: unwrapped, it is one line too."""
    inner = OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(validate_cmd, "run", _raising(CheckpointException("save failed", {0: (inner, None)})))
    rc, err = run_cli(capsys, ["validate", "--data", "D"])
    assert rc == 1
    assert "checkpoint on rank 0: no space left on the device" in one_error_line(err, "validate")


def test_debug_shows_the_traceback_before_or_after_the_command(monkeypatch, capsys) -> None:
    monkeypatch.setattr(validate_cmd, "run", _raising(DataError("part-0.parquet", "bad part")))
    for argv in (["--debug", "validate", "--data", "D"], ["validate", "--data", "D", "--debug"]):
        rc, err = run_cli(capsys, argv)
        assert rc == 1
        assert TRACEBACK in err and "DataError: part-0.parquet: bad part" in err
        assert err.rstrip().splitlines()[-1] == "opengem validate: error: part-0.parquet: bad part"


def test_debug_from_the_environment(monkeypatch, capsys) -> None:
    monkeypatch.setattr(validate_cmd, "run", _raising(DataError("part-0.parquet", "bad part")))
    monkeypatch.setenv("OPENGEM_DEBUG", "1")
    rc, err = run_cli(capsys, ["validate", "--data", "D"])
    assert rc == 1 and TRACEBACK in err


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys) -> None:
    monkeypatch.setattr(validate_cmd, "run", _raising(KeyboardInterrupt()))
    rc, err = run_cli(capsys, ["validate", "--data", "D"])
    assert rc == 130
    assert "interrupted" in one_error_line(err, "validate")


def test_a_bug_keeps_its_traceback_and_says_it_is_a_bug(monkeypatch, capsys) -> None:
    monkeypatch.setattr(validate_cmd, "run", _raising(ZeroDivisionError("division by zero")))
    rc, err = run_cli(capsys, ["validate", "--data", "D"])
    assert rc == 1
    assert TRACEBACK in err
    last = err.rstrip().splitlines()[-1]
    assert last.startswith("opengem validate: internal error (a bug in opengem")
    assert "ZeroDivisionError" in last


def test_an_oserror_with_no_path_and_unknown_cause_is_treated_as_a_bug(monkeypatch, capsys) -> None:
    monkeypatch.setattr(validate_cmd, "run", _raising(OSError(errno.EIO, "Input/output error")))
    rc, err = run_cli(capsys, ["validate", "--data", "D"])
    assert rc == 1 and TRACEBACK in err and "internal error" in err


# ------------------------------------------------------------------ argument parsing
def _capture_args(monkeypatch, module) -> list[argparse.Namespace]:
    seen: list[argparse.Namespace] = []

    def run(args: argparse.Namespace) -> int:
        seen.append(args)
        return 0

    monkeypatch.setattr(module, "run", run)
    return seen


def test_overrides_before_and_after_options_all_apply(monkeypatch, capsys) -> None:
    seen = _capture_args(monkeypatch, train_cmd)
    assert main(["train", "--config", "c.toml", "train.steps=3", "--out", "RUN", "train.lr=0.1",
                 "--resume", "model.name=dlrm"]) == 0
    (args,) = seen
    assert args.out == "RUN" and args.config == "c.toml" and args.resume
    assert args.overrides == ["train.steps=3", "train.lr=0.1", "model.name=dlrm"]


def test_overrides_intermix_in_a_nested_subcommand(monkeypatch) -> None:
    seen = _capture_args(monkeypatch, bench_cmd)
    assert main(["bench", "train", "train.steps=3", "--config", "c.toml", "x.y=1", "--steps", "2"]) == 0
    (args,) = seen
    assert args.overrides == ["train.steps=3", "x.y=1"] and args.steps == 2 and args.config == "c.toml"


def test_positional_after_options_in_convert(monkeypatch) -> None:
    seen = _capture_args(monkeypatch, convert_cmd)
    assert main(["convert", "--out", "O", "avazu_head", "--limit", "5"]) == 0
    assert seen[0].name == "avazu_head" and seen[0].limit == 5


def test_overrides_given_to_a_command_without_them_say_where_they_go(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["validate", "--data", "D", "train.steps=3"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: train.steps=3" in err and "they go to opengem train" in err
    for argv in (["evaluate", "--run", "R", "train.steps=3"], ["predict", "train.steps=3", "--out", "o"]):
        with pytest.raises(SystemExit) as e:  # the run's positional does not take the override for a run
            main(argv)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert "train.steps=3 is a section.key=value override, not a run" in err
        assert "they go to opengem train" in err


def test_usage_errors_still_exit_2_through_argparse(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["validate"])  # --data is required
    assert e.value.code == 2
    assert "--data" in capsys.readouterr().err


# ------------------------------------------------------------------ the config cases, for real
def test_config_that_is_a_folder(capsys, tmp_path: Path) -> None:
    rc, err = run_cli(capsys, ["train", "--config", str(tmp_path)])
    assert rc == 2
    assert f"{tmp_path}: is a folder" in one_error_line(err, "train")


def test_config_with_non_utf8_bytes(capsys, tmp_path: Path) -> None:
    bad = tmp_path / "c.toml"
    bad.write_bytes(b"[train]\nsteps = 3 # caf\xe9\n")
    rc, err = run_cli(capsys, ["train", "--config", str(bad)])
    assert rc == 2
    line = one_error_line(err, "train")
    assert str(bad) in line and "not UTF-8" in line and "line 2" in line


def test_schema_with_non_utf8_bytes_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "schema.toml"
    bad.write_bytes(b'name = "caf\xe9"\n')
    with pytest.raises(SchemaError, match=r"schema.toml: not UTF-8 text \(line 1"):
        FeatureSchema.load(bad)
    with pytest.raises(SchemaError, match="is a folder"):
        FeatureSchema.load(tmp_path)


@pytest.mark.parametrize(
    "override, needles",
    [
        ("data.sim.rows=abc", ["override data.sim.rows=abc", "not a TOML literal", "quote"]),
        ("train.steps=abc", ["override train.steps=abc", "expected an integer, got abc", "quotes"]),
        ("train.lr=[1", ["override train.lr=[1", "expected a number"]),
        ("model.head.hidden=64", ["override model.head.hidden=64", "expected a list, got 64"]),
        ("train.stepz=3", ["override train.stepz=3", "unknown key 'stepz'"]),
    ],
)
def test_bad_override_names_key_value_and_quotes(capsys, override: str, needles: list[str]) -> None:
    rc, err = run_cli(capsys, ["train", "--config", str(TINY), override])
    assert rc == 2
    line = one_error_line(err, "train")
    for needle in needles:
        assert needle in line


def test_bare_words_still_work_for_string_keys(tmp_path: Path) -> None:
    cfg = load_run_config(TINY, ["model.name=dlrm", "data.train=@train", 'data.sim.compression="zstd"'])
    assert cfg.model.name == "dlrm" and cfg.data.train == "@train" and cfg.data.sim["compression"] == "zstd"
    with pytest.raises(ConfigError, match="data.sim.compression"):
        load_run_config(TINY, ["data.sim.compression=zstd"])  # untyped key: no guessing
