"""Teacher knowledge keyed by example_id: FM soft labels from the side table, or a domain FM's outputs.

A VM batch carries example ids; the table answers with teacher logits for the VM's tasks, the FM's
age and an availability mask (False where no FM version was old enough). ``surface_bias`` adds a
per-surface logit offset to the FM's logits: the experiment's controlled model of an FM that is
miscalibrated on a surface (e.g. one with a small share of its traffic); the Student Adapter is meant to
remove it from the freshest labels.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from opengem.errors import DatasetError
from opengem.transfer.adapter import StudentAdapter


class KnowledgeTable:
    def __init__(
        self,
        example_id: np.ndarray,
        logits: np.ndarray,
        age: np.ndarray | None = None,
        surface: np.ndarray | None = None,
    ) -> None:
        order = np.argsort(example_id, kind="stable")
        self.ids = np.asarray(example_id)[order]
        self.logits = np.asarray(logits, dtype=np.float32)[order]
        self.age = np.zeros(len(order), np.float32) if age is None else np.asarray(age, np.float32)[order]
        self.surface = np.zeros(len(order), np.int64) if surface is None else np.asarray(surface)[order]
        self.adapter: StudentAdapter | None = None

    @classmethod
    def from_side_table(
        cls, side: pa.Table, tasks: list[str], surface_bias: list[float] | None = None, age_unit: float = 1.0
    ) -> KnowledgeTable:
        cols = [f"fm_logit_{t}" for t in tasks]
        missing = [c for c in cols if c not in side.column_names]
        if missing:
            raise DatasetError(f"side table lacks {missing} (has {side.column_names}): generate it with an "
                               "FM trained on these tasks")
        logits = np.stack([side.column(c).to_numpy(zero_copy_only=False) for c in cols], 1).astype(np.float32)
        surface = side.column("surface").to_numpy().astype(np.int64)
        if surface_bias:
            bias = np.zeros(int(surface.max()) + 1 if surface.size else 0)
            bias[: min(len(bias), len(surface_bias))] = surface_bias[: len(bias)]
            logits = logits + bias[surface][:, None].astype(np.float32)
        ts = side.column("ts").to_numpy()
        tt = side.column("fm_trained_through").to_numpy()
        age = np.where(tt >= 0, (ts - tt) / age_unit, 0.0)
        return cls(side.column("example_id").to_numpy(), logits, age, surface)

    def add(self, example_id: np.ndarray, logits: np.ndarray) -> None:
        """Insert or overwrite rows (a domain FM's predictions, window by window)."""
        keep = ~np.isin(self.ids, example_id)
        ids = np.r_[self.ids[keep], example_id]
        order = np.argsort(ids, kind="stable")
        self.ids = ids[order]
        self.logits = np.r_[self.logits[keep], np.asarray(logits, np.float32)][order]
        self.age = np.r_[self.age[keep], np.zeros(len(example_id), np.float32)][order]
        self.surface = np.r_[self.surface[keep], np.zeros(len(example_id), np.int64)][order]

    def index(self, example_id: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if not len(self.ids):
            return np.zeros(len(example_id), np.int64), np.zeros(len(example_id), bool)
        pos = np.minimum(np.searchsorted(self.ids, example_id), len(self.ids) - 1)
        return pos, self.ids[pos] == example_id

    def lookup(
        self, example_id: np.ndarray, surface: np.ndarray, use_adapter: bool = True
    ) -> tuple[np.ndarray, np.ndarray]:
        """(teacher logits [B, T] with NaN where unavailable, available [B, T] bool)."""
        import torch

        pos, found = self.index(example_id)
        lg = np.where(found[:, None], self.logits[pos], np.nan).astype(np.float32)
        if use_adapter and self.adapter is not None:
            t = torch.as_tensor(lg)
            lg = self.adapter.corrected(t, torch.as_tensor(surface), torch.as_tensor(self.age[pos])).numpy()
        return lg, np.isfinite(lg)

    def fit_adapter(
        self,
        adapter: StudentAdapter,
        example_id: np.ndarray,
        surface: np.ndarray,
        labels: np.ndarray,
        label_mask: np.ndarray,
    ) -> float:
        """Refit the Student Adapter on one window's labelled rows (the freshest labels)."""
        pos, found = self.index(example_id)
        lg = np.where(found[:, None], self.logits[pos], np.nan)
        mask = label_mask & np.isfinite(lg)
        loss = adapter.fit(lg, labels, mask, surface, self.age[pos])
        self.adapter = adapter
        return loss


def read_labels(files: list[Path], schema) -> dict[str, np.ndarray]:  # noqa: ANN001
    """example_id, surface, labels [N, T] (NaN-free) and observed mask of some Parquet files."""
    cols = [schema.example_id_column, schema.surface_column] + [t.label_column for t in schema.tasks]
    t = pa.concat_tables([pq.read_table(f, columns=cols) for f in files])
    lab = np.stack(
        [t.column(c.label_column).to_numpy(zero_copy_only=False).astype(np.float64) for c in schema.tasks], 1
    )
    mask = np.isfinite(lab)
    return {
        "example_id": t.column(0).to_numpy(),
        "surface": t.column(1).to_numpy().astype(np.int64),
        "labels": np.nan_to_num(lab).astype(np.float32),
        "mask": mask,
    }
