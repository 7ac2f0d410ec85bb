"""Vertical models (VMs): small, single-surface production models derived from the FM's schema.

A VM serves one surface (or, for a domain FM, a group of surfaces) and one or two objectives, under a
serving budget in FLOPs/example. Its schema is the FM schema narrowed:

- fewer features: the sparse/dense features and sequence fields named in ``VMSchemaConfig``;
- smaller tables: vocabularies capped at ``vocab_cap`` with ``on_oov = "hash"`` (the loader maps an id
  to ``id mod vocab``), except tables listed in ``full_vocab_tables`` (needed to share FM tables);
- shorter histories: ``max_len`` with ``on_overflow = "truncate"`` (the loader keeps the newest events);
- FM embeddings as extra dense features ``fm_<name>_<i>`` when representation transfer is on.

The VM dataset (:func:`build_vm_dataset`) is the FM dataset filtered to the VM's surfaces, with FM
embedding columns joined in, written per partition. The model (:class:`VerticalModel`) is any registry
baseline (DLRM / DCNv2 / DIN) plus an optional auxiliary distillation head on the shared trunk; only the
serving head's logits are served, so the aux head costs no serving FLOPs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch import nn

from opengem.config import ConfigError
from opengem.data.batch import Batch
from opengem.data.commit import mark_complete
from opengem.data.dataset import Dataset
from opengem.data.schema import DenseFeature, FeatureSchema, SequenceGroup, Task
from opengem.model.heads import head_context
from opengem.model.output import ModelOutput
from opengem.model.registry import ModelConfig, build_model
from opengem.transfer.distill import grad_scale
from opengem.transfer.shared_encoder import SharedHistoryEncoder


@dataclass
class VMSchemaConfig:
    sparse: list[str] = field(default_factory=list)  # kept sparse features ([] = all)
    dense: list[str] = field(default_factory=list)  # kept dense features ([] = all)
    sequence_fields: list[str] = field(default_factory=list)  # kept fields of every group ([] = all)
    max_len: int = 8  # history length (0 = drop sequences)
    vocab_cap: int = 0  # 0 = keep vocabularies
    full_vocab_tables: list[str] = field(default_factory=list)
    tasks: list[str] = field(default_factory=list)  # [] = all FM tasks


def derive_vm_schema(
    fm: FeatureSchema, cfg: VMSchemaConfig, fm_features: dict[str, int] | None = None, name: str = "vm"
) -> FeatureSchema:
    """The VM schema: a projection of ``fm`` plus ``fm_features`` (embedding name -> width) as dense."""

    def check(kept: list[str], known: list[str], key: str) -> None:
        bad = [k for k in kept if k not in known]
        if bad:
            raise ConfigError(f"vm.schema.{key}: {bad} not in the FM schema {fm.name!r} (known: {known})")

    check(cfg.sparse, fm.sparse_names, "sparse")
    check(cfg.dense, fm.dense_names, "dense")
    check(cfg.tasks, fm.task_names, "tasks")
    seq_known = sorted({f.name for g in fm.sequences for f in g.fields})
    check(cfg.sequence_fields, seq_known, "sequence_fields")

    def cap(vocab: int, table: str) -> int:
        if cfg.vocab_cap and table not in cfg.full_vocab_tables:
            return min(vocab, cfg.vocab_cap)
        return vocab

    sparse = tuple(
        dataclasses.replace(f, vocab=cap(f.vocab, f.table_name), on_oov="hash")
        for f in fm.sparse
        if not cfg.sparse or f.name in cfg.sparse
    )
    dense = tuple(f for f in fm.dense if not cfg.dense or f.name in cfg.dense)
    for emb, width in (fm_features or {}).items():
        dense += tuple(DenseFeature(f"fm_{emb}_{i}") for i in range(width))
    groups = []
    if cfg.max_len > 0:
        for g in fm.sequences:
            fields = tuple(
                dataclasses.replace(f, vocab=cap(f.vocab, f.table_name), on_oov="hash")
                if f.kind == "id"
                else f
                for f in g.fields
                if not cfg.sequence_fields or f.name in cfg.sequence_fields
            )
            if any(f.kind == "id" for f in fields):
                groups.append(
                    SequenceGroup(g.name, min(cfg.max_len, g.max_len), fields, on_overflow="truncate")
                )
    tasks = tuple(Task(t.name, t.column, t.weight) for t in fm.tasks if not cfg.tasks or t.name in cfg.tasks)
    schema = FeatureSchema(
        name=name,
        surfaces=fm.surfaces,
        tasks=tasks,
        sparse=sparse,
        dense=dense,
        sequences=tuple(groups),
        surface_column=fm.surface_column,
        time_column=fm.time_column,
        example_id_column=fm.example_id_column,
        on_error=fm.on_error,
        time_features=fm.time_features,  # request-time context: the VM serves at request time too
        time_unit=fm.time_unit,
        extra={"derived_from": fm.name},
    )
    schema.tables()
    return schema


def build_vm_dataset(
    src: str | Path,
    surfaces: list[int],
    out: str | Path,
    fm_embeddings: dict[str, np.ndarray] | None = None,
    partitions: list[str] | None = None,
    schema: FeatureSchema | None = None,
) -> Path:
    """Rows of ``src`` on ``surfaces``, per partition, with FM embedding columns joined by example_id.

    ``fm_embeddings``: {"example_id": sorted ids, "<name>": [N, D]} (see
    ``representation.embedding_lookup``), written as dense columns ``fm_<name>_<i>``. Every source column
    is kept; a VM schema later selects what a VM reads. ``schema`` is written as out/schema.toml when
    given, else the source schema. Existing partitions are kept (resumable).
    """
    ds = Dataset(src)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    idcol = ds.schema.example_id_column
    for part in partitions or ds.partitions():
        dest = out / part / "part-00000.parquet"
        if dest.exists():
            continue
        tables = []
        for f in ds.files(part):
            t = pq.read_table(f)
            keep = np.isin(t.column(ds.schema.surface_column).to_numpy(), np.asarray(surfaces))
            tables.append(t.filter(pa.array(keep)))
        t = pa.concat_tables(tables)
        if fm_embeddings:
            lut = fm_embeddings
            ids = t.column(idcol).to_numpy()
            pos = np.searchsorted(lut["example_id"], ids)
            pos = np.minimum(pos, len(lut["example_id"]) - 1)
            found = lut["example_id"][pos] == ids
            if not found.all():
                raise ValueError(
                    f"{src}/{part}: example_id {int(ids[~found][0])} has no FM embedding row "
                    "(generate the side table for every partition first)"
                )
            for name, mat in lut.items():
                if name == "example_id":
                    continue
                for i in range(mat.shape[1]):
                    t = t.append_column(f"fm_{name}_{i}", pa.array(mat[pos, i].astype(np.float32)))
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_suffix(".tmp")
        pq.write_table(t, tmp, row_group_size=max(1, min(len(t), 20_000)))
        tmp.rename(dest)
    (schema or ds.schema).save(out / "schema.toml")
    mark_complete(out, "opengem transfer: VM dataset")  # every partition above was renamed into place whole
    return out


@dataclass
class VMConfig:
    model: ModelConfig = field(default_factory=lambda: ModelConfig(name="dlrm"))
    schema: VMSchemaConfig = field(default_factory=VMSchemaConfig)
    flops_budget: int = 0  # serving FLOPs/example the VM must fit (0 = unchecked)


class VerticalModel(nn.Module):
    """A registry model + optional auxiliary distillation head on its shared trunk (training-time only).

    ``aux_grad_scale`` multiplies the gradient the aux head sends into the trunk (ExFM's gradient
    scaling). The serving head never sees the distillation loss: the aux head has its own weights and
    reads the trunk, which the serving head also reads, but gradients of the aux loss stop at the trunk.
    """

    def __init__(
        self, schema: FeatureSchema, model: ModelConfig, aux_head: bool = False, aux_grad_scale: float = 1.0
    ) -> None:
        super().__init__()
        self.schema = schema
        self.base = build_model(schema, model)
        H = self.base.head.out_dim
        T = len(schema.tasks)
        self.aux_grad_scale = aux_grad_scale
        self.aux_head = nn.Linear(H, T) if aux_head else None
        self.shared_history: nn.Module | None = None

    def attach_shared_history(self, fm: nn.Module) -> list[str]:
        """Add the FM's sequence encoder path (see ``shared_encoder``); returns the FM-copied param names."""
        if not hasattr(self.base, "interact"):
            raise ValueError(f"share_sequence_encoder: VM model {type(self.base).__name__} has no interact()")
        self.shared_history = SharedHistoryEncoder(fm, self.schema, self.base.head.in_dim)
        return [f"shared_history.{n}" for n in self.shared_history.shared_names()]

    def _base_forward(self, batch: Batch) -> ModelOutput:
        if self.shared_history is None:
            return self.base(batch)
        # _Baseline.forward with the shared FM history vector added to the interaction output
        emb = self.base.embedding(batch)
        h = self.base.interact(batch, emb) + self.shared_history(batch)
        context = head_context(emb.dense, self.base.head_context_columns)
        logits, trunk = self.base.head(h, batch.surface, context)
        return ModelOutput(logits=logits, trunk=trunk, extras={"target": emb.target})

    def forward(self, batch: Batch) -> ModelOutput:
        out = self._base_forward(batch)
        if self.aux_head is not None:
            out.extras["aux_logits"] = self.aux_head(grad_scale(out.trunk, self.aux_grad_scale))
        return out

    def serving_parameters(self) -> list[nn.Parameter]:
        """The serving head's own weights (per-surface adapters and output layers)."""
        h = self.base.head
        return [p for n, p in h.named_parameters() if not n.startswith("trunk.")]

    def flops_per_example(self, seq_len: int | None = None) -> int:
        """Serving FLOPs: the base model + the shared FM history path (the aux head is not served)."""
        extra = self.shared_history.flops(seq_len) if self.shared_history is not None else 0
        return int(self.base.flops_per_example(seq_len)) + int(extra)


def check_budget(flops: int, budget: int, what: str = "the VM") -> int:
    """``flops`` when it fits ``vm.flops_budget`` (0 = unchecked), else a ConfigError naming ``what``."""
    if budget and flops > budget:
        raise ConfigError(
            f"vm.flops_budget: {what} needs {flops:,} FLOPs/example, over the budget "
            f"{budget:,} (shrink [vm.model] widths or raise the budget)"
        )
    return flops


def to_numpy(x: torch.Tensor) -> np.ndarray:
    return x.detach().float().cpu().numpy()
