"""Vertical models train through the one Trainer, so the run's [train] knobs reach them."""

from __future__ import annotations

import pytest
import torch

from opengem.data.dataset import Dataset
from opengem.data.sim_config import SimConfig
from opengem.data.simulate import simulate
from opengem.model.registry import ModelConfig
from opengem.train.config import TrainConfig
from opengem.transfer.vertical import VMConfig, VMSchemaConfig, build_vm_dataset, derive_vm_schema
from opengem.transfer.vm_train import ArmConfig, ProgressiveStudent


@pytest.fixture(scope="module")
def vm_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("vm")
    src = root / "sim"
    simulate(SimConfig.from_dict({"rows": 1200, "days": 2, "surfaces": 2, "users": 200, "ads": 100,
                                        "advertisers": 20, "topics": 10, "seq_mean": 6.0, "seq_max": 8,
                                        "recent_k": 2, "emb_dim": 8}), src)
    fm_schema = Dataset(src).schema
    vm_schema = derive_vm_schema(fm_schema, VMSchemaConfig(max_len=4), name="vm_test")
    out = build_vm_dataset(src, [0], root / "vm", None, None, vm_schema)
    return vm_schema, out


def _autocast_seen(vm_data, precision: str) -> list[tuple[bool, torch.dtype]]:
    schema, data = vm_data
    model = ModelConfig(name="dlrm")
    model.embedding.d = 8
    t = TrainConfig(precision=precision, warmup_steps=1, threads=1)
    st = ProgressiveStudent(schema, VMConfig(model=model), ArmConfig(), t, str(data), torch.device("cpu"),
                            None, batch_size=64)
    seen: list[tuple[bool, torch.dtype]] = []
    st.plain.register_forward_hook(
        lambda *_: seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"))))
    try:
        st.train_window(st.ds.partitions()[0])
    finally:
        st.close()
    assert st.steps > 0 and len(seen) == st.steps
    return seen


def test_a_vertical_model_with_bf16_precision_trains_under_autocast(vm_data):
    assert all(on and dtype == torch.bfloat16 for on, dtype in _autocast_seen(vm_data, "bf16"))


def test_a_vertical_model_in_fp32_trains_without_autocast(vm_data):
    assert not any(on for on, _ in _autocast_seen(vm_data, "fp32"))


@pytest.mark.parametrize("key", ["train.eval_every=5", "train.checkpoint_every=10", "train.epochs=3"])
def test_transfer_config_refuses_train_keys_its_vms_never_read(key):
    from opengem.config import ConfigError
    from opengem.transfer.experiment_config import load_experiment_config

    with pytest.raises(ConfigError, match=f"{key.split('=')[0]} = .*do not read it"):
        load_experiment_config("configs/transfer-tiny.toml", [key])


def test_transfer_config_keeps_the_train_keys_vms_do_read():
    from opengem.transfer.experiment_config import load_experiment_config

    cfg = load_experiment_config("configs/transfer-tiny.toml", ["train.precision=\"bf16\"", "train.lr=0.01"])
    assert cfg.train.precision == "bf16" and cfg.train.lr == 0.01


def _fm_sharing_student(vm_data, budget: int, share_encoder: bool):
    """SeedRun.student's budget check on a VM whose arm runs the FM's sequence encoder at serving time."""
    from types import SimpleNamespace

    from opengem.model.registry import build_model
    from opengem.transfer.experiment_config import ExperimentConfig
    from opengem.transfer.seed_run import SeedRun

    schema, data = vm_data
    fm_cfg = ModelConfig(name="gem")
    fm_cfg.embedding.d = 8
    fm_cfg.gem.sequence.kind = "full"
    fm_cfg.gem.sequence.full_layers = 1
    fm = build_model(Dataset(data.parent / "sim").schema, fm_cfg)
    cfg = ExperimentConfig()
    cfg.vm.model = ModelConfig(name="dlrm")
    cfg.vm.model.embedding.d = 8
    cfg.vm.flops_budget = budget
    cfg.train.threads = 1
    fake = SimpleNamespace(cfg=cfg, seed=0, device=torch.device("cpu"), pg=None)
    arm = ArmConfig("param_sharing", share="lowlr", share_sequence_encoder=share_encoder)
    st = SeedRun.student(fake, arm, schema, data, fm=fm)
    st.close()
    return st


def test_the_serving_budget_bounds_the_vms_own_model_not_the_fm_blocks_an_arm_shares(vm_data):
    """Parameter sharing runs the FM's sequence encoder at serving time on purpose: the experiment reports it
    as added compute (no R, on the Pareto plot) instead of refusing it, while the VM itself must fit."""
    from opengem.config import ConfigError

    own = _fm_sharing_student(vm_data, 0, share_encoder=False).own_flops
    st = _fm_sharing_student(vm_data, own, share_encoder=True)
    assert st.own_flops == own < st.serving_flops
    with pytest.raises(ConfigError, match="arm 'param_sharing' needs"):
        _fm_sharing_student(vm_data, own - 1, share_encoder=True)
