"""A study's run in a process of its own (bench/worker_process.py): forked from the preloaded server, or
started as ``python -m`` where there is none; the same exit code and log either way."""

from __future__ import annotations

import json
import os
import re

import pytest

from opengem.bench import worker_process
from opengem.errors import TrainError


@pytest.fixture(params=["forked", "python -m"])
def start(request, monkeypatch):
    if request.param == "python -m":
        monkeypatch.setattr(worker_process, "_context", False)
    return request.param


def test_a_worker_runs_as_python_dash_m_with_its_output_in_the_log(tmp_path, start):
    src = tmp_path / "in.json"
    src.write_text('{"b": 1, "a": [2, 3]}')
    log = tmp_path / "run.txt"
    assert worker_process.run_worker("json.tool", ["--sort-keys", str(src)], log) == 0
    assert json.loads(log.read_text()) == {"a": [2, 3], "b": 1}


def test_a_failing_worker_gives_its_exit_code_and_the_error_in_its_log(tmp_path, start):
    log = tmp_path / "run.txt"
    args = [str(tmp_path / "missing.toml"), "OUT", "DATA", "gem", "0", "0", "recipe", "0"]
    code = worker_process.run_worker("opengem.bench.isoflop_worker", args, log)
    assert code == 1
    assert "missing.toml" in log.read_text().strip().splitlines()[-1]


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs Linux's /proc to read a pid")
def test_each_run_is_a_process_of_its_own(tmp_path, start):
    """Two runs, two processes, neither of them this one: ``python -m tokenize /proc/self/stat`` prints the
    first token of the running process's own stat line, its pid."""
    pids = []
    for i in range(2):
        log = tmp_path / f"pid{i}.txt"
        assert worker_process.run_worker("tokenize", ["/proc/self/stat"], log) == 0
        pids.append(int(re.search(r"NUMBER\s+'(\d+)'", log.read_text()).group(1)))
    assert len(set(pids)) == 2 and os.getpid() not in pids


def test_train_in_worker_process_names_the_log_of_a_failed_run(tmp_path, start):
    run_dir = tmp_path / "runs" / "gem-s0-b0-lr0.01-seed0"
    with pytest.raises(TrainError, match=r"isoflop: run gem-s0-b0-lr0.01-seed0 failed \(exit 1\): .*missing"):
        worker_process.train_in_worker_process(
            "opengem.bench.isoflop_worker",
            [str(tmp_path / "missing.toml"), str(tmp_path), "DATA", "gem", "0", "0", "recipe", "0"],
            tmp_path, run_dir, "isoflop")
    assert (tmp_path / "logs" / f"{run_dir.name}.txt").exists()
