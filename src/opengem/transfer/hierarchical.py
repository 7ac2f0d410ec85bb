"""Hierarchical transfer: FM -> domain FM (one surface group) -> VM, trained window by window.

The domain FM distils from the FM (auxiliary head + Student Adapter); the VM distils from the domain FM's
fresh predictions on each window. Both are evaluated on the VM's rows, so each hop's loss is visible.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from opengem.config import ConfigError
from opengem.transfer.adapter import StudentAdapter
from opengem.transfer.experiment_config import ExperimentConfig
from opengem.transfer.knowledge import KnowledgeTable, read_labels
from opengem.transfer.preds import align_rows, concat_preds
from opengem.transfer.vertical import build_vm_dataset, derive_vm_schema
from opengem.transfer.vm_train import ArmConfig, ProgressiveStudent, clone_arm


class SeedWindows(Protocol):
    """What the hierarchical arm reads of one seed's run (transfer/seed_run.py's SeedRun, which calls this
    module: a Protocol, so that this module needs nothing of its caller)."""

    cfg: ExperimentConfig
    schema: Any
    root: Path
    data: Path
    windows: list[str]
    eval_windows: list[str]
    window_len: float

    def student(self, arm: ArmConfig, schema: Any, data_dir: Path, model: Any = None, fm: Any = None
                ) -> ProgressiveStudent: ...

    def windows_for(self, s: int) -> list[str]: ...


def run_hierarchical(
    run: SeedWindows, arm: ArmConfig, vm_schema: Any, vm_dir: Path, know_vm: Any, side: pa.Table, s: int,
    lag: int,
) -> dict[str, Any]:
    """FM -> domain FM (surface group) -> VM, window by window; both evaluated on the VM's rows."""
    cfg = run.cfg
    groups = cfg.hierarchical.groups or [list(run.schema.surfaces)]
    group = next((g for g in groups if run.schema.surfaces[s] in g), None)
    if group is None:
        raise ConfigError(f"hierarchical.groups: surface {run.schema.surfaces[s]!r} is in no group")
    gidx = [run.schema.surfaces.index(x) for x in group]
    dom_dir = run.root / f"domain_{'+'.join(group)}_lag{lag}"
    dom_schema = derive_vm_schema(run.schema, cfg.hierarchical.schema, name="domain_fm")
    build_vm_dataset(run.data, gidx, dom_dir, None, run.windows, dom_schema)
    know_dom = KnowledgeTable.from_side_table(
        side, dom_schema.task_names, cfg.surface_bias, run.window_len
    )
    dom_arm = clone_arm(arm, name="domain_fm", adapter=True)
    dom = run.student(dom_arm, dom_schema, dom_dir, model=cfg.hierarchical.model)
    vm = run.student(arm, vm_schema, vm_dir)
    adapter = StudentAdapter(len(dom_schema.tasks), len(dom_schema.surfaces), cfg.adapter)
    teacher = KnowledgeTable(np.zeros(0, np.int64), np.zeros((0, len(vm_schema.tasks)), np.float32))
    t_idx = [dom_schema.task_names.index(t) for t in vm_schema.task_names]
    vm_preds, dom_preds = [], []
    windows = run.windows_for(s)  # the VM surface's own history length, for the domain FM too
    for w in windows:
        if w in run.eval_windows:
            vm_preds.append(vm.predict(w))
            d = dom.predict(w, [s])
            d["logits"] = d["logits"][:, t_idx]
            d["labels"], d["mask"] = d["labels"][:, t_idx], d["mask"][:, t_idx]
            dom_preds.append(d)
        if w == windows[-1]:
            break
        lab = read_labels(dom.ds.files(w), dom_schema)
        know_dom.fit_adapter(adapter, lab["example_id"], lab["surface"], lab["labels"], lab["mask"])
        dom.train_window(w, know_dom)
        d = dom.predict(w, [s])
        teacher.add(d["example_id"], d["logits"][:, t_idx])
        vm.train_window(w, teacher)
    res = concat_preds(vm_preds)
    dp = concat_preds(dom_preds)
    order = align_rows(res["example_id"], dp["example_id"])
    res["domain_logits"] = dp["logits"][order]
    res["serving_flops"] = vm.serving_flops
    res["domain_flops"] = dom.serving_flops
    res["steps"] = vm.steps
    return res
