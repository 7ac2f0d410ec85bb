"""A run's stored calibration (RUN/calibration.json, written by ``opengem calibrate``): read, checked and
folded into a loaded model, so that every reader of the run (evaluate, predict, export) scores through it.

The fit is ``p = sigmoid(a * logit + c)`` per surface x task. It is folded into the head's last layer
(``W[s, :, t] <- a W[s, :, t]``, ``b[s, t] <- a b[s, t] + c``), exact because the logit is linear in both, so
no reader needs an extra op. The file is plain JSON (nothing is unpickled) and names the digest of the
checkpoint it was fitted on: a run whose checkpoint has changed since is loaded without it, with a warning.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from opengem.errors import OpengemError
from opengem.model.heads import MultiSurfaceHead

CALIBRATION = "calibration.json"
FORMAT = 1
METHODS = ("platt", "offset")
MIN_SLOPE = 0.05  # a fitted slope at or below this keeps the model's slope (1) and fits the offset only


class CalibrationError(OpengemError):
    """RUN/calibration.json cannot be used as it is (unreadable, malformed, or for another schema)."""


def find_head(model: nn.Module) -> MultiSurfaceHead:
    """The model's one multi-surface head (every opengem model's logits are its output)."""
    heads = [m for m in model.modules() if isinstance(m, MultiSurfaceHead)]
    if len(heads) != 1:
        raise CalibrationError(f"calibration needs a model with exactly one multi-surface head, found "
                               f"{len(heads)}")
    return heads[0]


@torch.no_grad()
def fold_into_head(model: nn.Module, slope: np.ndarray, offset: np.ndarray) -> None:
    """Make the model's logits ``a * z + c`` per (surface, task) by rescaling its head's last layer (and its
    context term, which adds to the same logit)."""
    head = find_head(model)
    want = (head.num_surfaces, head.num_tasks)
    if slope.shape != want or offset.shape != want:
        raise CalibrationError(f"calibration has shape {slope.shape}, the model's head {want} "
                               "[surfaces, tasks]")
    w, b = _full(head.out_weight), _full(head.out_bias)
    a = torch.as_tensor(slope, dtype=w.dtype, device=w.device)
    c = torch.as_tensor(offset, dtype=w.dtype, device=w.device)
    _assign(head.out_weight, w * a[:, None, :])
    _assign(head.out_bias, b * a + c)
    if head.context_dim:  # the context term is part of the logit: it scales with it
        _assign(head.context_weight, _full(head.context_weight) * a[:, None, :])


def _full(p: torch.Tensor) -> torch.Tensor:
    return p.full_tensor() if hasattr(p, "full_tensor") else p.detach()


def _assign(p: torch.Tensor, value: torch.Tensor) -> None:
    if hasattr(p, "device_mesh"):  # a DTensor (FSDP2): each rank keeps its own shard of the new value
        from torch.distributed.tensor import distribute_tensor

        value = distribute_tensor(value, p.device_mesh, p.placements)
    p.copy_(value)


def checkpoint_digest(checkpoint: Path) -> str:
    from opengem.train import checkpoint as ckpt

    return ckpt.recorded_digest(checkpoint)


def read_calibration(path: Path, surfaces: list[str], tasks: list[str]) -> dict[str, Any]:
    """RUN/calibration.json, checked: for this schema, finite numbers of the right shape, positive slopes."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CalibrationError(f"{path}: unreadable ({e}); run opengem calibrate again or remove "
                               "it") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CalibrationError(f"{path}: not an opengem calibration file (format {FORMAT})")
    if doc.get("method") not in METHODS or not isinstance(doc.get("checkpoint_digest"), str):
        raise CalibrationError(f"{path}: 'method' must be one of {', '.join(METHODS)} and "
                               "'checkpoint_digest' a string")
    if doc.get("surfaces") != surfaces or doc.get("tasks") != tasks:
        raise CalibrationError(f"{path}: fitted for surfaces {doc.get('surfaces')} and tasks "
                               f"{doc.get('tasks')}, the run has {surfaces} and {tasks}")
    for key in ("slope", "offset"):
        rows = doc.get(key)
        ok = (isinstance(rows, list) and len(rows) == len(surfaces)
              and all(isinstance(r, list) and len(r) == len(tasks) for r in rows)
              and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                      for r in rows for v in r))
        if not ok:
            raise CalibrationError(f"{path}: '{key}' must be a [{len(surfaces)}][{len(tasks)}] list of "
                                   "finite numbers")
    if any(v < MIN_SLOPE for r in doc["slope"] for v in r):
        raise CalibrationError(f"{path}: a slope below {MIN_SLOPE} would reverse or erase the ranking")
    return doc


def apply_run_calibration(model: nn.Module, run_dir: str | Path, checkpoint: str | Path,
                          surfaces: list[str], tasks: list[str], who: str = "opengem"
                          ) -> dict[str, Any] | None:
    """Fold RUN/calibration.json into ``model`` (loaded from ``checkpoint``) when it was fitted on that
    checkpoint; returns what was applied (None: no file, or fitted on another checkpoint: warned)."""
    path = Path(run_dir) / CALIBRATION
    if not path.exists():
        return None
    doc = read_calibration(path, surfaces, tasks)
    if doc["checkpoint_digest"] != checkpoint_digest(Path(checkpoint)):
        print(f"{who}: warning: {path} was fitted on checkpoint {doc.get('checkpoint')}, not on "
              f"{checkpoint}: not applied (run opengem calibrate again)", file=sys.stderr, flush=True)
        return None
    fold_into_head(model, np.array(doc["slope"], dtype=np.float64),
                   np.array(doc["offset"], dtype=np.float64))
    fitted_on = doc.get("fitted_on")
    return {"file": str(path), "method": doc["method"],
            "fitted_on": fitted_on.get("partitions") if isinstance(fitted_on, dict) else None}


def describe_calibration(applied: dict[str, Any] | None) -> str:
    """``", calibrated (platt on day=006)"`` for what :func:`apply_run_calibration` returned, "" for None: the
    note every command that loads a run prints beside the checkpoint it used."""
    if not applied:
        return ""
    return f", calibrated ({applied['method']} on {', '.join(applied['fitted_on'] or [])})"
