import argparse
import contextlib
import importlib.util
import io
import json
import math
import types
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
KEYS = ("examples_per_s", "flops_per_example", "flops_per_example_full", "achieved_flops", "peak_flops",
        "mfu", "mfu_full", "peak_mem_mb", "time_to_first_step_s", "loader_examples_per_s")


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
    # the counter the bench uses for the training step: 3 x (analytic forward of the same model), at full
    # length for mfu_full, at the batches' real history lengths (tiny's are mostly far shorter) for mfu
    cfg = load_run_config(TINY)
    plain = build_model(Dataset(r["data"]).schema, cfg.model)
    assert r["flops_per_example_full"] == 3 * model_flops(plain)
    assert r["flops_per_example"] == pytest.approx(3 * r["executed_fwd_flops_per_example"])
    assert 3 * model_flops(plain, 0) <= r["flops_per_example"] < r["flops_per_example_full"]
    assert r["mfu"] < r["mfu_full"]
    assert r["mfu_full"] == pytest.approx(r["examples_per_s"] * r["flops_per_example_full"] / r["peak_flops"])
    assert r["precision"] == "fp32" and r["peak_dtype"] == "float32"
    assert r["peak_flops_fp32"] == r["peak_flops"]
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
            "load_average": [1.0], "executed_fwd_flops_per_example": 1e6, "achieved_flops": 3e9,
            "peak_flops": 1e11, "mfu": 0.03, "mfu_full": 0.07, "peak_mem_mb": 10.0,
            "time_to_first_step_s": 0.5, "peak_mem_method": "x", "precision": "bf16",
            "loader_examples_per_s": 25000.0}
    text = format_table([{**base, "model": "gem", "examples_per_s": 1000.0},
                         {**base, "model": "dlrm", "examples_per_s": 2500.0}])
    row = text.splitlines()[4].split()
    assert row[0] == "dlrm" and row[1] == "bf16" and row[4] == "2.50"
    assert row[7:9] == ["3.00%", "7.00%"] and row[-1] == "10.0"  # MFU, MFU full; loader 25,000 / 2,500


def test_matmul_peak_positive_and_plausible():
    p = matmul_peak(torch.device("cpu"), n=256, repeats=3)
    assert 1e8 < p["peak_flops"] < 1e13  # 0.1 GFLOP/s .. 10 TFLOP/s on any CPU
    assert p["peak_flops"] >= p["peak_flops_median"]
    assert p["peak_dtype"] == "float32"
    bf16 = matmul_peak(torch.device("cpu"), n=256, repeats=3, precision="bf16")
    assert bf16["peak_dtype"] == "bfloat16" and bf16["peak_flops"] > 1e8
    with pytest.raises(ValueError, match="precision"):
        matmul_peak(torch.device("cpu"), n=8, precision="fp8")


def test_bench_under_bf16_divides_by_the_bf16_peak(tmp_path):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["bench", "train", "--config", str(TINY), "--json", "--out", str(tmp_path), "--steps", "1",
                   "--warmup", "0", "--windows", "1", "--pool", "2", "--peak-n", "256",
                   "data.batch_size=32", "train.precision=bf16"])
    assert rc == 0
    r = json.loads(buf.getvalue())
    assert r["precision"] == "bf16" and r["peak_dtype"] == "bfloat16"
    assert r["mfu"] == pytest.approx(r["achieved_flops"] / r["peak_flops"])
    assert r["peak_flops_fp32"] > 0 and math.isfinite(r["first_loss"])


def test_peak_memory_sees_an_allocation():
    m = PeakMemory(torch.device("cpu"))
    m.start()
    x = torch.ones(64 * 1024 * 1024 // 4)  # 64 MiB, touched
    del x
    r = m.stop()
    assert r["peak_mem_mb"] >= 48, r


REPO = Path(__file__).resolve().parents[1]


def bench_script(name: str) -> types.ModuleType:
    """``benchmarks/<name>.py``, loaded from its path (the benchmarks are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gpu_check_without_a_gpu_says_so_in_one_line():
    import subprocess
    import sys

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the script would run the real check")
    p = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh"), "/nonexistent/out"],
                       capture_output=True, text=True, timeout=120,
                       env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"})
    assert p.returncode == 2
    assert p.stdout.count("\n") == 1 and p.stdout.startswith("gpu_check: no CUDA GPU") and not p.stderr


def test_gpu_check_bench_overrides_are_real_config_keys():
    """The script's bench command names keys of configs/base.toml that exist (checked here without a GPU)."""
    import re

    script = (REPO / "benchmarks" / "gpu_check.sh").read_text()
    bench = re.search(r"BENCH=\((.*?)\)", script, re.S).group(1)
    overrides = [t.strip('"').replace("$OUT", "/tmp/x") for t in bench.split() if "=" in t and "." in t]
    assert {o.split("=")[0] for o in overrides} >= {"train.precision", "train.compile", "train.device"}
    cfg = load_run_config(REPO / "configs" / "base.toml", overrides)
    assert cfg.train.precision == "bf16" and cfg.train.compile and cfg.train.device == "cuda"
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args([t.strip('"') for t in bench.split()][3:])  # after "-m opengem.cli bench"
    assert args.models == "gem,dcnv2" and args.json


def test_gpu_check_table_from_the_parts_json(tmp_path):
    mod = bench_script("gpu_check_table")
    run = {"precision": "bf16", "examples_per_s": 123456.0, "mfu": 0.31, "mfu_full": 0.45,
           "peak_flops": 7.9e14, "peak_mem_mb": 20480.0, "batch_size": 4096, "windows": 3, "steps": 10}
    (tmp_path / "bench-cold.json").write_text(json.dumps(
        {"runs": [{**run, "model": "gem", "time_to_first_step_s": 95.0},
                  {**run, "model": "dcnv2", "time_to_first_step_s": 30.0}]}))
    (tmp_path / "bench-warm.json").write_text(json.dumps(
        {"runs": [{**run, "model": "gem", "time_to_first_step_s": 9.5}]}))  # dcnv2 timed out warm
    text = mod.table(tmp_path)
    gem = next(ln for ln in text.splitlines() if ln.startswith("gem")).split()
    assert gem[1:4] == ["bf16", "123,456", "31.00%"] and gem[-2:] == ["95.0", "9.5"]
    dcn = next(ln for ln in text.splitlines() if ln.startswith("dcnv2")).split()
    assert dcn[-2:] == ["30.0", "-"]
    assert "NCCL 1-process all-reduce: FAILED" in text  # no nccl.json
    (tmp_path / "nccl.json").write_text(json.dumps({"ok": True, "seconds": 1.5, "nccl": "2.27.3",
                                                    "device": "NVIDIA H200", "torch": "2.13.0"}))
    assert "ok in 1.50 s" in mod.table(tmp_path)
    assert "Triton twins: FAILED" in mod.table(tmp_path)  # no triton.json
    (tmp_path / "triton.json").write_text(json.dumps({"results": [
        {"op": "fmb", "dtype": "bfloat16", "max_abs_diff": 0.004, "max_abs_value": 8.0, "ref_ms": 3.0,
         "triton_ms": 1.5, "speedup": 2.0, "shape": "batch 4096"}]}))
    assert "triton fmb bfloat16: max |diff| 4.0e-03 of 8.0e+00, 1.50 ms vs reference 3.00 ms (x2.00" in \
        mod.table(tmp_path)
    assert "train.pipeline A/B: FAILED" in mod.table(tmp_path)  # no pipeline/pipeline_ab.json
    (tmp_path / "pipeline").mkdir()
    (tmp_path / "pipeline" / "pipeline_ab.json").write_text(json.dumps({"rows": [
        {"model": "dcnv2", "none": 50000.0, "sparse_dist": 60000.0, "ratio_median": 1.2, "ratios": [1.2]}]}))
    assert "train.pipeline, dcnv2, 1 process: plain loop 50,000 ex/s, sparse_dist 60,000 ex/s (x1.20)" in \
        mod.table(tmp_path)
    (tmp_path / "bench-cold.json").write_text("")
    (tmp_path / "bench-warm.json").write_text("not json")
    assert "gem    failed" in mod.table(tmp_path)
    (tmp_path / "bench-cold.json").write_text(json.dumps(
        {"runs": [{**run, "model": "dcnv2", "time_to_first_step_s": 30.0}],
         "failed": [{"model": "gem", "error": "RuntimeError: CUDA error: an illegal memory access"}]}))
    text = mod.table(tmp_path)
    assert "gem    failed (RuntimeError: CUDA error: an illegal memory access): see" in text
    assert next(ln for ln in text.splitlines() if ln.startswith("dcnv2")).split()[1:3] == ["bf16", "123,456"]


def test_bench_goes_on_past_a_crashed_model(monkeypatch, capsys):
    """Several models: one model's crash is reported (its last line, exit 1) and the others still run."""
    from opengem.bench import cli as bench_cli

    ran = []

    def fake(args, model):
        ran.append(model)
        if model == "gem":
            raise bench_cli.ModelCrashed(model, 1, "Traceback (most recent call last):\n  ...\n"
                                                   "RuntimeError: CUDA error: out of memory\n")
        return {"model": model, "examples_per_s": 1.0}

    monkeypatch.setattr(bench_cli, "bench_subprocess", fake)
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["train", "--config", str(REPO / "configs" / "tiny.toml"),
                         "--models", "gem,dlrm,dcnv2", "--json"])
    assert bench_cli.run_train(args, load_run_config(args.config, [])) == 1
    assert ran == ["gem", "dlrm", "dcnv2"]
    out, err = capsys.readouterr()
    obj = json.loads(out)
    assert [r["model"] for r in obj["runs"]] == ["dlrm", "dcnv2"]
    assert obj["failed"] == [{"model": "gem", "error": "RuntimeError: CUDA error: out of memory"}]
    assert "Traceback" in err and "error: model gem failed: RuntimeError: CUDA error: out of memory" in err


def test_gpu_check_table_shows_gem_eager_when_gem_failed_compiled(tmp_path):
    mod = bench_script("gpu_check_table")
    run = {"precision": "bf16", "examples_per_s": 5000.0, "mfu": 0.2, "mfu_full": 0.3, "peak_flops": 7.9e14,
           "peak_mem_mb": 40960.0, "batch_size": 4096, "windows": 3, "steps": 10,
           "time_to_first_step_s": 12.0}
    (tmp_path / "bench-cold.json").write_text(json.dumps(
        {"runs": [{**run, "model": "dcnv2"}], "failed": [{"model": "gem", "error": "InductorError: boom"}]}))
    assert "gem*" not in mod.table(tmp_path)  # no eager run (GEM compiled fine, or it was not tried)
    (tmp_path / "bench-eager.json").write_text(json.dumps({**run, "model": "gem"}))
    text = mod.table(tmp_path)
    assert "gem    failed (InductorError: boom)" in text
    row = next(ln for ln in text.splitlines() if ln.startswith("gem*")).split()
    assert row[1:4] == ["bf16", "5,000", "20.00%"] and row[-2:] == ["12.0", "-"]
    assert "gem* = compile off" in text


def test_lr_compare_extends_the_grid_past_an_edge_best(tmp_path):
    """``lr_compare.py --extend``: a best scale on the grid's edge asks for one step past it (1-3-10 grid);
    once bracketed, nothing more; the extension's result file counts as a tried scale."""
    mod = bench_script("lr_compare")

    def write(scale: float, ne: float) -> None:
        h = {"epoch": 1, "valid": {"metrics": {"all/like": {"ne": ne, "auc": 0.7}}}}
        path = mod.result_path(tmp_path, "ds", "gem", 0, scale)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"history": [h], "best_epoch": 1}))

    grid = [0.3, 1.0, 3.0]
    for scale, ne in ((0.3, 0.90), (1.0, 0.88), (3.0, 0.86)):
        write(scale, ne)
    assert mod.beyond_edge(tmp_path, "ds", "gem", 0, grid, "ne") == 10.0
    write(10.0, 0.87)
    assert mod.tried_scales(tmp_path, "ds", "gem", 0, grid) == [0.3, 1.0, 3.0, 10.0]
    assert mod.beyond_edge(tmp_path, "ds", "gem", 0, grid, "auc") is None  # bracketed now
    assert mod.best_scale(tmp_path, "ds", "gem", 0, grid, "ne") == 3.0
    write(0.3, 0.80)  # the bottom edge wins instead: one step below
    assert mod.beyond_edge(tmp_path, "ds", "gem", 0, grid, "ne") == 0.1


def test_lr_compare_scales_its_own_base_rates_not_the_recipes(tmp_path):
    """The committed real-data tables ran at x scales of the recipes' rates of sessions 4-35; the recipes now
    carry their model's tuned rates, so the grid's base lives in ``lr_compare.DATASETS`` and a recipe's rate
    change must not change the runs a committed command line asks for."""
    mod = bench_script("lr_compare")
    assert mod.base_rates("frappe_x1") == (1e-3, 0.05)
    assert mod.base_rates("kuairand_pure") == (3e-3, 0.05)
    assert mod.base_rates("movielens_100k") == (1e-3, 0.05)
    cmd = mod.command("frappe_x1", tmp_path, tmp_path / "r.json", "dcnv2", 0, 30.0, 0, [])
    assert "train.lr=0.03" in cmd and "train.sparse_lr=1.5" in cmd
    recipe = load_run_config(REPO / mod.DATASETS["frappe_x1"]["config"])
    assert recipe.train.sparse_lr != 0.05  # the recipe moved; the grid's x1 did not
