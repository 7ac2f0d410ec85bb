"""ModelConfig and build_model: one place that turns a config name into a model.

Every model built here has ``forward(batch) -> ModelOutput`` and ``flops_per_example(seq_len)``, so the
trainer, evaluator, benchmarks and transfer code never branch on the model kind.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from torch import nn

from opengem.config import ConfigError
from opengem.data.schema import FeatureSchema
from opengem.model.baselines import DIN, DLRM, LR, DCNv2, DCNv2Config, DINConfig, DLRMConfig, LRConfig
from opengem.model.embedding import EmbeddingConfig, check_at_least, check_choice, check_widths
from opengem.model.gem import GEM, GEMConfig
from opengem.model.heads import HEAD_CONTEXTS, HeadConfig

MODEL_NAMES = ("gem", "wukong", "dlrm", "dcnv2", "din", "lr")


@dataclass
class ModelConfig:
    name: str = "gem"  # gem | wukong | dlrm | dcnv2 | din | lr (logistic regression)
    embedding: EmbeddingConfig = field(default_factory=EmbeddingConfig)
    head: HeadConfig = field(default_factory=HeadConfig)
    gem: GEMConfig = field(default_factory=GEMConfig)
    dlrm: DLRMConfig = field(default_factory=DLRMConfig)
    dcnv2: DCNv2Config = field(default_factory=DCNv2Config)
    din: DINConfig = field(default_factory=DINConfig)
    lr: LRConfig = field(default_factory=LRConfig)


def build_model(schema: FeatureSchema, cfg: ModelConfig, where: str = "model") -> nn.Module:
    """The model ``cfg`` names, for ``schema``.

    A config that cannot build a model (an unknown name, a size below its minimum) is a ConfigError
    naming the key under ``where``, the config section ``cfg`` was read from (``model.embedding.d``).
    """
    try:
        if cfg.name not in MODEL_NAMES:
            raise ConfigError(f"name: unknown model {cfg.name!r}; choose one of {', '.join(MODEL_NAMES)}")
        check_widths("head.hidden", cfg.head.hidden)
        check_at_least("head.adapter_dim", cfg.head.adapter_dim, 0)
        check_choice("head.context", cfg.head.context, HEAD_CONTEXTS)
        return _build(schema, cfg)
    except ConfigError as e:
        raise ConfigError(f"{where}.{e}" if where else str(e)) from e


def _build(schema: FeatureSchema, cfg: ModelConfig) -> nn.Module:
    if cfg.name == "dlrm":
        return DLRM(schema, cfg.embedding, cfg.head, cfg.dlrm)
    if cfg.name == "dcnv2":
        return DCNv2(schema, cfg.embedding, cfg.head, cfg.dcnv2)
    if cfg.name == "din":
        return DIN(schema, cfg.embedding, cfg.head, cfg.din)
    if cfg.name == "lr":
        return LR(schema, cfg.embedding, cfg.head, cfg.lr)
    if cfg.name in ("gem", "wukong"):
        gem_cfg = cfg.gem
        if cfg.name == "wukong":
            # Wukong = GEM ignoring sequence groups, without cross-layer attention
            gem_cfg = dataclasses.replace(
                gem_cfg,
                use_sequences=False,
                wukong=dataclasses.replace(gem_cfg.wukong, cross_layer_attention=False),
            )
        return GEM(schema, cfg.embedding, cfg.head, gem_cfg)
    raise AssertionError(f"MODEL_NAMES lists {cfg.name!r} but build_model cannot build it")
