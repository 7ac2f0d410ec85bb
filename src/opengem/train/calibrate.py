"""``opengem calibrate``: refit each surface x task's probability level on held-out data (Platt scaling).

Why. Ads auctions price on the probability, and click and conversion rates drift: campaigns start and stop,
seasons turn, the auction changes. A model trained on several days with shuffled rows predicts roughly
their average; on the simulator's iso-FLOP stream the conversion rate falls from 1.30 % on day 0 to
1.10-1.13 % on days 6-7, and every family trained on days 0-5 over-predicts the test day's conversions by
5-14 %. Production ads systems answer this with a calibration stage fitted on the freshest labelled data,
separate from the ranking model (He et al. 2014, "Practical Lessons from Predicting Clicks on Ads at
Facebook", on calibration); this is that stage.

How. For each surface x task the calibrated probability is ``sigmoid(a * z + c)`` with ``z`` the model's
logit, ``(a, c)`` fitted by maximum likelihood (Newton's method; convex) on a held-out selection: by
default the run's ``data.eval``, never a partition the run trained on. ``--method offset`` fixes ``a = 1``
(a level shift only), as does a cell whose best slope is not positive (a model that ranks it backwards
keeps its ranking). A cell with fewer than ``--min-positives`` positives (or negatives) takes its task's
fit over all surfaces; a task with too few of either keeps the identity. The fit is folded into the head's
last layer (``W[s, :, t] <- a W[s, :, t]``, ``b[s, t] <- a b[s, t] + c``), which is exact because the
logit is linear in both: evaluate, predict, export and serve get the calibrated probabilities with no extra
op, and the checkpoint itself is never rewritten. Knowledge generation (``opengem generate``) reads an FM
version's checkpoint as it is.

The fit is stored as RUN/calibration.json (plain JSON; nothing is unpickled), with the digest of the
checkpoint it was fitted on. A run whose checkpoint has changed since (training went on) is loaded without
it, with a warning: calibrate again. ``--remove`` deletes it.
"""

from __future__ import annotations

import argparse
import json
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from opengem.data.commit import atomic_write_text
from opengem.errors import UsageError
from opengem.run_arg import add_run_argument, resolve_run
from opengem.train.calibration import (
    CALIBRATION,
    FORMAT,
    METHODS,
    MIN_SLOPE,
    CalibrationError,
    checkpoint_digest,
    fold_into_head,
)
from opengem.train.data import make_loader
from opengem.train.distributed import world_size
from opengem.train.evaluate import open_run
from opengem.train.published import split_version

MIN_POSITIVES = 30  # a cell with fewer positives (or negatives) takes its task's fit over all surfaces


@dataclass
class CalibrationFit:
    """Per (surface, task): slope ``a`` and offset ``c`` of the logit, and what each cell's fit rests on."""

    slope: np.ndarray  # [S, T]
    offset: np.ndarray  # [S, T]
    cells: dict[str, dict[str, Any]] = field(default_factory=dict)  # "surface/task" -> counts, source


def fit_logistic(z: np.ndarray, y: np.ndarray, slope: bool = True, iters: int = 50) -> tuple[float, float]:
    """Maximum-likelihood ``(a, c)`` of ``P(y = 1) = sigmoid(a z + c)`` (``a`` fixed at 1 without ``slope``).

    Newton's method from the identity with step halving: the log loss is convex in (a, c), so this reaches
    the optimum in a handful of steps; a tiny ridge keeps the Hessian invertible when ``z`` is constant.
    """
    z = np.asarray(z, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if z.shape != y.shape or z.ndim != 1 or not len(z):
        raise ValueError(f"fit_logistic: z {z.shape} and y {y.shape} must be equal non-empty vectors")
    params = np.array([1.0, 0.0])

    def loss(p: np.ndarray) -> float:
        s = p[0] * z + p[1]
        return float(np.sum(np.logaddexp(0.0, s) - y * s))

    current = loss(params)
    for _ in range(iters):
        s = params[0] * z + params[1]
        q = _sigmoid(s)
        r, w = q - y, q * (1.0 - q)
        if slope:
            grad = np.array([np.dot(r, z), r.sum()])
            hess = np.array([[np.dot(w, z * z), np.dot(w, z)], [np.dot(w, z), w.sum()]])
            hess += np.eye(2) * 1e-9 * max(len(z), 1)
            step = np.linalg.solve(hess, grad)
        else:
            step = np.array([0.0, r.sum() / max(w.sum(), 1e-12)])
        t = 1.0
        while t > 1e-6:
            cand = params - t * step
            new = loss(cand)
            if new <= current:
                break
            t *= 0.5
        else:
            break  # no descent along Newton's direction: at the optimum to numerical precision
        params, gain, current = cand, current - new, new
        if gain <= 1e-12 * max(abs(current), 1.0):
            break
    return float(params[0]), float(params[1])


def fit_calibration(logits: np.ndarray, labels: np.ndarray, mask: np.ndarray, surface: np.ndarray,
                    surfaces: list[str], tasks: list[str], method: str = "platt",
                    min_positives: int = MIN_POSITIVES) -> CalibrationFit:
    """One ``(a, c)`` per surface x task from rows' logits [N, T], labels [N, T], observed mask [N, T] and
    surface index [N]; see the module docstring for the fallbacks."""
    if method not in METHODS:
        raise UsageError(f"--method {method}: choose one of {', '.join(METHODS)}")
    S, T = len(surfaces), len(tasks)
    slope, offset = np.ones((S, T)), np.zeros((S, T))
    cells: dict[str, dict[str, Any]] = {}
    use_slope = method == "platt"
    for t, task in enumerate(tasks):
        seen = mask[:, t].astype(bool)
        z_all, y_all = logits[seen, t].astype(np.float64), labels[seen, t].astype(np.float64)
        pooled: tuple[float, float] | None = None
        pos_all = int(y_all.sum())
        if min(pos_all, len(y_all) - pos_all) >= min_positives:
            pooled = _fit_cell(z_all, y_all, use_slope)
        for s, name in enumerate(surfaces):
            mine = surface[seen] == s
            z, y = z_all[mine], y_all[mine]
            pos = int(y.sum())
            if min(pos, len(y) - pos) >= min_positives:
                a, c = _fit_cell(z, y, use_slope)
                source = "own"
            elif pooled is not None:
                (a, c), source = pooled, f"all/{task}"
            else:
                a, c, source = 1.0, 0.0, "none (too few labels)"
            slope[s, t], offset[s, t] = a, c
            before = _mean_sigmoid(z) / y.mean() if len(y) and pos else math.nan
            after = _mean_sigmoid(a * z + c) / y.mean() if len(y) and pos else math.nan
            cells[f"{name}/{task}"] = {"labelled": int(len(y)), "positives": pos, "source": source,
                                       "slope": a, "offset": c, "cal_before": _num(before),
                                       "cal_after": _num(after)}
    return CalibrationFit(slope, offset, cells)


def _fit_cell(z: np.ndarray, y: np.ndarray, use_slope: bool) -> tuple[float, float]:
    """Platt's (a, c), or the offset alone when the best slope is not positive: a model that ranks a
    cell backwards (or not at all) must not have its ranking reversed or erased by calibration."""
    a, c = fit_logistic(z, y, slope=use_slope)
    if a <= MIN_SLOPE:
        a, c = fit_logistic(z, y, slope=False)
    return a, c


def _sigmoid(s: np.ndarray) -> np.ndarray:
    return np.exp(-np.logaddexp(0.0, -s))  # no overflow for large |s|


def _mean_sigmoid(s: np.ndarray) -> float:
    return float(np.mean(_sigmoid(s))) if len(s) else math.nan


def _num(x: float) -> float | None:
    return None if x != x else float(x)


def collect_logits(model: nn.Module, batches: Any, device: torch.device, max_batches: int = 0
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(logits [N, T], labels [N, T] with 0 where unobserved, observed mask [N, T], surface [N]) of the
    model on ``batches`` (the first ``max_batches``; 0 = all), in eval mode, one process."""
    zs, y, m, s = collect_logits_of({"model": model}, batches, device, max_batches)
    return zs["model"], y, m, s


def collect_logits_of(models: Mapping[str, nn.Module], batches: Any, device: torch.device,
                      max_batches: int = 0
                      ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
    """:func:`collect_logits` of several models in one pass over ``batches`` (each batch decoded once):
    (logits by model name, labels, observed mask, surface), the last three shared by every model."""
    kept = LogitCollector()
    for model in models.values():
        model.eval()
    with torch.no_grad():
        for i, batch in enumerate(batches):
            if max_batches and i >= max_batches:
                break
            batch = batch.to(device)
            for name, model in models.items():
                kept(name, model(batch).logits, batch)
    return kept.arrays()


class LogitCollector:
    """Keeps the logits each model gives, by name, and the rows' labels, observed mask and surface once per
    batch however many models score it, as an ``on_logits`` observer of
    :func:`~opengem.train.evaluate.evaluate_models`: the pass that scores the validation rows also gives the
    calibration fit its data."""

    def __init__(self) -> None:
        self._z: dict[str, list[np.ndarray]] = {}
        self._y: list[np.ndarray] = []
        self._m: list[np.ndarray] = []
        self._s: list[np.ndarray] = []
        self._batch: Any = None

    def __call__(self, name: str, logits: torch.Tensor, batch: Any) -> None:
        self._z.setdefault(name, []).append(logits.detach().double().cpu().numpy())
        if batch is not self._batch:  # the first model to score this batch: keep its rows
            self._batch = batch
            self._y.append(batch.labels.double().cpu().numpy())
            self._m.append(batch.label_mask.bool().cpu().numpy())
            self._s.append(batch.surface.cpu().numpy())

    def arrays(self) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
        """(logits [N, T] by model name, labels [N, T] with 0 where unobserved, observed mask [N, T],
        surface [N])."""
        if not self._y:
            raise CalibrationError("no rows to calibrate on")
        return ({name: np.concatenate(z) for name, z in self._z.items()},
                np.nan_to_num(np.concatenate(self._y)), np.concatenate(self._m), np.concatenate(self._s))


class CalibratedMetrics:
    """Metrics of the logits a model gives passed through ``fit`` (``sigmoid(a * z + c)`` per surface x
    task), as an ``on_logits`` observer: one pass over the test rows gives both their raw metrics (the
    pass's own) and their calibrated ones. They equal the metrics of the model with ``fit`` folded into its
    head up to float rounding (the fold scales the head's weights before the matmul, this the logit after)."""

    def __init__(self, fit: CalibrationFit, surfaces: list[str], tasks: list[str]) -> None:
        from opengem.metrics import MetricAccumulator

        self._acc = MetricAccumulator(surfaces, tasks)
        self._slope = torch.as_tensor(fit.slope, dtype=torch.float32)
        self._offset = torch.as_tensor(fit.offset, dtype=torch.float32)

    def __call__(self, name: str, logits: torch.Tensor, batch: Any) -> None:
        s = batch.surface.long().cpu()
        z = logits.detach().float().cpu() * self._slope[s] + self._offset[s]
        self._acc.update(torch.sigmoid(z), batch.labels, batch.label_mask, batch.surface)

    def compute(self) -> dict[str, Any]:
        return self._acc.compute()


def calibrate_model(model: nn.Module, batches: Any, device: torch.device, surfaces: list[str],
                    tasks: list[str], method: str = "platt", min_positives: int = MIN_POSITIVES,
                    max_batches: int = 0) -> tuple[CalibrationFit, int]:
    """Fit on ``batches`` and fold the fit into ``model``; returns (the fit, rows it was fitted on)."""
    fits, rows = calibrate_models({"model": model}, batches, device, surfaces, tasks, {"model": method},
                                  min_positives, max_batches)
    return fits["model"], rows


def calibrate_models(models: Mapping[str, nn.Module], batches: Any, device: torch.device, surfaces: list[str],
                     tasks: list[str], methods: Mapping[str, str], min_positives: int = MIN_POSITIVES,
                     max_batches: int = 0) -> tuple[dict[str, CalibrationFit], int]:
    """:func:`calibrate_model` of several models, each by its own method, in one pass over ``batches``;
    returns (the fits by name, the rows every fit was made on)."""
    zs, y, m, s = collect_logits_of(models, batches, device, max_batches)
    fits = {name: fit_calibration(zs[name], y, m, s, surfaces, tasks, methods[name], min_positives)
            for name in models}
    for name, model in models.items():
        fold_into_head(model, fits[name].slope, fits[name].offset)
    return fits, int(len(y))


def write_calibration(run_dir: Path, fit: CalibrationFit, method: str, min_positives: int, checkpoint: Path,
                      step: int, data_path: Path, spec: str, partitions: list[str], rows: int,
                      surfaces: list[str], tasks: list[str]) -> dict[str, Any]:
    """Write RUN/calibration.json for ``fit`` (made on ``rows`` rows of ``spec`` of the run's ``checkpoint``);
    returns the document (see :func:`read_calibration` for what a reader checks)."""
    doc = {
        "format": FORMAT,
        "method": method,
        "min_positives": min_positives,
        "checkpoint": str(checkpoint),
        "checkpoint_digest": checkpoint_digest(checkpoint),
        "step": step,
        "fitted_on": {"data": str(Path(data_path).resolve()), "spec": spec, "partitions": partitions,
                      "rows": rows},
        "surfaces": surfaces,
        "tasks": tasks,
        "slope": fit.slope.tolist(),
        "offset": fit.offset.tolist(),
        "cells": fit.cells,
    }
    atomic_write_text(Path(run_dir) / CALIBRATION, json.dumps(doc, indent=2) + "\n")
    return doc


def calibrate_run(run_dir: str | Path, data_dir: str | Path | None = None, partitions: str | None = None,
                  method: str = "platt", min_positives: int = MIN_POSITIVES, device: str | None = None
                  ) -> dict[str, Any]:
    """Fit the run's calibration on ``partitions`` (default: its data.eval) and write RUN/calibration.json;
    returns the document written."""
    if method not in METHODS:
        raise UsageError(f"--method {method}: choose one of {', '.join(METHODS)}")
    if min_positives < 1:
        raise UsageError(f"--min-positives {min_positives}: must be >= 1")
    if world_size() > 1:
        raise UsageError("opengem calibrate runs in one process (not under torchrun with several ranks)")
    run_dir, version = split_version(run_dir)
    if version is not None:  # RUN/calibration.json applies to the run's own checkpoints only
        raise UsageError(f"{run_dir}@{version}: opengem calibrate fits a run's own checkpoint "
                         f"({run_dir / CALIBRATION}), which no published version uses; evaluate or predict "
                         "take RUN@N")
    with open_run(run_dir, data_dir, device, calibrated=False) as r:
        spec = partitions or r.cfg.data.eval
        chosen = r.ds.select(spec)
        trained = set(r.ds.select(r.cfg.data.train)) if data_dir is None else set()
        overlap = sorted(trained & set(chosen))
        if overlap:
            raise UsageError(f"--partitions {spec}: {', '.join(overlap)} is training data of this run; "
                             "calibrate on held-out rows (default: the run's data.eval)")
        surfaces, tasks = list(r.ds.schema.surfaces), r.ds.schema.task_names
        try:
            z, y, m, s = collect_logits(r.model, make_loader(r.ds, spec, r.cfg.data, train=False), r.device)
        except CalibrationError:
            raise CalibrationError(f"{r.data_path}: partitions {spec}: no rows to calibrate on") from None
        fit = fit_calibration(z, y, m, s, surfaces, tasks, method, min_positives)
        return write_calibration(run_dir, fit, method, min_positives, r.checkpoint, r.step, r.data_path, spec,
                                 chosen, int(len(z)), surfaces, tasks)


def format_fit(doc: dict[str, Any]) -> str:
    """Per cell: labelled rows, positives, where its fit comes from, (a, c), calibration before and after."""
    def f(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    lines = [f"{'surface/task':<24}{'labelled':>10}{'positives':>10}{'slope':>8}{'offset':>9}"
             f"{'cal before':>12}{'cal after':>11}  fit"]
    for key, c in doc["cells"].items():
        lines.append(f"{key:<24}{c['labelled']:>10}{c['positives']:>10}{c['slope']:>8.3f}{c['offset']:>9.3f}"
                     f"{f(c['cal_before']):>12}{f(c['cal_after']):>11}  {c['source']}")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_run_argument(p)
    p.add_argument("--data", default=None, help="dataset folder (default: the one the run trained on)")
    p.add_argument("--partitions", default=None,
                   help="held-out partitions to fit on (default: the run's data.eval; never its training "
                        "data)")
    p.add_argument("--method", default="platt", choices=list(METHODS),
                   help="platt: slope and offset of the logit per surface x task; offset: level only")
    p.add_argument("--min-positives", type=int, default=MIN_POSITIVES,
                   help="a cell with fewer positives (or negatives) takes its task's fit over all surfaces")
    p.add_argument("--remove", action="store_true", help="delete RUN/calibration.json and fit nothing")
    p.add_argument("--device", default=None, choices=["auto", "cpu", "cuda"])


def run(args: argparse.Namespace) -> int:
    warnings.filterwarnings("ignore", category=FutureWarning)  # TorchRec/DCP deprecation notices
    resolve_run(args)
    path = Path(args.run) / CALIBRATION
    if args.remove:
        existed = path.exists()
        path.unlink(missing_ok=True)
        print(f"removed {path}" if existed else f"{path}: none to remove")
        return 0
    doc = calibrate_run(args.run, args.data, args.partitions, args.method, args.min_positives, args.device)
    print(format_fit(doc))
    print(f"wrote {path}: {doc['method']} on {', '.join(doc['fitted_on']['partitions'])} "
          f"({doc['fitted_on']['rows']} rows; checkpoint {doc['checkpoint']}, step {doc['step']}); "
          "evaluate, predict, export and serve now apply it")
    return 0
