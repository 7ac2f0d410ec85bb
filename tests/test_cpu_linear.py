"""train.cpu_linear: the nn.Linear -> OneDNNLinear swap, its fallbacks, and the auto choice."""

import json
import os

import pytest
import torch
from torch import nn

from opengem.config import ConfigError
from opengem.model.wukong import WukongConfig, WukongLayer
from opengem.ops.kernel import Kernel
from opengem.ops.onednn import onednn_linear
from opengem.train import cpu_linear
from opengem.train.config import load_run_config
from opengem.train.cpu_linear import OneDNNLinear, apply_cpu_linear, resolve_cpu_linear
from twin_helpers import needs_onednn

CPU = torch.device("cpu")


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8), nn.Linear(8, 2))


@needs_onednn
def test_swap_keeps_parameters_and_state_dict_and_computes_the_same():
    ref, model = mlp(), mlp()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    info = apply_cpu_linear(model, "onednn", CPU)
    assert info == {"kernel": "onednn", "layers": 3, "ops": 0}
    assert all(type(m) is OneDNNLinear for m in model if isinstance(m, nn.Linear))
    assert model.state_dict().keys() == before.keys()
    x = torch.randn(512, 64)
    xr = x.clone().requires_grad_()
    x.requires_grad_()
    model(x).square().sum().backward()
    ref(xr).square().sum().backward()
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-4, msg=name)


@needs_onednn
def test_onednn_linear_takes_the_default_path_where_onednn_cannot_or_should_not_run(monkeypatch):
    calls = []
    real = onednn_linear.linear
    monkeypatch.setattr(onednn_linear, "linear", lambda *a: calls.append(a[0].shape) or real(*a))
    layer = OneDNNLinear(64, 256)
    layer(torch.randn(512, 64))  # 8.4M MACs: oneDNN
    assert calls == [torch.Size([512, 64])]
    layer(torch.randn(2, 64))  # 33k MACs < MIN_MACS: F.linear
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer(torch.randn(512, 64)).dtype == torch.bfloat16  # autocast's bf16 path, not fp32 oneDNN
    layer.double()(torch.randn(512, 64, dtype=torch.float64))
    assert len(calls) == 1


@needs_onednn
def test_swap_reaches_the_wukong_fused_mlp():
    layer = WukongLayer(6, 8, 4, 2, WukongConfig(n_fm=4, n_lin=2, k=4, mlp_dims=[32]))
    info = apply_cpu_linear(layer, "onednn", CPU)
    assert info["ops"] == 1 and layer.linear_kernel is Kernel.ONEDNN


def test_pytorch_choice_and_non_cpu_devices_change_nothing():
    model = mlp()
    assert apply_cpu_linear(model, "pytorch", CPU) == {"kernel": "pytorch", "layers": 0, "ops": 0}
    assert all(type(m) is nn.Linear for m in model if isinstance(m, nn.Linear))
    assert resolve_cpu_linear("onednn", torch.device("meta")) == "pytorch"
    with pytest.raises(ValueError, match="not one of"):
        resolve_cpu_linear("mkl", CPU)


@pytest.mark.parametrize("speedup,chosen", [(2.2, "onednn"), (1.05, "pytorch"), (0.0, "pytorch")])
def test_auto_follows_the_measured_speedup(monkeypatch, speedup, chosen):
    monkeypatch.setattr(cpu_linear, "onednn_speedup", lambda threads: speedup)
    assert resolve_cpu_linear("auto", CPU) == chosen


@needs_onednn
def test_the_probe_measures_a_positive_ratio():
    assert cpu_linear.onednn_speedup(torch.get_num_threads()) > 0


def test_config_refuses_an_unknown_choice():
    with pytest.raises(ConfigError, match="train.cpu_linear"):
        load_run_config("configs/tiny.toml", ["train.cpu_linear=mkl"])


@needs_onednn
def test_fused_attention_kv_products_through_onednn_match_the_default():
    """The fused attention's K/V products (weight-half views of the kv layer) take linear_kernel too."""
    from opengem.model.sequence import MultiHeadAttention, use_kernel

    torch.manual_seed(0)
    ref = use_kernel(MultiHeadAttention(32, num_heads=2, use_rope=True), "fused")
    one = use_kernel(MultiHeadAttention(32, num_heads=2, use_rope=True), "fused")
    one.load_state_dict(ref.state_dict())
    assert apply_cpu_linear(one, "onednn", CPU)["ops"] == 1 and one.linear_kernel is Kernel.ONEDNN
    q, k = torch.randn(64, 8, 32), torch.randn(64, 40, 32)
    mask = torch.arange(40)[None, :] < torch.randint(0, 41, (64, 1))  # some rows with no key at all
    outs = []
    for m in (ref, one):
        qq, kk = q.clone().requires_grad_(), k.clone().requires_grad_()
        out = m(qq, kk, mask)
        out.square().sum().backward()
        outs.append((out.detach(), qq.grad, kk.grad, m.kv.weight.grad))
    for a, b in zip(*outs):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


@needs_onednn
def test_a_run_decides_auto_once_and_its_resume_keeps_the_choice(monkeypatch, tmp_path):
    """On a host where the probe's answer flips between processes, a resumed run keeps the kernel it
    trained on (RUN/cpu_linear.json); a fresh run takes the machine's answer, or measures again once the
    machine's record is gone, and records its own."""
    monkeypatch.setattr(cpu_linear, "onednn_speedup", lambda threads: 2.2)
    assert cpu_linear.run_cpu_linear("auto", CPU, tmp_path, resume=False) == "onednn"
    assert cpu_linear.recorded_kernel(tmp_path) == "onednn"
    monkeypatch.setattr(cpu_linear, "onednn_speedup", lambda threads: 1.0)
    assert cpu_linear.run_cpu_linear("auto", CPU, tmp_path, resume=True) == "onednn"
    assert cpu_linear.run_cpu_linear("auto", CPU, tmp_path, resume=False) == "onednn"  # the machine's
    cpu_linear.machine_cache_path().unlink()
    assert cpu_linear.run_cpu_linear("auto", CPU, tmp_path, resume=False) == "pytorch"
    assert cpu_linear.recorded_kernel(tmp_path) == "pytorch"
    monkeypatch.setattr(cpu_linear, "onednn_speedup", lambda threads: 2.2)
    assert cpu_linear.run_cpu_linear("auto", CPU, tmp_path, resume=True) == "pytorch"


@pytest.mark.parametrize("record", ['{"kernel": "mkl"}', "not json", "[1, 2]", ""])
def test_an_unusable_record_is_measured_again(monkeypatch, tmp_path, record):
    (tmp_path / cpu_linear.RECORD).write_text(record)
    monkeypatch.setattr(cpu_linear, "onednn_speedup", lambda threads: 1.0)
    assert cpu_linear.recorded_kernel(tmp_path) is None
    assert cpu_linear.run_cpu_linear("auto", CPU, tmp_path, resume=True) == "pytorch"
    assert cpu_linear.recorded_kernel(tmp_path) == "pytorch"


def test_a_record_of_onednn_without_onednn_is_measured_again(monkeypatch, tmp_path):
    (tmp_path / cpu_linear.RECORD).write_text('{"kernel": "onednn"}')
    monkeypatch.setattr(onednn_linear, "available", lambda: False)
    monkeypatch.setattr(cpu_linear, "onednn_speedup", lambda threads: 0.0)
    assert cpu_linear.run_cpu_linear("auto", CPU, tmp_path, resume=True) == "pytorch"


def test_an_explicit_choice_is_not_recorded(tmp_path):
    assert cpu_linear.run_cpu_linear("pytorch", CPU, tmp_path, resume=False) == "pytorch"
    assert not (tmp_path / cpu_linear.RECORD).exists()


def test_auto_measures_once_per_machine_threads_and_torch(monkeypatch):
    """Two fresh runs of one config on one machine train on the same kernel: the first measurement is kept
    (per CPU model, thread count and torch) and every later process takes it."""
    calls = []

    def probe(threads):
        calls.append(threads)
        return 2.2 if len(calls) == 1 else 1.0  # a later probe would flip the choice

    monkeypatch.setattr(cpu_linear, "onednn_speedup", probe)
    first = cpu_linear.machine_speedup(1)
    assert first[0] == 2.2 and first[1].startswith("measured, kept in")
    again = cpu_linear.machine_speedup(1)
    assert again[0] == 2.2 and again[1].startswith("recorded for this machine") and calls == [1]
    assert cpu_linear.machine_speedup(2)[0] == 1.0 and calls == [1, 2]  # another thread count: its own
    table = json.loads(cpu_linear.machine_cache_path().read_text())
    assert sorted(v["speedup"] for v in table.values()) == [1.0, 2.2]
    assert all(torch.__version__ in k for k in table)
    if onednn_linear.available():
        assert resolve_cpu_linear("auto", CPU) in ("onednn", "pytorch")


@pytest.mark.parametrize("content", ["not json", "[1]", '{"x": {"speedup": "fast"}}'])
def test_an_unusable_machine_record_is_measured_again(monkeypatch, content):
    path = cpu_linear.machine_cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    monkeypatch.setattr(cpu_linear, "onednn_speedup", lambda threads: 1.7)
    assert cpu_linear.machine_speedup(1) == (1.7, f"measured, kept in {path}")
    assert cpu_linear.machine_speedup(1)[0] == 1.7


def test_a_machine_record_that_cannot_be_kept_is_measured_each_time(monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("OPENGEM_CPU_LINEAR_CACHE", str(blocker / "sub" / "cpu_linear.json"))
    monkeypatch.setattr(cpu_linear, "onednn_speedup", lambda threads: 0.9)
    assert cpu_linear.machine_speedup(1) == (0.9, "measured (not kept)")


def test_processes_started_together_take_one_answer(tmp_path):
    """A study's workers start side by side: each probe here answers differently and slowly, yet every
    process gets the first one's answer (the lock serialises the measurement)."""
    import subprocess
    import sys

    code = ("import sys, time\n"
            "from opengem.train import cpu_linear\n"
            "def probe(threads):\n"
            "    time.sleep(0.3)\n"
            "    return float(sys.argv[1])\n"
            "cpu_linear.onednn_speedup = probe\n"
            "print(cpu_linear.machine_speedup(1)[0])\n")
    env = {**os.environ, "OPENGEM_CPU_LINEAR_CACHE": str(tmp_path / "cpu_linear.json")}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(v)], stdout=subprocess.PIPE, text=True,
                              env=env) for v in (1.0, 2.0, 3.0)]
    answers = {float(p.communicate(timeout=120)[0]) for p in procs}
    assert len(answers) == 1 and answers <= {1.0, 2.0, 3.0}
