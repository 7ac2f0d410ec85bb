"""Data writers commit whole or not at all, and readers refuse what was not committed (issue 10, §2-4).

Pins: a Ctrl-C or SIGTERM during ``opengem simulate`` leaves nothing that looks like a dataset; an
exception mid-write leaves the previous dataset untouched; ``--force`` never deletes unrelated files;
``Dataset`` refuses a folder or a selected partition without its ``_COMPLETE`` marker, a Parquet file at
the dataset root and an emptied partition; ``opengem convert`` refuses a non-empty ``--out`` unless
``--force`` and counts (never drops silently, never crashes on) source rows cut mid-line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from opengem import cli
from opengem.data import simulate as sim_mod
from opengem.data.adapters import convert
from opengem.data.commit import MARKER, OutputExistsError, leftovers, mark_complete, read_marker, staged_dir
from opengem.data.dataset import Dataset
from opengem.data.parquet import CanonicalWriter
from opengem.data.schema import FeatureSchema
from opengem.data.sim_config import SimConfig
from opengem.data.simulate import simulate
from opengem.errors import DatasetError
from parquet_helpers import random_columns

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "configs" / "schemas" / "tiny.toml"
SMALL = dict(rows=600, days=3, users=200, ads=200, advertisers=20, topics=10, seq_mean=4.0, seq_max=8,
             chunk_rows=100)


def small(**kw) -> SimConfig:
    return SimConfig(**{**SMALL, **kw})


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def hand_made(root: Path, parts: tuple[str, ...] = ("day=000", "day=001"), rows: int = 30) -> Path:
    """A dataset written file by file, as a person (or a foreign tool) would: no completion marker."""
    schema = FeatureSchema.load(TINY)
    root.mkdir(parents=True, exist_ok=True)
    schema.save(root / "schema.toml")
    for i, part in enumerate(parts):
        with CanonicalWriter(schema, root / part / "part-00000.parquet") as w:
            w.write(random_columns(schema, rows, seed=i, first_id=1000 * i))
    return root


# ----------------------------------------------------------------------------- interrupted simulate
def _simulate_until_second_day(tmp_path: Path, out: Path) -> subprocess.Popen:
    """Start `opengem simulate` in a subprocess and return once day 0 is finished (day 1 has begun)."""
    cmd = [sys.executable, "-m", "opengem.cli", "simulate", "--out", str(out), "--rows", "120000",
           "--days", "6", "--users", "2000", "--ads", "2000", "--chunk-rows", "2000", "--quiet"]
    # a suite started in the background (`make test &`) inherits SIGINT ignored, and Python keeps it ignored:
    # give the child the default disposition so that Ctrl-C reaches it as it would from a terminal
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not any(tmp_path.rglob("day=001/*.parquet")):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "simulate never reached day 1"
        time.sleep(0.02)
    return proc


def test_sigint_during_simulate_leaves_nothing_that_looks_complete(tmp_path):
    out = tmp_path / "sim"
    proc = _simulate_until_second_day(tmp_path, out)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0, err
    # before: the writer's close put a valid footer on half a day and Dataset/validate/train took it
    with pytest.raises(DatasetError):
        Dataset(out)
    assert cli.main(["validate", "--data", str(out)]) != 0
    assert not list(tmp_path.rglob("*.parquet")), "a finished-looking day was left behind"
    assert not list(tmp_path.rglob(MARKER))


def test_sigterm_during_simulate_is_refused_then_cleaned_up_by_the_next_write(tmp_path):
    out = tmp_path / "sim"
    proc = _simulate_until_second_day(tmp_path, out)
    proc.send_signal(signal.SIGTERM)  # no chance to clean up: the staging folder stays behind
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM
    assert not out.exists() and not list(tmp_path.rglob(MARKER))
    with pytest.raises(DatasetError, match="unfinished write"):
        Dataset(out)
    assert leftovers(out)
    simulate(small(), out)
    assert Dataset(out).files() and not leftovers(out, dead_only=False)


def test_exception_mid_write_keeps_the_previous_dataset(tmp_path, monkeypatch):
    out = tmp_path / "sim"
    simulate(small(), out)
    before = tree_bytes(out)
    real = sim_mod.iter_batches

    def failing(cfg):
        for i, sb in enumerate(real(cfg)):
            if i == 4:
                raise OSError(28, "No space left on device")
            yield sb

    monkeypatch.setattr(sim_mod, "iter_batches", failing)
    with pytest.raises(OSError):
        simulate(small(seed=1), out, force=True)
    assert tree_bytes(out) == before  # before: --force deleted the old days first, then failed half-way
    assert not leftovers(out, dead_only=False)


def test_force_replaces_a_dataset_but_never_unrelated_files(tmp_path):
    out = tmp_path / "sim"
    simulate(small(), out)
    with pytest.raises(OutputExistsError, match="already holds a dataset.*--force"):
        simulate(small(seed=1), out)
    simulate(small(seed=1), out, force=True)
    assert read_marker(out)["seed"] == 1 and not leftovers(out, dead_only=False)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(OutputExistsError, match="notes.txt"):
        simulate(small(), mine, force=True)  # before: written alongside the user's file
    assert os.listdir(mine) == ["notes.txt"]


# ----------------------------------------------------------------------------- readers
def test_a_dataset_without_its_marker_is_refused_until_marked(tmp_path):
    root = hand_made(tmp_path / "d")
    with pytest.raises(DatasetError, match=f"no {MARKER}.*--mark-complete"):
        Dataset(root)
    rec = mark_complete(root)
    assert rec["rows"] == 60 and rec["partitions"]["day=001"]["rows"] == 30
    assert read_marker(root / "day=000")["rows"] == 30
    assert len(Dataset(root).files("@all")) == 2


def test_a_partition_still_being_written_is_refused_when_selected(tmp_path):
    root = tmp_path / "sim"
    simulate(small(), root)
    late = root / "day=003"
    late.mkdir()
    (late / "part-00000.parquet").write_bytes((root / "day=002" / "part-00000.parquet").read_bytes())
    ds = Dataset(root)
    assert ds.partitions()[-1] == "day=003" and not ds.partition_complete("day=003")
    with pytest.raises(DatasetError, match=r"day=003: partition has no _COMPLETE"):
        ds.files("@all")
    assert len(ds.files("day=00[0-2]")) == 3
    (late / MARKER).write_text(json.dumps({"complete": True, "rows": 200}))
    assert len(Dataset(root).files("@all")) == 4


def test_a_parquet_file_at_the_dataset_root_is_named(tmp_path):
    root = tmp_path / "sim"
    simulate(small(), root)
    (root / "stray.parquet").write_bytes((root / "day=000" / "part-00000.parquet").read_bytes())
    with pytest.raises(DatasetError, match="stray.parquet: a Parquet file at the dataset root"):
        Dataset(root).files("@all")  # before: a partition named "." that every selector could pick


def test_an_emptied_partition_is_named_when_selected(tmp_path):
    root = tmp_path / "sim"
    simulate(small(), root)
    (root / "day=001" / "part-00000.parquet").unlink()
    ds = Dataset(root)
    with pytest.raises(DatasetError, match=r"day=001: partition holds no Parquet file"):
        ds.files("@all")  # before: day=001 silently vanished from @all
    assert len(ds.files("day=000")) == 1
    schema = ds.schema
    empty = root / "day=002" / "part-00000.parquet"
    pq.write_table(pq.read_table(empty).slice(0, 0), empty)
    with pytest.raises(DatasetError, match=r"day=002: partition holds only empty \(0-row\)"):
        Dataset(root, schema).files("day=002")


# ----------------------------------------------------------------------------- convert
CRITEO_COLS = 40  # label, I1..I13, C1..C26


def criteo_line(i: int) -> str:
    ints = [str((i * 7 + k) % 50) for k in range(13)]
    cats = [f"{(i + k) % 5:08x}" for k in range(26)]
    return "\t".join([str(i % 2), *ints, *cats])


def criteo_src(root: Path, cut_last: bool = False) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, n in (("train.tsv", 40), ("dev.tsv", 10), ("test.tsv", 10)):
        lines = [criteo_line(i) for i in range(n)]
        if cut_last and name == "train.tsv":
            lines[-1] = lines[-1][: len(lines[-1]) // 3]  # the copy stopped mid-line
            lines.insert(5, "\t".join(criteo_line(99).split("\t")[:12]))  # and a row with too few fields
        (root / name).write_text("\n".join(lines))
    return root


def test_convert_refuses_a_non_empty_out_unless_force_and_then_swaps(tmp_path, capsys):
    src = criteo_src(tmp_path / "src")
    out = tmp_path / "out"
    convert("criteo_kaggle_head", src, out)
    before = tree_bytes(out)
    args = ["convert", "criteo_kaggle_head", "--src", str(src), "--out", str(out), "--limit", "20"]
    assert cli.main(args) == 2  # before: schema and summary replaced, partitions orphaned, exit 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already holds a dataset" in err and "--force" in err
    assert tree_bytes(out) == before
    assert cli.main(args + ["--force"]) == 0
    assert json.loads((out / "summary.json").read_text())["splits"]["train"]["rows"] == 20
    assert read_marker(out)["rows"] == 40 and not leftovers(out, dead_only=False)


def test_convert_failing_mid_write_keeps_the_previous_output(tmp_path, monkeypatch):
    from opengem.data.parquet import CanonicalWriter

    src = criteo_src(tmp_path / "src")
    out = tmp_path / "out"
    convert("criteo_kaggle_head", src, out)
    before = tree_bytes(out)
    real, calls = CanonicalWriter.write, []

    def fail_second(self, data):
        calls.append(self.path)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, data)

    monkeypatch.setattr(CanonicalWriter, "write", fail_second)
    with pytest.raises(KeyboardInterrupt):
        convert("criteo_kaggle_head", src, out, force=True)
    assert tree_bytes(out) == before and not leftovers(out, dead_only=False)


def test_convert_counts_and_reports_rows_cut_mid_line(tmp_path, capsys):
    src = criteo_src(tmp_path / "src", cut_last=True)
    out = tmp_path / "out"
    assert cli.main(["convert", "criteo_kaggle_head", "--src", str(src), "--out", str(out)]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out)["bad_rows"] == 2
    assert "skipped 2 malformed source row(s)" in cap.err and "lines 6, 41" in cap.err
    summary = json.loads((out / "summary.json").read_text())
    bad = summary["bad_rows"]["files"][str(src / "train.tsv")]
    assert bad["rows"] == 2 and bad["lines"] == [6, 41] and "expected 40 fields, got 12" in bad["samples"][0]
    assert summary["splits"]["train"]["rows"] == 39  # 41 lines, 2 unparsable


def test_staged_dir_commit_is_atomic_for_any_folder(tmp_path):
    dest = tmp_path / "side"
    with pytest.raises(ValueError):
        with staged_dir(dest, writer="test", dataset=False) as st:
            (st.path / "a.txt").write_text("half")
            raise ValueError("boom")
    assert not dest.exists() and not leftovers(dest, dead_only=False)
    with staged_dir(dest, writer="test", dataset=False) as st:
        (st.path / "a.parquet").write_text("whole")
        st.record["n"] = 1
    assert read_marker(dest)["n"] == 1 and (dest / "a.parquet").read_text() == "whole"
    again = tmp_path / "again"
    again.mkdir()
    (again / ".part-00000.parquet.tmp-1-2").write_text("a killed CanonicalWriter's temp file")
    with staged_dir(again, writer="test", dataset=False) as st:
        (st.path / "b.parquet").write_text("new")
    assert sorted(os.listdir(again)) == [MARKER, "b.parquet"]
