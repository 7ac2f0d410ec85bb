"""``opengem distill`` (single shot): a vertical model trained from an existing FM run, as an ordinary run.

What RUN holds when it is done (besides what every ``opengem train`` run writes: config.toml, run.json,
metrics.jsonl, tb/, checkpoints/, train_summary.json, eval.json after ``opengem evaluate``):

- ``data/``: the VM's dataset: the rows of --data on the VM's surfaces for the selected partitions, with
  the FM embedding columns joined when ``distill.fm_embeddings`` is on, and the VM schema as schema.toml.
  RUN/config.toml names it, so ``opengem evaluate --run RUN`` and ``predict`` need nothing else;
- ``knowledge/`` (and ``knowledge_domain/`` for hierarchical transfer): the FM's side table
  (``opengem generate``'s format, resumable), unless ``--knowledge`` named one;
- ``distill.toml`` (the resolved VM recipe), ``distill.json`` (where the FM, data and knowledge came from)
  and ``distill_summary.json`` (teacher coverage, FM versions used, adapter correction, shared
  parameters, serving FLOPs, the final metrics).

Every step goes through :class:`~opengem.transfer.distill_trainer.DistillTrainer` (the one Trainer), so
precision, compile, checkpoints, ``--resume``, early stopping and SIGINT handling are those of
``opengem train``.
"""

from __future__ import annotations

import copy
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from torch import nn

from opengem.config import ConfigError, save_config, to_dict
from opengem.data.commit import atomic_write_text
from opengem.data.dataset import Dataset
from opengem.data.schema import FeatureSchema
from opengem.errors import UsageError
from opengem.model.heads import MultiSurfaceHead
from opengem.model.registry import build_model
from opengem.train import run_dir as rundir
from opengem.train.config import RunConfig
from opengem.train.distributed import process_group
from opengem.train.env import resolve_device
from opengem.train.trainer import label_base_rates
from opengem.transfer.adapter import StudentAdapter
from opengem.transfer.distill_config import DistillConfig
from opengem.transfer.distill_sources import (
    check_same_schema,
    given_side_table,
    side_table,
    teacher_coverage,
)
from opengem.transfer.distill_trainer import DistillTrainer
from opengem.transfer.fm_runs import fm_schema, fm_versions
from opengem.transfer.generate import _load_version
from opengem.transfer.knowledge import KnowledgeTable, read_labels
from opengem.transfer.representation import embedding_lookup
from opengem.transfer.sharing import share_fm_parameters
from opengem.transfer.versions import FMVersion
from opengem.transfer.vertical import build_vm_dataset, check_budget, derive_vm_schema
from opengem.transfer.windows import window_len

DISTILL_TOML, DISTILL_JSON, SUMMARY = "distill.toml", "distill.json", "distill_summary.json"
# the recipe beyond RUN/config.toml (which the Trainer checks on --resume), compared on --resume
RECIPE_KEYS = ("vm.schema", "vm.flops_budget", "surfaces", "distill.fm_embeddings", "distill.lag",
               "distill.hierarchical", "distill")
# what RUN/data and RUN/knowledge were built from: never changed on --resume, even when allowed
BUILT_FROM = ("fm", "data", "knowledge", "vm.schema", "surfaces", "distill.fm_embeddings", "distill.lag",
              "distill.hierarchical")


@dataclass
class Sources:
    """The command line's inputs, resolved: what a resumed run must be given again."""

    fm: str
    data: str
    knowledge: str | None = None

    def record(self) -> dict[str, Any]:
        return {"fm": self.fm, "data": self.data, "knowledge": self.knowledge}


def resolved_sources(fm: str, data: str, knowledge: str | None) -> Sources:
    run, _, version = fm.partition("@")
    spec = str(Path(run).resolve()) + (f"@{version}" if version else "")
    return Sources(spec, str(Path(data).resolve()), str(Path(knowledge).resolve()) if knowledge else None)


def prepare_run_folder(out: Path, cfg: DistillConfig, src: Sources, *, resume: bool, force: bool,
                       allow_config_change: bool) -> tuple[Path | None, list[str]]:
    """Make ``out`` this distillation's before anything is written into it; returns where --force moved an
    older run and the recipe keys a resume changed. The Trainer claims it again (lock, run id) when
    training starts."""
    if resume and force:
        raise UsageError("--resume continues the run in the folder and --force moves it aside: give one")
    check_out_folder(out, src)
    if rundir.holds_run(out):
        if resume:
            return None, check_resume(out, cfg, src, allow_config_change)
        if not force:
            raise rundir.RunExistsError(f"{out}: holds an earlier run; use --resume to continue it, --force "
                                        f"to move it aside to {out.name}.old-<time>, or another --out")
        with rundir.RunLock(out):
            return rundir.move_aside(out), []
    if (out / DISTILL_JSON).exists():  # a start that failed before training: its inputs may differ
        clear_failed_start(out)
    return None, []


def clear_failed_start(out: Path) -> None:
    """What a distillation that failed before its first checkpoint built (made again from today's inputs)."""
    for name in ("data", "knowledge", "knowledge_domain"):
        shutil.rmtree(out / name, ignore_errors=True)


def check_out_folder(out: Path, src: Sources) -> None:
    """Refuse, before anything is written, an --out that is a file or a dataset, or that holds the inputs:
    distill writes ``OUT/data`` (the VM's rows, schema.toml first) and ``OUT/knowledge``, and rebuilds them
    after a failed start, so a --data or --knowledge inside --out would be overwritten."""
    rundir.check_run_folder(out)
    for flag, path in (("--data", src.data), ("--knowledge", src.knowledge)):
        if path and Path(path).resolve().is_relative_to(out.resolve()):
            raise UsageError(f"{flag} {path}: lies inside --out {out}, whose data/ and knowledge/ distill "
                             "writes; choose another --out")


def check_resume(out: Path, cfg: DistillConfig, src: Sources, allow: bool) -> list[str]:
    try:
        old = json.loads((out / DISTILL_JSON).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{out}: holds a run that `opengem distill` did not make (no {DISTILL_JSON}); "
                         "choose another --out") from None
    new = {**src.record(), **recipe(cfg)}
    before = {**old.get("sources", {}), **old.get("recipe", {})}
    changed = [k for k in new if before.get(k) != new[k]]
    fixed = [k for k in changed if k in BUILT_FROM]
    if fixed:
        raise rundir.ResumeConfigError(
            f"{out}: --resume (or an online restart) with other {', '.join(fixed)} than {DISTILL_JSON} "
            "records: RUN/data and RUN/knowledge were built from them; resume with the same ones or start a "
            "new run")
    if changed and not allow:
        raise rundir.ResumeConfigError(
            f"{out}: --resume (or an online restart) with other distillation settings ({', '.join(changed)} "
            f"differ from {DISTILL_JSON}); resume with the same ones, or add --allow-config-change")
    return changed


def recipe(cfg: DistillConfig) -> dict[str, Any]:
    d = to_dict(cfg)
    out = {}
    for key in RECIPE_KEYS:
        node = d
        for part in key.split("."):
            node = node[part]
        out[key] = node
    return out


def vm_surfaces(cfg: DistillConfig, schema: FeatureSchema) -> list[int]:
    names = cfg.surfaces or list(schema.surfaces)
    bad = [s for s in names if s not in schema.surfaces]
    if bad:
        raise ConfigError(f"surfaces: {bad} not in the dataset's surfaces {list(schema.surfaces)}")
    return [schema.surfaces.index(s) for s in names]


def vm_schema_for(cfg: DistillConfig, schema: FeatureSchema, widths: dict[str, int] | None) -> FeatureSchema:
    try:
        return derive_vm_schema(schema, cfg.vm.schema, widths, name="vm")
    except ValueError as e:  # a feature or task the dataset lacks: the VM recipe does not fit this FM
        raise ConfigError(f"{e}") from None


def build_plain(run_cfg: RunConfig, schema: FeatureSchema, data: Path, fm: nn.Module | None,
                cfg: DistillConfig) -> tuple[nn.Module, dict[int, float], dict[str, int]]:
    """The VM as the Trainer would build it (seeded, output biases at the base rates) with FM parameters
    shared in; returns it, the learning-rate scales of the shared parameters and what was shared."""
    torch.manual_seed(run_cfg.train.seed)
    plain = build_model(schema, run_cfg.model, where="vm.model")
    if run_cfg.train.init_output_bias:
        rates, _ = label_base_rates(Dataset(data), run_cfg.data.train)
        for head in (m for m in plain.modules() if isinstance(m, MultiSurfaceHead)):
            head.init_output_bias(rates)
    mode = cfg.distill.param_sharing
    if fm is None or mode == "none":
        return plain, {}, {}
    shared = share_fm_parameters(plain, fm)
    if not shared:
        raise ConfigError("distill.param_sharing: the VM has no embedding table or layer of the FM's names "
                          "and shapes (keep FM features in [vm.schema], at the FM's vm.model.embedding.d)")
    scale = {"init": 1.0, "lowlr": cfg.distill.sharing_lr_scale, "frozen": 0.0}[mode]
    lr_scale = {id(p): scale for n, p in plain.named_parameters() if n in shared and scale != 1.0}
    return plain, lr_scale, shared


def sharing_version(versions: list[FMVersion], first_ts: int) -> FMVersion:
    """The newest version trained strictly before every row the VM trains or is evaluated on."""
    ok = [v for v in versions if v.trained_through_ts < first_ts]
    if not ok:
        raise ConfigError(f"distill.param_sharing: every FM version trained on rows as new as the VM's first "
                          f"(ts {first_ts}); sharing its weights would leak them: choose later partitions")
    return ok[-1]


def first_ts(ds: Dataset, parts: list[str]) -> int:
    """The oldest example time in ``parts`` (reads only the time column)."""
    col = ds.schema.time_column
    return min(int(pc.min(pq.read_table(f, columns=[col]).column(0)).as_py()) for p in parts
               for f in ds.files(p))


# ----------------------------------------------------------------------------- the run
@dataclass
class Plan:
    """What one distillation reads and writes, resolved before anything is trained."""

    cfg: DistillConfig
    src: Dataset
    fm_run: Path
    versions: list[FMVersion]
    surfaces: list[int]
    train_parts: list[str]
    vm_parts: list[str]


def plan(cfg: DistillConfig, fm: str, data: str) -> Plan:
    src = Dataset(data)
    run, versions = fm_versions(fm)
    check_same_schema(fm_schema(run), src.schema, fm, data)
    if cfg.distill.hierarchical:
        dom, _ = fm_versions(cfg.distill.hierarchical, "distill.hierarchical")
        check_same_schema(fm_schema(dom), src.schema, cfg.distill.hierarchical, data)
    surfaces = vm_surfaces(cfg, src.schema)
    vm_schema_for(cfg, src.schema, None)  # fail on a VM feature the data lacks before any FM forward
    train_parts = src.select(cfg.data.train)
    parts = [*train_parts, *src.select(cfg.data.eval)]
    if cfg.train.early_stop.enabled:
        parts += src.select(cfg.train.early_stop.partition)
    return Plan(cfg, src, run, versions, surfaces, train_parts, list(dict.fromkeys(parts)))


def knowledge(p: Plan, out: Path, src: Sources) -> tuple[pa.Table | None, pa.Table | None]:
    """(FM side table, teacher side table): the teacher is the FM's or, hierarchical, the domain FM's."""
    d, cfg = p.cfg.distill, p.cfg
    emb = tuple(d.fm_embeddings)
    kd = p.cfg.arm().distils
    fm_parts = p.vm_parts if emb else p.train_parts
    side = None
    if (kd and not d.hierarchical) or emb:
        if src.knowledge:
            side = given_side_table(src.knowledge, src.fm, p.src, d.lag, fm_parts, list(emb))
        else:
            side = side_table(src.fm, p.versions, src.data, out / "knowledge", fm_parts, embeddings=emb,
                              lag=d.lag, batch_size=max(cfg.data.batch_size, 1024), threads=cfg.train.threads)
    teacher = side if not d.hierarchical else None
    if kd and d.hierarchical:
        _, dom_versions = fm_versions(d.hierarchical, "distill.hierarchical")
        teacher = side_table(d.hierarchical, dom_versions, src.data, out / "knowledge_domain", p.train_parts,
                             embeddings=(), lag=d.lag, batch_size=max(cfg.data.batch_size, 1024),
                             threads=cfg.train.threads)
    return side, teacher


def build_vm_data(p: Plan, out: Path, side: pa.Table | None) -> tuple[Path, FeatureSchema]:
    emb = p.cfg.distill.fm_embeddings
    lut = embedding_lookup(side, emb) if emb else None
    widths = {n: lut[n].shape[1] for n in emb} if lut else None
    schema = vm_schema_for(p.cfg, p.src.schema, widths)
    return build_vm_dataset(p.src.root, p.surfaces, out / "data", lut, p.vm_parts, schema), schema


def teacher_table(p: Plan, teacher: pa.Table | None, schema: FeatureSchema, vm_data: Path
                  ) -> tuple[KnowledgeTable | None, dict[str, Any] | None]:
    """The teacher by example id, and its coverage of the VM's training rows (refused when it has none)."""
    if teacher is None:
        return None, None
    ids = pa.concat_tables([pq.read_table(f, columns=[schema.example_id_column])
                            for f in Dataset(vm_data).files(",".join(p.train_parts))]).column(0)
    coverage = teacher_coverage(teacher.filter(pc.is_in(teacher.column("example_id"), value_set=ids)))
    if not coverage["rows_with_teacher"]:
        through = max(v.trained_through_ts for v in p.versions)
        raise UsageError(f"no training row of {', '.join(p.train_parts)} is newer than the FM it would learn "
                         f"from (trained through ts {through}): an FM version may only label rows after its "
                         "training data; choose later data.train partitions or an older FM version (RUN@N)")
    return KnowledgeTable.from_side_table(teacher, schema.task_names, age_unit=window_len(p.src)), coverage


def fit_adapter(p: Plan, teacher: KnowledgeTable, data: Path, schema: FeatureSchema) -> float:
    """Refit the Student Adapter on the freshest training partition's labels; returns the mean absolute
    correction it makes to the FM's logits there (0 = the identity it starts as)."""
    d = p.cfg.distill.student_adapter
    adapter = StudentAdapter(len(schema.tasks), len(schema.surfaces), d)
    lab = read_labels(Dataset(data).files(p.train_parts[-1]), schema)
    teacher.fit_adapter(adapter, lab["example_id"], lab["surface"], lab["labels"], lab["mask"])
    raw, _ = teacher.lookup(lab["example_id"], lab["surface"], use_adapter=False)
    cor, _ = teacher.lookup(lab["example_id"], lab["surface"], use_adapter=True)
    ok = np.isfinite(raw)
    return float(np.abs(cor[ok] - raw[ok]).mean()) if ok.any() else 0.0


def distill(cfg: DistillConfig, fm: str, data: str, out: str | Path, *, knowledge_dir: str | None = None,
            resume: bool = False, force: bool = False, allow_config_change: bool = False) -> dict[str, Any]:
    """Train the VM of ``cfg`` from FM run ``fm`` on ``data`` into run folder ``out``; returns the summary
    (also RUN/distill_summary.json)."""
    out = Path(out)
    src = resolved_sources(fm, data, knowledge_dir)
    p = plan(cfg, fm, data)
    moved, recipe_changes = prepare_run_folder(out, cfg, src, resume=resume, force=force,
                                               allow_config_change=allow_config_change)
    out.mkdir(parents=True, exist_ok=True)
    with rundir.RunLock(out):
        side, teacher_side = knowledge(p, out, src)
        vm_data, schema = build_vm_data(p, out, side)
        save_config(cfg, out / DISTILL_TOML)
        atomic_write_text(out / DISTILL_JSON, json.dumps({"sources": src.record(), "recipe": recipe(cfg)},
                                                         indent=2))
    teacher, coverage = teacher_table(p, teacher_side, schema, vm_data)
    adapter_correction = fit_adapter(p, teacher, vm_data, schema) if cfg.distill.student_adapter.enabled \
        else None
    run_cfg = run_config(cfg, p, vm_data)
    dev = resolve_device(run_cfg.train.device)
    with process_group(dev) as pg:
        fm_model = None
        if cfg.distill.param_sharing != "none":
            v = sharing_version(p.versions, first_ts(p.src, p.vm_parts))
            fm_model = _load_version(v, p.src.schema, dev, pg)
        plain, lr_scale, shared = build_plain(run_cfg, schema, vm_data, fm_model, cfg)
        del fm_model
        serving_flops = check_budget(int(plain.flops_per_example()), cfg.vm.flops_budget)
        with DistillTrainer(run_cfg, out, vm_data, arm=cfg.arm(), teacher=teacher,
                            trunk_width=plain.head.out_dim, num_tasks=len(schema.tasks), resume=resume,
                            schema=schema, plain=plain, lr_scale=lr_scale) as trainer:
            summary = trainer.fit()
            aux_params = sum(q.numel() for q in trainer.aux_parameters())
    res = {
        "run": str(out), "moved_aside": str(moved) if moved else None, "recipe_changes_on_resume":
        recipe_changes, "fm": src.fm, "data": src.data,
        "knowledge": src.knowledge or (str(out / "knowledge") if side is not None else None),
        "fm_versions": [{"version": v.version, "trained_through_ts": v.trained_through_ts,
                         "path": str(v.path)} for v in p.versions],
        "teacher_on_training_rows": coverage,
        "hierarchical": cfg.distill.hierarchical or None,
        "surfaces": [p.src.schema.surfaces[s] for s in p.surfaces], "train_partitions": p.train_parts,
        "switches": to_dict(cfg.distill), "serving_flops_per_example": serving_flops,
        "aux_head_params": aux_params, "adapter_mean_abs_correction": adapter_correction,
        "shared_params": {k: int(v) for k, v in shared.items()},
        "fm_embedding_features": [f.name for f in schema.dense if f.name.startswith("fm_")],
        "steps": summary["steps"], "final_eval": summary["final_eval"],
    }
    atomic_write_text(out / SUMMARY, json.dumps(res, indent=2))
    return res


def run_config(cfg: DistillConfig, p: Plan, vm_data: Path) -> RunConfig:
    """RUN/config.toml: the served VM on RUN/data, partition specs resolved to the names they selected."""
    run_cfg = copy.deepcopy(cfg.run_config(str(vm_data.resolve())))
    run_cfg.data.train = ",".join(p.train_parts)
    run_cfg.data.eval = ",".join(p.src.select(cfg.data.eval))
    if run_cfg.train.early_stop.enabled:
        run_cfg.train.early_stop.partition = ",".join(p.src.select(cfg.train.early_stop.partition))
    if run_cfg.train.compile:  # static sequence shapes, as prepare_compile sets for any compiled run
        run_cfg.model.embedding.pad_to_max_len = True
    return run_cfg
