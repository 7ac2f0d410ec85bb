"""More user mistakes that must reach a person as one line, not a traceback (issue 10, section 5).

Each case was a traceback found by ``benchmarks/hostile_pass.py``: a bad Parquet codec or a mistyped
``data.sim`` value, a model size or name that cannot build a model, bench/scale/report errors printed by
hand instead of raised, a CSV row of binary garbage, a schema written in the locale's encoding, and a
read-only ``--out`` reported under the hidden temporary folder's name.
"""

from __future__ import annotations

import argparse
import errno
import os
import random
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pcsv
import pytest

import opengem.bench.cli as bench_cli
from cli_helpers import TRACEBACK, one_error_line, run_cli
from opengem.cli import main
from opengem.config import ConfigError, load_config
from opengem.data.adapters import convert as convert_dataset
from opengem.data.adapters.common import AdapterError, BadRows, read_csv
from opengem.data.commit import staged_dir
from opengem.data.schema import FeatureSchema
from opengem.data.sim_config import SimConfig, SimConfigError, sim_schema
from opengem.errors import OpengemError
from opengem.model.registry import ModelConfig, build_model

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.toml"
TINY_SCHEMA = ROOT / "configs" / "schemas" / "tiny.toml"
SIM = ["--rows", "600", "--days", "2", "--surfaces", "2", "--users", "200", "--ads", "100",
       "--advertisers", "20", "--topics", "10", "--seq-mean", "4", "--seq-max", "8", "--recent-k", "2",
       "--emb-dim", "4", "--chunk-rows", "300", "--quiet"]
FAST = ["train.steps=2", "train.progress=false", "train.warmup_steps=1", "train.threads=1"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("data") / "D"
    assert main(["simulate", "--out", str(out), *SIM]) == 0
    return out


# ------------------------------------------------------------------ 1. simulator config
def test_simulate_with_an_unknown_compression_is_one_line_naming_the_codecs(capsys, tmp_path: Path) -> None:
    """Was pyarrow's ArrowException from deep in the writer (a traceback, exit 1)."""
    rc, err = run_cli(capsys, ["simulate", "--out", str(tmp_path / "d"), *SIM, "--compression", "bogus"])
    assert rc == 2
    line = one_error_line(err, "simulate")
    assert "compression" in line and "'bogus'" in line and "zstd" in line
    assert "simulate: compression" not in line  # no "simulate:" inside "opengem simulate: error:"
    assert not (tmp_path / "d").exists()  # refused before any work


@pytest.mark.parametrize("codec", ["zstd", "snappy", "none"])
def test_the_codecs_pyarrow_writes_pass_validation(codec: str) -> None:
    SimConfig(compression=codec).validate()


def test_sim_from_dict_type_checks_and_names_the_key() -> None:
    """Was a TypeError ('>' between str and int) inside validate()."""
    with pytest.raises(SimConfigError, match=r"^data\.sim\.rows: expected an integer, got 'abc'"):
        SimConfig.from_dict({"rows": "abc"})
    with pytest.raises(SimConfigError, match=r"^data\.sim\.rowz: unknown key"):
        SimConfig.from_dict({"rowz": 10})
    with pytest.raises(SimConfigError, match=r"^data\.sim\.rows: must be > 0"):
        SimConfig.from_dict({"rows": 0})
    assert SimConfig.from_dict({"seq_mean": 3, "rows": 10}).seq_mean == 3.0  # an int where a float goes
    with pytest.raises(SimConfigError) as e:
        SimConfig(rows=0).validate()
    assert str(e.value).startswith("rows: must be > 0")  # the command prints its own prefix


def test_train_with_a_quoted_string_for_a_sim_size_is_one_line(capsys, tmp_path: Path) -> None:
    rc, err = run_cli(capsys, ["train", "--config", str(TINY), 'data.sim.rows="abc"',
                            "--out", str(tmp_path / "r")])
    assert rc == 2
    assert "data.sim.rows: expected an integer" in one_error_line(err, "train")


# ------------------------------------------------------------------ 2. model sizes and names
@pytest.mark.parametrize("overrides, needle", [
    (["embedding.d=-4"], "model.embedding.d: must be >= 1 (got -4)"),
    (["embedding.dense_hidden=-3"], "model.embedding.dense_hidden: must be >= 0"),
    (["name=nosuch"], "model.name: unknown model 'nosuch'; choose one of gem, wukong, dlrm, dcnv2, din"),
    (["head.hidden=[0]"], "model.head.hidden: every width must be >= 1"),
    (["name=dlrm", "dlrm.bottom_mlp=[-1]"], "model.dlrm.bottom_mlp: every width must be >= 1"),
    (["name=dcnv2", "dcnv2.structure=x"], "model.dcnv2.structure: 'x' is not one of parallel, stacked"),
    (["name=dcnv2", "dcnv2.deep_mlp=[-1]"], "model.dcnv2.deep_mlp"),
    (["name=din", "din.mlp=[-1]"], "model.din.mlp"),
    (["gem.wukong.cla_heads=0"], "model.gem.wukong.cla_heads: must be >= 1"),
    (["gem.wukong.cla_heads=3"], "model.gem.wukong.cla_heads: must divide embedding.d = 32"),
    (["gem.wukong.mlp_dims=[-5]"], "model.gem.wukong.mlp_dims"),
    (["gem.interformer.num_heads=0"], "model.gem.interformer.num_heads: must be >= 1"),
    (["gem.interformer.n_pma=-1"], "model.gem.interformer.n_pma: must be >= 0"),
    (["name=wukong", "gem.wukong.num_layers=0"], "model.gem.wukong.num_layers: must be >= 1"),
])
def test_a_model_config_that_cannot_build_is_a_config_error_naming_the_key(overrides: list[str],
                                                                           needle: str) -> None:
    """Were ValueError, RuntimeError (a negative tensor size) or ZeroDivisionError: tracebacks."""
    cfg = load_config(ModelConfig, None, overrides)
    with pytest.raises(ConfigError) as e:
        build_model(FeatureSchema.load(TINY_SCHEMA), cfg)
    assert needle in str(e.value)
    assert isinstance(e.value, ValueError)  # callers that catch ValueError still do


def test_sequence_heads_are_checked_only_where_an_attention_is_built() -> None:
    """A tiny sequence the pyramid leaves alone never splits d into heads: no reason to refuse it."""
    schema = sim_schema(SimConfig(seq_max=8, emb_dim=4))
    odd = ["embedding.d=6", "gem.sequence.num_heads=4"]
    build_model(schema, load_config(ModelConfig, None, odd))
    cfg = load_config(ModelConfig, None, [*odd, "gem.sequence.kind=full"])
    with pytest.raises(ConfigError, match="model.gem.sequence.num_heads: must divide embedding.d = 6"):
        build_model(schema, cfg)


@pytest.mark.parametrize("override, needle", [
    ("model.embedding.d=-4", "model.embedding.d: must be >= 1 (got -4)"),
    ("model.name=nosuch", "model.name: unknown model 'nosuch'"),
])
def test_train_with_a_bad_model_config_is_one_line(capsys, tmp_path: Path, dataset: Path,
                                                   override: str, needle: str) -> None:
    rc, err = run_cli(capsys, ["train", "--config", str(TINY), *FAST, "--data", str(dataset), override,
                            "--out", str(tmp_path / "r")])
    assert rc == 2
    assert needle in one_error_line(err, "train")


# ------------------------------------------------------------------ 3. bench, scale, report
def test_bench_steps_below_one_is_a_usage_error_naming_the_flag(capsys) -> None:
    """With several models each child failed and the parent raised RuntimeError: a traceback."""
    for models in ("", "gem,dlrm"):
        argv = ["bench", "train", "--config", str(TINY), "--models", models, "--steps", "-1"]
        rc, err = run_cli(capsys, argv)
        assert rc == 2
        assert "--steps: must be >= 1 (got -1)" in one_error_line(err, "bench")


def test_bench_config_error_is_raised_not_printed(capsys) -> None:
    rc, err = run_cli(capsys, ["bench", "train", "--config", str(TINY), "train.steps=abc", "--steps", "1"])
    assert rc == 2
    assert "train.steps" in one_error_line(err, "bench")


def test_bench_child_user_error_is_one_line_and_a_child_crash_keeps_its_trace(monkeypatch) -> None:
    args = argparse.Namespace(config=str(TINY), json=False, steps=1, warmup=0, windows=1, pool=1,
                              data=None, out=None, peak_n=None, overrides=[])

    def child(stderr: str, rc: int):  # noqa: ANN202
        return lambda *a, **k: subprocess.CompletedProcess(a, rc, stdout="", stderr=stderr)

    user_error = "opengem bench: error: model.embedding.d: must be >= 1\n"
    monkeypatch.setattr(subprocess, "run", child(user_error, 2))
    with pytest.raises(OpengemError) as e:  # exit code: the child's
        bench_cli.bench_subprocess(args, "dlrm")
    assert str(e.value) == "model dlrm: model.embedding.d: must be >= 1" and e.value.exit_code == 2
    crash = f"{TRACEBACK}:\n  File x\nZeroDivisionError\nopengem bench: error: internal\n"
    monkeypatch.setattr(subprocess, "run", child(crash, 1))
    with pytest.raises(RuntimeError, match="ZeroDivisionError") as e2:
        bench_cli.bench_subprocess(args, "dlrm")
    assert not isinstance(e2.value, OpengemError)


def test_scale_config_error_is_raised_not_printed(capsys, tmp_path: Path) -> None:
    argv = ["scale", "--config", str(tmp_path / "nope.toml"), "--out", str(tmp_path / "s")]
    rc, err = run_cli(capsys, argv)
    assert rc == 2
    assert "nope.toml" in one_error_line(err, "scale")


def test_report_on_a_missing_folder_is_one_error_line_on_stderr(capsys, tmp_path: Path) -> None:
    rc, err = run_cli(capsys, ["report", str(tmp_path / "nope")])
    assert rc == 2
    assert "nope: no such folder" in one_error_line(err, "report")


# ------------------------------------------------------------------ 4. binary garbage in a CSV source
def test_a_csv_row_that_is_not_utf8_is_one_printable_line_without_an_ignored_traceback(
        monkeypatch, tmp_path: Path) -> None:
    """pyarrow decodes a malformed row as UTF-8 before its invalid-row handler sees it; on binary bytes
    that printed "Exception ignored ... UnicodeDecodeError" with a traceback, and the error that followed
    quoted the raw bytes."""
    seen: list[object] = []

    def record(unraisable: object) -> None:
        seen.append(unraisable)

    monkeypatch.setattr(sys, "unraisablehook", record)
    path = tmp_path / "x.csv"
    garbage = b"\x93\xff\x00\x1b[31m" + bytes(range(128, 256)) * 2
    path.write_bytes(b"a,b\n1,2\n" + garbage + b",x,y\n3,4\n")
    with pytest.raises(AdapterError) as e:
        read_csv(path, BadRows(), "not test CSV")
    msg = str(e.value)
    assert seen == []
    assert msg.startswith(f"{path}: not test CSV: row ") and "is not UTF-8 text" in msg
    assert msg.isprintable() and "\x1b" not in msg  # the row in repr() form: no terminal escapes
    shown = msg.split("): ", 1)[1].split("...;", 1)[0]
    assert len(eval(shown)) == 80  # noqa: S307 - a repr() of a str, truncated


def test_a_streaming_csv_reader_gets_the_same_protection(monkeypatch, tmp_path: Path) -> None:
    """Any reader given ``BadRows.handler`` (pyarrow's streaming ``open_csv`` too): no ignored traceback,
    and ``BadRows.failure`` explains the parse error that follows."""
    seen: list[object] = []

    def record(unraisable: object) -> None:
        seen.append(unraisable)

    monkeypatch.setattr(sys, "unraisablehook", record)
    path = tmp_path / "x.csv"
    path.write_bytes(b"a,b\n1,2\n\xff\xfe\x00,x,y\n3,4\n")
    bad = BadRows()
    parse = pcsv.ParseOptions(invalid_row_handler=bad.handler(path))
    with pytest.raises(pa.ArrowInvalid) as e:  # open_csv reads the first block
        pcsv.open_csv(path, read_options=pcsv.ReadOptions(use_threads=False), parse_options=parse).read_all()
    assert seen == []
    why = bad.failure(path, e.value)
    assert "row" in why and "is not UTF-8 text" in why and why.isprintable() and "\\xff" not in why
    assert bad.failure(tmp_path / "other.csv", pa.ArrowInvalid("x\x1by")) == "x\\x1by"  # escaped
    sys.unraisablehook(type("U", (), {"object": None, "exc_value": ValueError("other")})())
    assert len(seen) == 1  # anyone else's unraisable error still reaches the hook that was there


def test_a_malformed_utf8_row_is_still_skipped_and_counted_with_a_short_sample(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_text("a,b\n1,2\n" + "z," * 100 + "z\n3,4\n", encoding="utf-8")
    bad = BadRows()
    assert read_csv(path, bad, "not test CSV").num_rows == 2
    sample = bad.files[str(path)]["samples"][0]
    assert sample.endswith("...") and len(sample) < 120


def test_converting_binary_garbage_is_an_adapter_error_without_an_ignored_traceback(monkeypatch,
                                                                                     tmp_path: Path) -> None:
    """The hostile pass's case (``convert avazu_head`` on three files of random bytes), through the
    adapter's Python API, the part of the command that reads the sources."""
    seen: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    src = tmp_path / "garbage"
    src.mkdir()
    rng = random.Random(0)
    for name in ("train.csv", "dev.csv", "test.csv"):
        (src / name).write_bytes(rng.randbytes(4096))
    with pytest.raises(AdapterError):
        convert_dataset("avazu_head", src, tmp_path / "c")
    assert seen == []


# ------------------------------------------------------------------ 5. schema.toml is UTF-8 everywhere
def test_schema_save_writes_utf8_under_an_ascii_locale(tmp_path: Path) -> None:
    """FeatureSchema.load reads UTF-8; save wrote the locale's encoding (ASCII under LC_ALL=C)."""
    src = tmp_path / "in.toml"
    FeatureSchema.from_dict({**sim_schema(SimConfig()).to_dict(), "name": "café",
                             "surfaces": ["fëed", "stories"]}).save(src)
    out = tmp_path / "out.toml"
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    code = ("import locale, sys; from opengem.data.schema import FeatureSchema as S; "
            "print(locale.getpreferredencoding(False)); S.load(sys.argv[1]).save(sys.argv[2])")
    proc = subprocess.run([sys.executable, "-c", code, str(src), str(out)], env=env, capture_output=True,
                          text=True, timeout=60)
    if proc.stdout.strip().lower().replace("-", "") in ("utf8", ""):
        pytest.skip(f"no non-UTF-8 locale here ({proc.stdout.strip()!r}): {proc.stderr[-300:]}")
    assert proc.returncode == 0, proc.stderr
    assert FeatureSchema.load(out) == FeatureSchema.load(src)
    assert "fëed" in out.read_text(encoding="utf-8")


# ------------------------------------------------------------------ 6. errors name --out, not its temp folder
def test_a_read_only_out_names_the_folder_given(monkeypatch, capsys, tmp_path: Path) -> None:
    """The staging folder ``.d.tmp-HOST-PID-XXXX`` is an implementation detail: name ``--out``."""
    real_mkdir = Path.mkdir

    def read_only(self: Path, *args: object, **kwargs: object) -> None:
        if ".tmp-" in self.name:
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        real_mkdir(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "mkdir", read_only)
    out = tmp_path / "ro" / "d"
    rc, err = run_cli(capsys, ["simulate", "--out", str(out), *SIM])
    assert rc == 1
    line = one_error_line(err, "simulate")
    assert f"{out}: read-only file system" in line and ".tmp-" not in line


def test_a_write_failing_inside_the_staging_folder_names_its_place_in_out(tmp_path: Path) -> None:
    dest = tmp_path / "d"
    with pytest.raises(PermissionError) as e:  # the OSError subclass is kept
        with staged_dir(dest, writer="test") as st:
            raise PermissionError(errno.EACCES, "Permission denied", str(st.path / "day=000" / "p.parquet"))
    assert e.value.filename == str(dest.absolute() / "day=000" / "p.parquet")
    assert e.value.errno == errno.EACCES
    with pytest.raises(OSError) as e2:  # a rename names both ends: the temporary one becomes --out
        with staged_dir(dest, writer="test") as st:
            raise OSError(errno.EXDEV, "Invalid cross-device link", str(st.path), None, str(dest.absolute()))
    assert e2.value.filename == str(dest.absolute()) and e2.value.filename2 is None
    outside = OSError(errno.ENOSPC, "No space left on device", "/elsewhere/x")
    with pytest.raises(OSError) as e3:
        with staged_dir(dest, writer="test"):
            raise outside
    assert e3.value is outside
    assert not dest.exists() and not list(tmp_path.iterdir())  # nothing left behind
