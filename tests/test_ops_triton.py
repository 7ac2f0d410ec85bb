"""The Triton twins (``kernel="triton"``) against the reference, forward and backward, in Triton's CPU
interpreter: so CI, which has no GPU, runs the same kernel code a GPU compiles.

Jagged attention on random jagged rows (empty rows, a batch of only empty rows, no rows, rows longer than
one 32-event tile so the online softmax crosses tiles); the FM product and FMB with a shared and a
per-example Y, GEM-small's FMB shape, all-zero examples (LayerNorm's variance 0) and an empty batch.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from opengem.ops import attention
from opengem.ops import fmb as fmb_ops
from opengem.ops.triton import block, interpreting, require_triton
from twin_helpers import assert_twins_equal, fmb_inputs, rand, run_fwd_bwd, tokens

# tests/conftest.py sets TRITON_INTERPRET=1 before torch (and with it Triton) is imported
pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                       reason="triton is not installed (requirements/cpu.txt installs it)"),
    pytest.mark.skipif(not interpreting(),
                       reason="TRITON_INTERPRET is set to 0 in this environment, and the Triton twins run "
                              "on CPU only in Triton's interpreter: unset it (tests/conftest.py then sets "
                              "1), or time them on a GPU with benchmarks/triton_kernels.py"),
]

ATOL, RTOL = 2e-5, 1e-4


def _same(ref: tuple, got: tuple) -> None:
    assert_twins_equal(ref, got, ATOL, RTOL)


@pytest.mark.parametrize("lengths,dh", [
    ([3, 0, 5, 1], 4),  # empty row between real ones
    ([0, 0], 8),  # only empty rows: no events at all
    ([], 8),  # no rows
    ([40, 0, 17, 33], 12),  # rows over one tile (32): the online softmax crosses tiles; dh not a power of 2
    ([1], 16),  # one event attends to itself
])
def test_triton_jagged_attention_matches_reference(lengths, dh):
    H = 2
    n = sum(lengths)
    lt = torch.tensor(lengths, dtype=torch.long)
    max_len = max(lengths, default=0) + 3  # slack beyond the longest row must not matter
    q, k, v = rand(n, H, dh, seed=1), rand(n, H, dh, seed=2), rand(n, H, dh, seed=3)

    def call(kernel: str):  # noqa: ANN202
        return lambda a, b, c: attention.jagged_attention(a, b, c, lt, max_len, kernel=kernel)

    _same(run_fwd_bwd(call("pytorch"), [q, k, v]), run_fwd_bwd(call("triton"), [q, k, v]))


# (B, n, d, k, MLP dims after the LN, all-zero examples, per-example Y)
FMB_CASES = [
    (6, 24, 32, 8, [512, 256], (1, 4), False),  # GEM-small's FMB shape, two all-zero examples
    (5, 7, 4, 3, [16, 12], (0,), True),  # input-attentive Y [B, n, k]; tiles padded to 16
    (1, 5, 20, 2, [10], (), False),  # batch 1, d not a power of two
    (0, 5, 8, 2, [16], (), False),  # an empty batch
]


@pytest.mark.parametrize("B,n,d,k,dims,zero_rows,per_example", FMB_CASES)
def test_triton_fm_product_matches_reference(B, n, d, k, dims, zero_rows, per_example):
    x = tokens(B, n, d, zero_rows)
    y = rand(B, n, k, seed=5) if per_example else rand(n, k, seed=5)

    def call(kernel: str):  # noqa: ANN202
        return lambda a, b: fmb_ops.fm_product(a, b, kernel=kernel)

    _same(run_fwd_bwd(call("pytorch"), [x, y]), run_fwd_bwd(call("triton"), [x, y]))


@pytest.mark.parametrize("B,n,d,k,dims,zero_rows,per_example", FMB_CASES)
def test_triton_fmb_matches_reference(B, n, d, k, dims, zero_rows, per_example):
    inputs, call = fmb_inputs(B, n, d, k, dims, zero_rows, per_example)
    _same(run_fwd_bwd(call("pytorch"), inputs), run_fwd_bwd(call("triton"), inputs))


def test_triton_fm_product_refuses_an_example_too_large_for_one_program():
    x, y = rand(2, 300, 128, seed=1), rand(300, 4, seed=2)
    with pytest.raises(ValueError, match="use kernel='fused'"):
        fmb_ops.fm_product(x, y, kernel="triton")


def test_the_interpreter_set_after_triton_was_imported_is_named(monkeypatch):
    import triton.language as tl

    monkeypatch.setattr(tl, "sum", object())  # tl.sum when Triton was imported without the interpreter
    with pytest.raises(RuntimeError, match="set after triton was imported"):
        require_triton(torch.zeros(2))


def test_triton_on_cpu_without_the_interpreter_is_an_error_not_a_fallback(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        require_triton(torch.zeros(2))
    with pytest.raises(ValueError, match="not one of"):
        attention.masked_attention(torch.zeros(1, 1, 1, 4), torch.zeros(1, 1, 1, 4), torch.zeros(1, 1, 1, 4),
                                   kernel="triton")  # no Triton twin: named, not silently the reference


def test_block_covers_n_with_a_power_of_two_of_at_least_16():
    assert [block(n) for n in (0, 1, 16, 17, 33, 64)] == [16, 16, 16, 32, 64, 64]
    assert block(3, floor=1) == 4


def test_the_gpu_check_triton_script_runs_under_the_interpreter(tmp_path):
    """benchmarks/triton_kernels.py (gpu_check.sh part 4) rarely meets a GPU: run it here, tiny shapes."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "triton_kernels.py"
    out = tmp_path / "triton.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    p = subprocess.run([sys.executable, str(script), "--tiny", "--json", str(out)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(out.read_text())["results"]
    assert [r["op"] for r in res] == ["jagged_attention", "fmb"]
    assert all(r["max_abs_diff"] < 1e-4 * max(1.0, r["max_abs_value"]) for r in res)


def test_gem_with_the_triton_kernel_equals_the_fused_model():
    """``model.gem.kernel = "triton"``: Wukong's FMB runs the Triton kernel, every other block its fused twin,
    with the same weights and the same numbers (logits, loss and every parameter's grad) as the fused GEM."""
    import tomllib
    from pathlib import Path

    from opengem.config import from_dict
    from opengem.data.random_batch import random_batch
    from opengem.data.sim_config import SimConfig, sim_schema
    from opengem.model.heads import masked_bce
    from opengem.model.registry import ModelConfig, build_model
    from opengem.model.sequence import use_kernel
    from opengem.model.wukong import WukongLayer
    from opengem.ops.kernel import Kernel

    recipe = tomllib.loads((Path(__file__).resolve().parents[1] / "configs" / "small.toml").read_text())
    sim = SimConfig.from_dict({**recipe["data"]["sim"], "users": 300, "ads": 200, "advertisers": 40})
    mcfg = from_dict(ModelConfig, recipe["model"], "model")
    mcfg.gem.kernel = "triton"
    schema = sim_schema(sim)
    torch.manual_seed(0)
    model = build_model(schema, mcfg)
    kernels = {type(m).__name__: m.kernel for m in model.modules() if hasattr(m, "kernel")}
    assert kernels.pop("WukongLayer") is Kernel.TRITON and set(kernels.values()) == {Kernel.FUSED}
    batch = random_batch(schema, 12, seed=5, max_seq_len=5)
    results = []
    for kernel in ("fused", "triton"):
        use_kernel(model, kernel)
        model.zero_grad()
        out = model(batch)
        loss = masked_bce(out.logits, batch.labels, batch.label_mask)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((out.logits.detach(), loss.detach(), grads))
    assert any(isinstance(m, WukongLayer) for m in model.modules())
    (lf, sf, gf), (lt, st, gt) = results
    torch.testing.assert_close(lt, lf, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(st, sf, atol=ATOL, rtol=RTOL)
    assert set(gf) == set(gt)
    for name in gf:
        torch.testing.assert_close(gt[name], gf[name], atol=ATOL, rtol=RTOL)
