"""The config of ``opengem distill``: a vertical model (VM) and the transfer methods it trains with.

One TOML file (configs/distill-example.toml) holds what the VM is (``[vm]``: model, schema projection,
serving budget; ``surfaces``), how it trains (``[data]`` partition specs and batch size, ``[train]``: the
same keys as ``opengem train``) and which transfer methods are on (``[distill]``). Every method is a
switch, so any combination composes; all off trains the plain baseline VM. The FM, the dataset and the
output folder come from the command line, because one VM recipe is meant to be reused with many FM runs.

Why a file of its own and not a ``[distill]`` section in a RunConfig: ``opengem evaluate``/``predict``
rebuild a run from RUN/config.toml, which must describe the *served* model only (the auxiliary head and
the Student Adapter exist at training time only), so distill writes that RunConfig and keeps this one
beside it as RUN/distill.toml.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from opengem.config import ConfigError, load_config, require_finite
from opengem.data.schema import read_toml
from opengem.train.config import DataConfig, RunConfig, TrainConfig
from opengem.transfer.adapter import AdapterConfig
from opengem.transfer.generate import EMBEDDINGS
from opengem.transfer.vertical import VMConfig
from opengem.transfer.vm_train import ArmConfig

SHARING_MODES = ("none", "init", "lowlr", "frozen")


@dataclass
class KDSettings:
    weight: float = 0.0  # soft-label BCE weight (0 = no soft-label KD)
    temperature: float = 1.0
    mse_weight: float = 0.0  # logit MSE weight


@dataclass
class StudentAdapterSettings(AdapterConfig):
    """ExFM's Student Adapter (opengem.transfer.adapter) plus its switch."""

    enabled: bool = False


@dataclass
class DistillSettings:
    kd: KDSettings = field(default_factory=KDSettings)
    # ExFM Auxiliary Head: the serving head learns from labels only, a training-time head on the trunk
    # learns from the FM (gradient into the trunk scaled by aux_grad_scale, soft labels by aux_label_scale)
    aux_head: bool = False
    aux_grad_scale: float = 1.0
    aux_label_scale: float = 1.0
    student_adapter: StudentAdapterSettings = field(default_factory=StudentAdapterSettings)
    fm_embeddings: list[str] = field(default_factory=list)  # as VM dense features: user | ad | trunk
    param_sharing: str = "none"  # none | init | lowlr | frozen: FM embedding tables copied into the VM
    sharing_lr_scale: float = 0.1  # lr multiplier of the shared parameters under "lowlr"
    hierarchical: str = ""  # a domain FM run (same dataset schema): the VM distils from it, not from --fm
    lag: int = 0  # staleness: use the FM version this many versions older than the newest allowed one


@dataclass
class DistillConfig:
    data: DataConfig = field(default_factory=DataConfig)  # partition specs and batch size (path: --data)
    vm: VMConfig = field(default_factory=VMConfig)
    surfaces: list[str] = field(default_factory=list)  # the surfaces the VM serves ([] = all)
    train: TrainConfig = field(default_factory=TrainConfig)
    distill: DistillSettings = field(default_factory=DistillSettings)

    def validate(self) -> None:
        """Refuse a switch combination that cannot work, naming the key (before anything is trained)."""
        d = self.distill
        require_finite((d, "distill."), (self.vm, "vm."))
        if d.aux_grad_scale < 0 or d.aux_label_scale < 0:
            raise ConfigError("distill.aux_grad_scale / distill.aux_label_scale: must be >= 0")
        if d.student_adapter.enabled and (d.student_adapter.steps < 1 or d.student_adapter.lr <= 0):
            raise ConfigError(f"distill.student_adapter: steps >= 1 and lr > 0 when enabled (got steps "
                              f"{d.student_adapter.steps}, lr {d.student_adapter.lr})")
        if self.vm.schema.max_len < 0:
            raise ConfigError(f"vm.schema.max_len: >= 0 (0 drops the sequences; got "
                              f"{self.vm.schema.max_len})")
        if self.data.path or self.data.sim:
            raise ConfigError("data.path / data.sim: opengem distill reads the dataset named by --data (the "
                              "FM's schema); remove them from the VM recipe")
        if d.kd.weight < 0 or d.kd.mse_weight < 0:
            raise ConfigError("distill.kd.weight / distill.kd.mse_weight: must be >= 0")
        if d.kd.temperature <= 0:
            raise ConfigError(f"distill.kd.temperature: must be > 0 (got {d.kd.temperature})")
        kd_on = d.kd.weight > 0 or d.kd.mse_weight > 0
        for key, on in (("aux_head", d.aux_head), ("student_adapter.enabled", d.student_adapter.enabled),
                        ("hierarchical", bool(d.hierarchical))):
            if on and not kd_on:
                raise ConfigError(f"distill.{key}: distils from the FM, so it needs distill.kd.weight or "
                                  "distill.kd.mse_weight > 0")
        if d.param_sharing not in SHARING_MODES:
            raise ConfigError(f"distill.param_sharing: one of {', '.join(SHARING_MODES)} "
                              f"(got {d.param_sharing!r})")
        bad = [e for e in d.fm_embeddings if e not in EMBEDDINGS]
        if bad or len(set(d.fm_embeddings)) != len(d.fm_embeddings):
            raise ConfigError(f"distill.fm_embeddings: distinct names from {', '.join(EMBEDDINGS)} "
                              f"(got {d.fm_embeddings})")
        if d.lag < 0:
            raise ConfigError(f"distill.lag: must be >= 0 (got {d.lag})")
        if d.sharing_lr_scale < 0:
            raise ConfigError(f"distill.sharing_lr_scale: must be >= 0 (got {d.sharing_lr_scale})")
        self.run_config("").validate()

    def run_config(self, data_path: str) -> RunConfig:
        """The RunConfig of the served VM: what RUN/config.toml holds for evaluate, predict and report."""
        return RunConfig(data=dataclasses.replace(self.data, path=data_path), model=self.vm.model,
                         train=self.train)

    def arm(self) -> ArmConfig:
        """The switches as the transfer experiment's ArmConfig (its KD losses are reused as they are)."""
        d = self.distill
        return ArmConfig(name="distill", kd_weight=d.kd.weight, kd_temperature=d.kd.temperature,
                         kd_mse_weight=d.kd.mse_weight, aux_head=d.aux_head, aux_grad_scale=d.aux_grad_scale,
                         aux_label_scale=d.aux_label_scale, adapter=d.student_adapter.enabled,
                         fm_embeddings=bool(d.fm_embeddings), share=d.param_sharing,
                         share_lr_scale=d.sharing_lr_scale)


def load_distill_config(path: str | Path, overrides: list[str] | None = None) -> DistillConfig:
    """Read a VM recipe; a file without ``[vm]`` (an ``opengem train`` recipe, say) is refused as such."""
    raw = read_toml(path, ConfigError, "config")
    if "vm" not in raw:
        extra = " (it looks like an `opengem train` recipe: it has [model])" if "model" in raw else ""
        raise ConfigError(f"--vm-config {path}: not a vertical-model config: it has no [vm] section{extra}; "
                          "describe the VM in [vm.model] and [vm.schema] (see configs/distill-example.toml)")
    cfg = load_config(DistillConfig, path, overrides)
    cfg.validate()
    return cfg
