"""Early stopping: keep the best model on a validation selection and stop when it stops improving.

On small click logs every deep model here overfits within two or three epochs (training loss falls far
below the base rate's entropy while validation NE rises), so the last step is rarely the best one. The
Trainer asks an :class:`EarlyStopper` after each evaluation whether the model improved (then it saves
RUN/checkpoints/best) and whether to stop (``patience`` evaluations in a row without improvement). The
stopper's counters travel in checkpoints, so ``--resume`` continues the count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from opengem.config import ConfigError

# metric -> True when larger is better; "loss" is the task-weighted masked BCE of the evaluation
METRICS = {"ne": False, "auc": True, "loss": False}


@dataclass
class EarlyStopConfig:
    """``[train] early_stop = { partition = "@valid", metric = "ne", patience = 2 }``; patience 0 = off."""

    partition: str = "@valid"  # partition spec evaluated for the decision (disjoint from data.train)
    metric: str = "ne"  # ne | auc | loss
    # which metrics entry decides: "" = the mean over tasks of the "all/<task>" aggregates; or one key
    # such as "all/click" or "feed/click" (ignored for metric = "loss")
    key: str = ""
    patience: int = 0  # evaluations without improvement before stopping; 0 = early stopping off
    min_delta: float = 0.0  # an improvement smaller than this does not count

    @property
    def enabled(self) -> bool:
        return self.patience > 0

    def validate(self, where: str = "train.early_stop") -> None:
        if self.metric not in METRICS:
            raise ConfigError(f"{where}.metric: must be one of {', '.join(METRICS)} (got {self.metric!r})")
        if self.patience < 0:
            raise ConfigError(f"{where}.patience: must be >= 0 (got {self.patience!r})")
        if self.min_delta < 0:
            raise ConfigError(f"{where}.min_delta: must be >= 0 (got {self.min_delta!r})")


def score(result: dict[str, Any], metric: str, key: str = "") -> float:
    """The number early stopping compares, from an evaluation result (``evaluate_model``'s dict)."""
    if metric == "loss":
        return float(result["loss"])
    metrics = result["metrics"]
    if key:
        if key not in metrics:
            raise ConfigError(f"train.early_stop.key: {key!r} is not among the evaluated keys "
                              f"({', '.join(sorted(metrics))})")
        return float(metrics[key][metric])
    values = [float(m[metric]) for k, m in metrics.items() if k.startswith("all/") and metric in m]
    values = [v for v in values if not math.isnan(v)]
    return sum(values) / len(values) if values else math.nan


class EarlyStopper:
    """Tracks the best score and the evaluations since it; see the module docstring."""

    def __init__(self, cfg: EarlyStopConfig) -> None:
        self.cfg = cfg
        self.higher_is_better = METRICS[cfg.metric]
        self.best_value: float | None = None
        self.best_step: int | None = None
        self.bad: int = 0  # evaluations since the last improvement
        self.evaluations: int = 0
        self.stopped: bool = False
        self.last_step: int | None = None  # the step last compared (the end of a run is compared once)

    def update(self, step: int, result: dict[str, Any]) -> bool:
        """Record an evaluation at ``step``; True when it is the best so far (save it). A NaN score (no
        observed label of any task) never improves."""
        value = score(result, self.cfg.metric, self.cfg.key)
        self.evaluations += 1
        self.last_step = step
        better = not math.isnan(value) and (
            self.best_value is None
            or (value > self.best_value + self.cfg.min_delta if self.higher_is_better
                else value < self.best_value - self.cfg.min_delta))
        if better:
            self.best_value, self.best_step, self.bad = value, step, 0
        else:
            self.bad += 1
            self.stopped = self.bad >= self.cfg.patience
        return better

    @property
    def should_stop(self) -> bool:
        return self.stopped

    def summary(self) -> dict[str, Any]:
        """What train_summary.json and metrics.jsonl record: which step won, on what, and why it ended."""
        return {"partition": self.cfg.partition, "metric": self.cfg.metric,
                "key": self.cfg.key or "mean of all/<task>", "patience": self.cfg.patience,
                "best_step": self.best_step, "best_value": self.best_value,
                "evaluations": self.evaluations, "stopped_early": self.stopped}

    def state_dict(self) -> dict[str, Any]:
        return {"best_value": self.best_value, "best_step": self.best_step, "bad": self.bad,
                "evaluations": self.evaluations, "stopped": self.stopped, "last_step": self.last_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best_value = state.get("best_value")
        self.best_step = state.get("best_step")
        self.bad = int(state.get("bad", 0))
        self.evaluations = int(state.get("evaluations", 0))
        self.stopped = bool(state.get("stopped", False))
        self.last_step = state.get("last_step")
