"""ModelConfig and build_model: one place that turns a config name into a model.

Every model built here has ``forward(batch) -> ModelOutput`` and ``flops_per_example(seq_len)``, so the
trainer, evaluator, benchmarks and transfer code never branch on the model kind.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from torch import nn

from opengem.data.schema import FeatureSchema
from opengem.model.baselines import DIN, DLRM, DCNv2, DCNv2Config, DINConfig, DLRMConfig
from opengem.model.embedding import EmbeddingConfig
from opengem.model.gem import GEM, GEMConfig
from opengem.model.heads import HeadConfig

MODEL_NAMES = ("gem", "wukong", "dlrm", "dcnv2", "din")


@dataclass
class ModelConfig:
    name: str = "gem"  # gem | wukong | dlrm | dcnv2 | din
    embedding: EmbeddingConfig = field(default_factory=EmbeddingConfig)
    head: HeadConfig = field(default_factory=HeadConfig)
    gem: GEMConfig = field(default_factory=GEMConfig)
    dlrm: DLRMConfig = field(default_factory=DLRMConfig)
    dcnv2: DCNv2Config = field(default_factory=DCNv2Config)
    din: DINConfig = field(default_factory=DINConfig)


def build_model(schema: FeatureSchema, cfg: ModelConfig) -> nn.Module:
    if cfg.name == "dlrm":
        return DLRM(schema, cfg.embedding, cfg.head, cfg.dlrm)
    if cfg.name == "dcnv2":
        return DCNv2(schema, cfg.embedding, cfg.head, cfg.dcnv2)
    if cfg.name == "din":
        return DIN(schema, cfg.embedding, cfg.head, cfg.din)
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
    raise ValueError(f"model.name: unknown model {cfg.name!r} (known: {', '.join(MODEL_NAMES)})")
