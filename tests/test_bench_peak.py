"""The bench's matmul-peak probe: warmed up, same shape, timed in blocks, in wall and CPU time (issue 13).

A probe of a few single bf16 1024^3 calls (~2 ms each on AMX) varied 3x between models in one bench run,
so MFU under bf16 meant little. These pin the probe's form and that the bench's CPU-time MFU is what it
says: CPU-time throughput over the CPU-time peak, both from the same run.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch

from opengem.bench.machine import matmul_peak, pool_peaks
from opengem.cli import main

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.toml"


def test_matmul_peak_warms_up_times_blocks_and_reports_cpu_time():
    p = matmul_peak(torch.device("cpu"), n=128, repeats=4, precision="bf16")
    assert len(p["blocks_wall"]) == len(p["blocks_cpu"]) == 4 and p["peak_inner"] >= 1
    assert p["peak_flops"] == max(p["blocks_wall"]) >= p["peak_flops_median"] > 0
    assert p["peak_flops_cpu"] > 0 and p["peak_dtype"] == "bfloat16"
    q = matmul_peak(torch.device("cpu"), n=128, repeats=3, precision="bf16")
    pooled = pool_peaks([p, q])
    assert pooled["peak_blocks"] == 7
    assert pooled["peak_flops"] == max(p["peak_flops"], q["peak_flops"])
    assert min(p["blocks_wall"] + q["blocks_wall"]) <= pooled["peak_flops_median"] <= pooled["peak_flops"]


def test_matmul_peak_and_pool_reject_bad_arguments():
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        matmul_peak(torch.device("cpu"), n=8, repeats=0)
    with pytest.raises(ValueError, match="no probes"):
        pool_peaks([])


def test_bench_reports_cpu_time_mfu_from_the_pooled_probes(tmp_path):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["bench", "train", "--config", str(TINY), "--json", "--out", str(tmp_path), "--steps", "2",
                   "--warmup", "0", "--windows", "2", "--pool", "2", "--peak-n", "128",
                   "data.batch_size=32", "train.precision=bf16"])
    assert rc == 0
    r = json.loads(buf.getvalue())
    # one 7-block probe before, a 3-block probe after each of the 2 windows, a 7-block probe after
    assert r["peak_blocks"] == 7 + 2 * 3 + 7
    assert r["peak_flops"] >= r["peak_flops_median"] > 0 and r["peak_dtype"] == "bfloat16"
    assert r["examples_per_cpu_s"] > 0 and r["peak_flops_cpu"] > 0
    expected = r["examples_per_cpu_s"] * r["flops_per_example"] / r["peak_flops_cpu"]
    assert r["mfu_cpu"] == pytest.approx(expected)


def test_fp32_cpu_peak_times_the_faster_of_blas_and_onednn(monkeypatch):
    """The fp32 CPU peak is the faster product the trainer can run (train.cpu_linear): MFU stays <= 100 %."""
    from opengem.ops.onednn import onednn_linear

    p = matmul_peak(torch.device("cpu"), n=64, repeats=2)
    assert p["peak_kernel"] in (("aten", "onednn") if onednn_linear.available() else ("aten",))
    monkeypatch.setattr(onednn_linear, "available", lambda: False)
    assert matmul_peak(torch.device("cpu"), n=64, repeats=1)["peak_kernel"] == "aten"
    assert matmul_peak(torch.device("cpu"), n=64, repeats=1, precision="bf16")["peak_kernel"] == "aten"
