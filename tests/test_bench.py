import argparse
import contextlib
import io
import json
from pathlib import Path

import pytest
import torch

from opengem.bench.cli import add_arguments, bench_rows_needed, format_table
from opengem.bench.machine import PeakMemory, matmul_peak
from opengem.cli import main
from opengem.data.dataset import Dataset
from opengem.model.flops import model_flops
from opengem.model.registry import build_model
from opengem.train.config import load_run_config

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.toml"
KEYS = ("examples_per_s", "flops_per_example", "achieved_flops", "peak_flops", "mfu", "peak_mem_mb",
        "time_to_first_step_s")


@pytest.fixture(scope="module")
def bench_json(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["bench", "train", "--config", str(TINY), "--json", "--out", str(out), "--steps", "3",
                   "--warmup", "1", "--windows", "2", "--pool", "3", "data.batch_size=64"])
    assert rc == 0
    return json.loads(buf.getvalue()), out


def test_bench_json_keys_and_sanity(bench_json):
    r, _ = bench_json
    for k in KEYS:
        assert isinstance(r[k], (int, float)) and r[k] == r[k], k
    assert 0 < r["mfu"] <= 1
    assert r["examples_per_s"] > 0 and r["time_to_first_step_s"] > 0 and r["peak_mem_mb"] >= 0
    assert len(r["window_examples_per_s"]) == 2
    assert min(r["window_examples_per_s"]) <= r["examples_per_s"] <= max(r["window_examples_per_s"])
    assert r["achieved_flops"] == pytest.approx(r["examples_per_s"] * r["flops_per_example"])
    assert r["mfu"] == pytest.approx(r["achieved_flops"] / r["peak_flops"])
    assert r["batch_size"] == 64 and r["model"] == "gem"
    # the counter the bench uses for the training step: 3 x (analytic forward of the same model)
    cfg = load_run_config(TINY)
    plain = build_model(Dataset(r["data"]).schema, cfg.model)
    assert r["flops_per_example"] == 3 * model_flops(plain)
    # FlopCounterMode on a real batch can only be below the full-length analytic count (+ 10 % tolerance)
    assert 0 < r["measured_fwd_flops_per_example"] <= 1.1 * r["fwd_flops_per_example"]


def test_bench_simulates_only_what_it_needs(bench_json):
    import pyarrow.parquet as pq

    r, _ = bench_json
    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in Dataset(r["data"]).files())
    cfg = load_run_config(TINY, ["data.batch_size=64"])
    assert rows == bench_rows_needed(cfg, 3) < cfg.data.sim["rows"]  # not tiny's 3000 rows
    assert r["pool_batches"] == 3  # and they gave the 3 full batches asked for


def test_bench_subcommand_parses_overrides_after_options():
    p = argparse.ArgumentParser()
    add_arguments(p)
    a = p.parse_args(["train", "--config", "x.toml", "--json", "model.name=dlrm", "data.batch_size=8"])
    assert a.mode == "train" and a.json and a.config == "x.toml"
    assert a.overrides == ["model.name=dlrm", "data.batch_size=8"]
    with pytest.raises(SystemExit):
        p.parse_args(["infer", "--config", "x.toml"])


def test_format_table_ratios():
    base = {"device": "cpu", "threads": 1, "batch_size": 8, "windows": 2, "steps": 3, "warmup": 1,
            "load_average": [1.0], "fwd_flops_per_example": 1e6, "achieved_flops": 3e9, "peak_flops": 1e11,
            "mfu": 0.03, "mfu_measured_flops": 0.02, "peak_mem_mb": 10.0, "time_to_first_step_s": 0.5,
            "peak_mem_method": "x"}
    text = format_table([{**base, "model": "gem", "examples_per_s": 1000.0},
                         {**base, "model": "dlrm", "examples_per_s": 2500.0}])
    assert "2.50" in text.splitlines()[4] and "3.00%" in text


def test_matmul_peak_positive_and_plausible():
    p = matmul_peak(torch.device("cpu"), n=256, repeats=3)
    assert 1e8 < p["peak_flops"] < 1e13  # 0.1 GFLOP/s .. 10 TFLOP/s on any CPU
    assert p["peak_flops"] >= p["peak_flops_median"]


def test_peak_memory_sees_an_allocation():
    m = PeakMemory(torch.device("cpu"))
    m.start()
    x = torch.ones(64 * 1024 * 1024 // 4)  # 64 MiB, touched
    del x
    r = m.stop()
    assert r["peak_mem_mb"] >= 48, r
