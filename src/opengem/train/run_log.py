"""A run's log: every record to metrics.jsonl (the durable record) and to TensorBoard (for people)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from torch.utils.tensorboard import SummaryWriter

from opengem.config import flatten_dict


class RunLog:
    """metrics.jsonl + TensorBoard: every record goes to both."""

    def __init__(self, run_dir: Path, enabled: bool = True, purge_step: int | None = None) -> None:
        """``purge_step``: a resumed run drops TensorBoard events from this step on (they belong to the
        attempt that was cut short; metrics.jsonl is rolled back by ``run_dir.rollback_log``)."""
        self.enabled = enabled
        self._file = open(run_dir / "metrics.jsonl", "a") if enabled else None  # noqa: SIM115
        self._tb = None
        if enabled:
            self._tb = SummaryWriter(str(run_dir / "tb"), purge_step=purge_step)

    def write(self, record: dict[str, Any], step: int) -> None:
        if not self.enabled:
            return
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        for k, v in flatten_dict(record, "/").items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step" and math.isfinite(v):
                self._tb.add_scalar(k, v, step)

    def close(self) -> None:
        if self._file:
            self._file.close()
            self._file = None
        if self._tb:
            self._tb.close()
            self._tb = None


def short_metrics(res: dict[str, Any]) -> dict[str, Any]:
    """The per-key NE/AUC of an evaluation, compact enough for one metrics.jsonl line."""
    return {"loss": res["loss"],
            "metrics": {k: {"ne": v["ne"], "auc": v["auc"]} for k, v in res["metrics"].items()}}
