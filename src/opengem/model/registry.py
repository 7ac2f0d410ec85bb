"""ModelConfig and build_model: one place that turns a config name into a model.

Every model built here has ``forward(batch) -> ModelOutput`` and ``flops_per_example(seq_len)``, so the
trainer, evaluator, benchmarks and transfer code never branch on the model kind.

GEM lives in ``opengem.model.gem``; it is imported lazily in ``build_model`` so the baselines build
without it. ``GEMConfig`` is imported at module level when available because ``ModelConfig`` needs the
type for strict TOML loading; without gem.py a field-less placeholder stands in.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from torch import nn

from opengem.data.schema import FeatureSchema
from opengem.model.baselines import DIN, DLRM, DCNv2, DCNv2Config, DINConfig, DLRMConfig
from opengem.model.embedding import EmbeddingConfig
from opengem.model.heads import HeadConfig

try:
    from opengem.model.gem import GEMConfig
except ModuleNotFoundError as e:  # only a missing gem.py is tolerated; a broken one must fail loudly
    if e.name != "opengem.model.gem":
        raise

    @dataclass
    class GEMConfig:  # type: ignore[no-redef]
        """Placeholder used while opengem.model.gem is absent; build_model('gem') then fails clearly."""


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
        try:
            from opengem.model.gem import GEM
        except ModuleNotFoundError as e:
            if e.name != "opengem.model.gem":
                raise
            raise ValueError(
                f"model.name = {cfg.name!r} needs opengem.model.gem, which is not installed"
            ) from None
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
