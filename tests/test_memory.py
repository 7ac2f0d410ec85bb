"""Memory savers: AC gives the same gradients, FP8 round-trips within its precision and saves bytes,
bf16 / FP8 move the loss only slightly, and the trainer runs with all of them on."""

import copy
import json
from pathlib import Path

import pytest
import torch

from opengem.config import ConfigError
from opengem.data.random_batch import random_batch
from opengem.data.schema import FeatureSchema
from opengem.model.heads import masked_bce
from opengem.model.registry import build_model
from opengem.train.config import load_run_config
from opengem.train.memory import (
    SavedTensorStats,
    apply_activation_checkpointing,
    autocast,
    fp8_pack,
    fp8_saved_activations,
    fp8_unpack,
    slow_bf16_warning,
)

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.toml"
SCHEMA = FeatureSchema.load(ROOT / "configs" / "schemas" / "tiny.toml")


def _model(seed=0, overrides=()):
    cfg = load_run_config(TINY, list(overrides))
    torch.manual_seed(seed)
    return build_model(SCHEMA, cfg.model)


def _loss(model, batch, precision="fp32", fp8="off", stats=None):
    weights = torch.ones(len(SCHEMA.tasks))
    ctx = fp8_saved_activations(fp8, min_numel=64, stats=stats)
    with autocast(precision, torch.device("cpu")), ctx:
        out = model(batch)
    return masked_bce(out.logits.float(), batch.labels, batch.label_mask, weights)


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("mode,rel", [("e4m3", 2.0**-4), ("e5m2", 2.0**-3)])
def test_fp8_round_trip_within_format_precision(mode, rel):
    fp8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[mode]
    g = torch.Generator().manual_seed(0)
    # magnitudes within 2^6 of the max stay normal numbers after scaling: relative error <= half an ulp
    x = (torch.rand(64, 33, generator=g) + 0.02) * torch.sign(torch.randn(64, 33, generator=g)) * 7.0
    p = fp8_pack(x, fp8)
    assert p.data.dtype == fp8 and p.data.element_size() == 1
    y = fp8_unpack(p)
    assert y.dtype == x.dtype and y.shape == x.shape
    err = ((y - x).abs() / x.abs()).max().item()
    assert err <= rel * 1.0001, err
    assert (y - x).abs().max() > 0  # it really was rounded
    # the largest value maps to the format's max: no overflow, the max survives exactly-ish
    assert torch.isfinite(y).all() and abs(y.abs().max() - x.abs().max()) <= rel * x.abs().max()


def test_fp8_unpack_keeps_strides_and_zero():
    base = torch.randn(8, 16)
    view = base[:, ::2]  # non-contiguous: compiled backward graphs assert saved strides
    y = fp8_unpack(fp8_pack(view, torch.float8_e4m3fn))
    assert y.stride() == view.stride() and torch.allclose(y, view, rtol=0.07, atol=1e-6)
    z = fp8_unpack(fp8_pack(torch.zeros(4, 4), torch.float8_e4m3fn))
    assert torch.equal(z, torch.zeros(4, 4))


def test_activation_checkpointing_same_gradients():
    batch = random_batch(SCHEMA, 32, seed=1)
    ref = _model()
    ac = copy.deepcopy(ref)
    names = apply_activation_checkpointing(ac, "layer")
    assert names and any("interformer.layers" in n for n in names)
    assert not any(a != b and b.startswith(a + ".") for a in names for b in names)  # outermost only
    assert [n for n, _ in ac.named_parameters()] == [n for n, _ in ref.named_parameters()]
    _loss(ref, batch).backward()
    la = _loss(ac, batch)
    la.backward()
    gr, ga = _grads(ref), _grads(ac)
    assert gr.keys() == ga.keys() and gr
    for n in gr:
        torch.testing.assert_close(ga[n], gr[n], rtol=1e-5, atol=1e-7, msg=n)
    with torch.no_grad():  # evaluation goes straight through
        assert torch.equal(ac(batch).logits, ref(batch).logits)


def test_fp8_saved_activations_cut_bytes_and_keep_gradients():
    batch = random_batch(SCHEMA, 64, seed=2)
    m = _model()
    off, on = SavedTensorStats(), SavedTensorStats()
    _loss(m, batch, stats=off).backward()
    g_ref = torch.cat([g.flatten() for g in _grads(m).values()])
    m.zero_grad()
    _loss(m, batch, fp8="e4m3", stats=on).backward()
    g_fp8 = torch.cat([g.flatten() for g in _grads(m).values()])
    assert off.packed == 0 and off.bytes_kept == off.bytes_in
    assert on.packed > 0 and on.bytes_in == off.bytes_in
    assert on.bytes_kept < 0.6 * off.bytes_kept, (on, off)
    cos = torch.nn.functional.cosine_similarity(g_ref, g_fp8, dim=0).item()
    assert 0.98 < cos < 1.0, cos  # changed, but only slightly


@pytest.mark.parametrize("precision,fp8", [("bf16", "off"), ("fp32", "e4m3"), ("fp32", "e5m2")])
def test_bf16_and_fp8_change_the_loss_only_slightly(precision, fp8):
    batches = [random_batch(SCHEMA, 48, seed=10 + i) for i in range(3)]

    def run(prec, mode):
        m = _model()
        opt = torch.optim.Adam(m.parameters(), lr=3e-3)
        losses = []
        for b in batches:
            loss = _loss(m, b, prec, mode)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss))
        return torch.tensor(losses)

    ref, alt = run("fp32", "off"), run(precision, fp8)
    rel = ((alt - ref).abs() / ref).max().item()
    assert 0 < rel < 0.05, rel


def test_config_rejects_bad_values():
    for key, val in [("train.precision", '"fp16"'), ("train.fp8_saved_activations", '"e3m4"'),
                     ("train.activation_checkpointing", '"full"'), ("train.compile_backend", '"tvm"')]:
        with pytest.raises(ConfigError, match=key):
            load_run_config(TINY, [f"{key}={val}"])


@pytest.mark.parametrize("avx512_bf16, amx, warned", [(False, False, True), (True, False, False),
                                                       (False, True, False)])
def test_bf16_warning_only_without_bf16_matrix_units(monkeypatch, avx512_bf16, amx, warned):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    cpu = torch.device("cpu")
    msg = slow_bf16_warning("bf16", cpu)
    assert (msg is not None) == warned
    if warned:
        assert "train.precision" in msg and "AVX-512-BF16" in msg and "AMX" in msg
    assert slow_bf16_warning("fp32", cpu) is None  # an fp32 run is never told about bf16


def test_bf16_warning_on_a_gpu_without_native_bf16(monkeypatch):
    """torch's own check decides on CUDA (no device needed: the check is all the warning reads)."""
    for native in (False, True):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True, n=native: n)
        msg = slow_bf16_warning("bf16", torch.device("cuda"))
        assert (msg is None) == native
        if msg is not None:
            assert "cuda device has no native bf16" in msg and "session 51" not in msg


def test_bf16_warning_keeps_quiet_when_torch_cannot_say(monkeypatch):
    """The probes are private torch API: without them the answer is unknown, and unknown is no warning."""
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported")
    assert slow_bf16_warning("bf16", torch.device("cpu")) is None


def test_bf16_run_on_a_cpu_without_bf16_units_records_the_warning(tmp_path, monkeypatch, capsys):
    from opengem.train.trainer import train

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    cfg = load_run_config(TINY, ["train.progress=false", "train.steps=1", "train.final_eval=false",
                                 'train.precision="bf16"', "data.sim.rows=1200"])
    s = train(cfg, tmp_path)
    assert any("AVX-512-BF16" in w for w in s["warnings"])
    assert "opengem train: warning: train.precision" in capsys.readouterr().err


@pytest.mark.slow
def test_trainer_runs_with_every_saver(tmp_path):
    from opengem.train.trainer import train

    cfg = load_run_config(TINY, ["train.progress=false", "train.steps=3", "train.final_eval=false",
                                 'train.activation_checkpointing="layer"', 'train.precision="bf16"',
                                 'train.fp8_saved_activations="e4m3"', "data.sim.rows=1200"])
    s = train(cfg, tmp_path)
    assert s["steps"] == 3 and s["last_loss"] == s["last_loss"]  # finite, not NaN
    assert s["memory"] == {"activation_checkpointing": "layer", "precision": "bf16",
                           "fp8_saved_activations": "e4m3"}
    info = json.loads((tmp_path / "train_summary.json").read_text())["parallel"]
    assert info["activation_checkpointing"]
