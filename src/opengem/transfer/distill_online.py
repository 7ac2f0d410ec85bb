"""``opengem distill --online``: a vertical model that follows new partitions and the FM's newest versions.

The loop of ``opengem train --online`` (train/online.py: :class:`PartitionWatch` picks the next ready
partition, a STOP file or SIGTERM ends the run, ``train.online_until`` / ``online_max_idle_s`` bound it),
with a teacher per window. For each new partition (window) of --data, in name order:

1. knowledge: the FM's side table for the window, generated *now* from the versions published now, so a
   version is only used for an example when its ``trained_through_ts`` is strictly before the example's
   ts (``versions.select_versions``, the rule ``opengem generate`` applies); versions the FM publishes
   later are picked up by later windows (RUN/knowledge/<window>/);
2. the window's VM rows are added to RUN/data;
3. progressive validation: the VM is evaluated on the window before it trains on it;
4. the Student Adapter (when on) is refitted on the window's labels, then the VM trains one pass over
   the window through the one Trainer (``DistillTrainer.train_step``) with KD against that teacher;
5. a checkpoint RUN/checkpoints/step-N records the model, optimizers and the windows done, so a restart
   with the same --out continues after the last window trained (and ``opengem evaluate`` reads the run).

Every switch works online. FM embeddings: the VM's feature widths are read from the newest FM version's
outputs before the first window (which may have no version old enough: its rows get zeros, as in
``opengem generate``). Parameter sharing copies the newest version trained before the VM's first window.
Hierarchical transfer generates the domain FM's side table per window, like the FM's.
"""

from __future__ import annotations

import copy
import json
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from opengem.config import save_config
from opengem.data.commit import atomic_write_text
from opengem.data.dataset import Dataset
from opengem.data.loader import ParquetLoader
from opengem.errors import TrainError
from opengem.train import run_dir as rundir
from opengem.train.distributed import process_group
from opengem.train.env import resolve_device
from opengem.train.evaluate import EvalDataError
from opengem.train.online import SETTLE_S, STOP_FILE, PartitionWatch, StopFlag
from opengem.train.run_log import short_metrics
from opengem.transfer.adapter import StudentAdapter
from opengem.transfer.distill_config import DistillConfig
from opengem.transfer.distill_run import (
    DISTILL_JSON,
    DISTILL_TOML,
    build_plain,
    check_out_folder,
    check_resume,
    clear_failed_start,
    first_ts,
    recipe,
    resolved_sources,
    sharing_version,
    vm_schema_for,
    vm_surfaces,
)
from opengem.transfer.distill_sources import (
    check_same_schema,
    given_side_table,
    side_table,
    teacher_coverage,
)
from opengem.transfer.distill_trainer import DistillTrainer
from opengem.transfer.fm_runs import fm_schema, fm_versions
from opengem.transfer.generate import _extras, _load_version
from opengem.transfer.knowledge import KnowledgeTable, read_labels
from opengem.transfer.representation import embedding_lookup
from opengem.transfer.vertical import build_vm_dataset, check_budget
from opengem.transfer.windows import window_len

SUMMARY = "distill_online_summary.json"


def online_run_config(cfg: DistillConfig, vm_data: Path) -> Any:
    """RUN/config.toml of an online distillation: the served VM over RUN/data; progressive validation is its
    evaluation, so nothing evaluates at the end (``opengem evaluate --run`` reads the newest window)."""
    run_cfg = copy.deepcopy(cfg.run_config(str(vm_data.resolve())))
    run_cfg.data.train, run_cfg.data.eval = "@all", "@last"
    run_cfg.train.final_eval, run_cfg.train.eval_every, run_cfg.train.progress = False, 0, False
    return run_cfg


class OnlineDistill:
    """The state of one online distillation: the dataset watched, the VM data, the trainer (built once the
    first window's VM rows exist, or at once on a restart)."""

    def __init__(self, cfg: DistillConfig, fm: str, data: str, out: Path, knowledge_dir: str | None,
                 device: torch.device, pg: Any) -> None:
        self.cfg, self.fm, self.out, self.knowledge_dir = cfg, fm, out, knowledge_dir
        self.device, self.pg = device, pg
        self.src = Dataset(data)
        self.sources = resolved_sources(fm, data, knowledge_dir)
        self.fm_run, _ = fm_versions(fm)
        check_same_schema(fm_schema(self.fm_run), self.src.schema, fm, data)
        if cfg.distill.hierarchical:
            dom, _ = fm_versions(cfg.distill.hierarchical, "distill.hierarchical")
            check_same_schema(fm_schema(dom), self.src.schema, cfg.distill.hierarchical, data)
        self.surfaces = vm_surfaces(cfg, self.src.schema)
        vm_schema_for(cfg, self.src.schema, None)  # refuse a VM feature the data lacks before any FM forward
        self.widths = self.embedding_widths() if cfg.distill.fm_embeddings else None
        self.schema = vm_schema_for(cfg, self.src.schema, self.widths)
        self.vm_data = out / "data"
        self.run_cfg = online_run_config(cfg, self.vm_data)
        self.trainer: DistillTrainer | None = None

    def embedding_widths(self) -> dict[str, int]:
        """The FM embeddings' widths, from the newest version's outputs on a few rows: the VM's features are
        fixed before the first window, which may have no FM version old enough to label it."""
        _, versions = fm_versions(self.fm)
        model = _load_version(versions[-1], self.src.schema, self.device, self.pg)
        files = self.src.partition_files(self.src.partitions()[0])
        batch = next(iter(ParquetLoader(files, self.src.schema, 8, drop_last=False)))
        with torch.no_grad():
            out = model(batch.to(self.device))
        return {n: int(e.shape[1]) for n, e in _extras(out, tuple(self.cfg.distill.fm_embeddings),
                                                       "distill.fm_embeddings").items()}

    def start_trainer(self) -> DistillTrainer:
        fm_model = None
        if self.cfg.distill.param_sharing != "none":  # the FM as it was before the VM's first window
            first = Dataset(self.vm_data).partitions()[0]
            v = sharing_version(fm_versions(self.fm)[1], first_ts(self.src, [first]))
            fm_model = _load_version(v, self.src.schema, self.device, self.pg)
        plain, lr_scale, _ = build_plain(self.run_cfg, self.schema, self.vm_data, fm_model, self.cfg)
        check_budget(int(plain.flops_per_example()), self.cfg.vm.flops_budget)
        self.trainer = DistillTrainer(self.run_cfg, self.out, self.vm_data, arm=self.cfg.arm(), teacher=None,
                                      trunk_width=plain.head.out_dim, num_tasks=len(self.schema.tasks),
                                      resume=True, schema=self.schema, plain=plain, lr_scale=lr_scale)
        return self.trainer

    def _side(self, spec: str, folder: str, part: str, embeddings: tuple[str, ...]) -> pa.Table:
        """One window's side table, generated now from the versions published now."""
        if self.knowledge_dir and folder == "knowledge":
            return given_side_table(self.knowledge_dir, self.fm, self.src, self.cfg.distill.lag, [part],
                                    list(embeddings))
        out = self.out / folder / part
        shutil.rmtree(out, ignore_errors=True)  # not trained yet: label it with today's versions
        _, versions = fm_versions(spec)
        return side_table(spec, versions, str(self.src.root), out, [part], embeddings=embeddings,
                          lag=self.cfg.distill.lag, batch_size=max(self.cfg.data.batch_size, 1024),
                          threads=self.cfg.train.threads)

    def prepare(self, part: str) -> pa.Table | None:
        """The window's teacher side table (the FM's, or the domain FM's) and its VM rows (with the FM
        embeddings of the versions published now); returns the teacher's side table."""
        d = self.cfg.distill
        kd, emb = self.cfg.arm().distils, tuple(d.fm_embeddings)
        side = self._side(self.fm, "knowledge", part, emb) if (kd and not d.hierarchical) or emb else None
        teacher = side if kd and not d.hierarchical else None
        if kd and d.hierarchical:
            teacher = self._side(d.hierarchical, "knowledge_domain", part, ())
        lut = None
        if emb:
            lut = embedding_lookup(side, list(emb))
            for name, width in self.widths.items():
                if lut[name].shape[1] == 0:  # no row of this window has an FM version: zeros, as generate
                    lut[name] = np.zeros((len(lut["example_id"]), width), np.float32)
        shutil.rmtree(self.vm_data / part, ignore_errors=True)  # untrained: rebuilt with this window's FM
        build_vm_dataset(self.src.root, self.surfaces, self.vm_data, lut, [part], self.schema)
        return teacher

    def window(self, part: str, side: Any) -> dict[str, Any]:
        """Progressive validation, adapter refit, one pass of training and a checkpoint, for one window."""
        tr, cfg = self.trainer, self.cfg
        files = Dataset(self.vm_data).partition_files(part)
        bs = cfg.data.batch_size
        try:
            ev = short_metrics(tr.evaluate(batches=ParquetLoader(files, self.schema, cfg.data.eval_batch_size
                                                                 or bs)))
        except EvalDataError:
            ev = None
        teacher = None
        coverage = {"rows_with_teacher": 0, "fm_versions_used": []}
        if side is not None:
            teacher = KnowledgeTable.from_side_table(side, self.schema.task_names,
                                                     age_unit=window_len(self.src))
            coverage = teacher_coverage(side.filter(pc.is_in(side.column("surface"), value_set=pa.array(
                self.surfaces, pa.int32()))))
            if cfg.distill.student_adapter.enabled:
                lab = read_labels(files, self.schema)
                adapter = StudentAdapter(len(self.schema.tasks), len(self.schema.surfaces),
                                         cfg.distill.student_adapter)
                teacher.fit_adapter(adapter, lab["example_id"], lab["surface"], lab["labels"], lab["mask"])
        tr.teacher = teacher
        loader = ParquetLoader(files, self.schema, bs, drop_last=cfg.train.compile,
                               shuffle_units=cfg.data.shuffle, seed=cfg.train.seed + len(tr.windows_done))
        loss_sum, steps, rows = 0.0, 0, 0
        for batch in loader:
            try:
                loss_sum += tr.train_step(batch)
            except TrainError as e:
                raise TrainError(f"window {part}, {e}") from None
            steps += 1
            rows += batch.batch_size
        tr.windows_done.append(part)
        tr.save_checkpoint()
        ne = None if ev is None else {k: v["ne"] for k, v in ev["metrics"].items() if k.startswith("all/")}
        rec = {"kind": "distill_online", "window": part, "rows": rows, "steps": steps,
               "loss": loss_sum / max(steps, 1), "rows_with_teacher": coverage["rows_with_teacher"],
               "fm_versions_used": coverage["fm_versions_used"], "progressive_ne": ne}
        tr.log.write(rec, tr.step)
        return rec


def distill_online(cfg: DistillConfig, fm: str, data: str, out: str | Path, *,
                   knowledge_dir: str | None = None, stop_event: threading.Event | None = None,
                   settle_s: float = SETTLE_S) -> dict[str, Any]:
    """Distil window by window until told to stop (see the module docstring); returns the summary, also
    RUN/distill_online_summary.json."""
    out = Path(out)
    device = resolve_device(cfg.train.device)
    with process_group(device) as pg:
        return _distill_online(OnlineDistill(cfg, fm, data, out, knowledge_dir, device, pg), stop_event,
                               settle_s)


def _distill_online(run: OnlineDistill, stop_event: threading.Event | None, settle_s: float
                    ) -> dict[str, Any]:
    cfg, out = run.cfg, run.out
    check_out_folder(out, run.sources)
    started = rundir.holds_run(out)  # a window was trained and checkpointed
    if (out / DISTILL_JSON).exists():
        if started:  # a restart: same FM, data and recipe, or RUN/data would mix them
            check_resume(out, cfg, run.sources, allow=False)
        else:  # a start that failed before its first window: built again from today's inputs and config
            clear_failed_start(out)
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out / DISTILL_TOML)
    atomic_write_text(out / DISTILL_JSON, json.dumps({"sources": run.sources.record(), "online": True,
                                                      "recipe": recipe(cfg)}, indent=2))
    t = cfg.train
    stop = StopFlag(out, stop_event)
    (out / STOP_FILE).unlink(missing_ok=True)
    windows: list[dict[str, Any]] = []
    try:
        if started and (run.vm_data / "schema.toml").exists():  # a restart: after the windows trained
            run.start_trainer()
        done = run.trainer.windows_done if run.trainer else []
        watch = PartitionWatch(run.src, done, first=t.online_first, until=t.online_until, settle_s=settle_s)
        idle_since, reason = time.monotonic(), ""
        while not reason:
            part, reason = watch.wait_next(stop, idle_since, t.online_max_idle_s, t.online_poll_s)
            if part is None:
                continue
            side = run.prepare(part)
            if run.trainer is None:
                run.start_trainer()
            windows.append(run.window(part, side))
            watch.trained(part)
            idle_since = time.monotonic()
            if t.online_until and part >= t.online_until:
                reason = f"reached train.online_until = {t.online_until}"
            elif stop():
                reason = stop.reason
        summary = {"windows": windows, "stopped": reason,
                   "windows_done": list(run.trainer.windows_done) if run.trainer else [],
                   "quarantined": [{"window": k, "reason": v["reason"]}
                                   for k, v in watch.quarantined.items()],
                   "steps": run.trainer.step if run.trainer else 0}
        atomic_write_text(out / SUMMARY, json.dumps(summary, indent=2))
        return summary
    finally:
        stop.restore()
        if run.trainer is not None:
            run.trainer.close()
