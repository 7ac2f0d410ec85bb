"""``opengem transfer --config C.toml``: the FM -> VM transfer experiment, all arms on one stream.

Per seed: one simulated stream (or a real dataset cut into day windows); FM versions trained on growing
window sets (``versions.py``); knowledge generated once per example for every staleness level
(``generate.py``); then per VM surface the arms, each trained progressively from window ``vm_start``
(= 1 + the largest lag, so every arm and lag has the same budget: same windows, steps, model) and
evaluated on every later window before training on it:

- baseline: labels only;
- kd: standard KD on the serving head, tuned over ``kd_grid`` (weight, temperature[, mse weight]);
  the best grid point by pooled NE is the reference of R (picked on the evaluation rows, which favours
  KD: R is conservative);
- aux_head: tuned KD through the auxiliary head (serving head labels only) with gradient/label scaling;
- student_adapter: + distil from the Student Adapter refit on each window's labels;
- fm_embeddings: + FM user/ad embeddings (per-version standardised) as VM features;
- param_sharing: + FM embedding-layer components shared into the VM (``share`` mode), and the FM's
  sequence encoder path (``sharing.sequence_encoder``, frozen or low-lr; its serving FLOPs are counted);
- hierarchical: FM -> domain FM (the VM surface's group, aux-head KD + adapter from the FM) -> VM
  (aux-head KD from the domain FM's fresh predictions).

Surface bias: ``surface_bias[s]`` is added to the FM's logits on surface s (a controlled FM
miscalibration, see knowledge.py). Output: OUT/transfer.json, OUT/staleness.png, tables on stdout.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from opengem.config import load_config
from opengem.data.dataset import Dataset
from opengem.model.registry import ModelConfig
from opengem.train.config import RunConfig, TrainConfig
from opengem.transfer.adapter import AdapterConfig, StudentAdapter
from opengem.transfer.vertical import VMConfig, VMSchemaConfig
from opengem.transfer.vm_train import ArmConfig, clone_arm

ALL_ARMS = ("baseline", "kd", "aux_head", "student_adapter", "fm_embeddings", "param_sharing", "hierarchical")


@dataclass
class DataSource:
    kind: str = "sim"  # sim | dataset
    sim: dict[str, Any] = field(default_factory=dict)  # SimConfig overrides (seed comes from seeds)
    path: str = ""  # kind = dataset: a converted canonical dataset
    repartition_days: bool = False  # cut a dataset into day=NNN windows by its time column
    ts_per_day: int = 86400  # time-column units per day (86_400_000 for milliseconds)
    day_offset: int = 0  # added to ts before cutting days (e.g. UTC+8 midnights)
    last_days: int = 0  # keep only the last N days (0 = all)
    row_fraction: float = 1.0  # keep this fraction of rows (hash of example_id), for modest runs


@dataclass
class KDConfig:
    grid: list[list[float]] = field(default_factory=lambda: [[0.5, 1.0], [1.0, 1.0], [1.0, 2.0], [2.0, 1.0]])
    mse_weight: float = 0.0


@dataclass
class AuxConfig:
    grad_scale: float = 1.0
    label_scale: float = 1.0
    weight_scale: float = 1.0  # aux loss weight = tuned KD weight x this


@dataclass
class SharingConfig:
    mode: str = "lowlr"  # init | lowlr | frozen
    lr_scale: float = 0.1
    sequence_encoder: bool = True  # also share the FM's sequence encoder (its serving FLOPs are counted)
    encoder_mode: str = "frozen"  # frozen | lowlr (at lr_scale)


@dataclass
class HierConfig:
    groups: list[list[str]] = field(default_factory=list)  # surface groups; [] = all surfaces in one domain
    model: ModelConfig = field(default_factory=lambda: ModelConfig(name="dcnv2"))
    schema: VMSchemaConfig = field(default_factory=VMSchemaConfig)


@dataclass
class ExperimentConfig:
    data: DataSource = field(default_factory=DataSource)
    fm: RunConfig = field(default_factory=RunConfig)
    vm: VMConfig = field(default_factory=VMConfig)
    train: TrainConfig = field(default_factory=TrainConfig)  # VM optimisers (steps/epochs unused)
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    surfaces: list[str] = field(default_factory=list)  # VM surfaces ([] = all)
    lag: int = 1  # default staleness (versions behind the freshest allowed one)
    staleness: list[int] = field(default_factory=lambda: [0, 1, 2, 4])  # sweep ([] = none)
    sweep_arms: list[str] = field(
        default_factory=lambda: ["kd", "aux_head", "student_adapter", "fm_embeddings"]
    )
    surface_bias: list[float] = field(default_factory=list)
    arms: list[str] = field(default_factory=lambda: list(ALL_ARMS))
    batch_size: int = 256
    epochs_per_window: int = 1
    fm_embeddings: list[str] = field(default_factory=lambda: ["user", "ad"])
    kd: KDConfig = field(default_factory=KDConfig)
    aux: AuxConfig = field(default_factory=AuxConfig)
    adapter: AdapterConfig = field(default_factory=AdapterConfig)
    sharing: SharingConfig = field(default_factory=SharingConfig)
    hierarchical: HierConfig = field(default_factory=HierConfig)
    bootstrap: int = 200
    generate_batch_size: int = 1024
    threads: int = 1

    def validate(self) -> None:
        bad = [a for a in self.arms if a not in ALL_ARMS]
        if bad:
            raise ValueError(f"arms: unknown {bad} (known: {ALL_ARMS})")
        if "baseline" not in self.arms or ("kd" not in self.arms and len(self.arms) > 1):
            raise ValueError("arms: 'baseline' and 'kd' are required (TR and R are relative to them)")
        if not self.kd.grid or any(len(g) not in (2, 3) for g in self.kd.grid):
            raise ValueError("kd.grid: a list of [weight, temperature] or [weight, temperature, mse]")
        if self.lag < 0 or any(s < 0 for s in self.staleness):
            raise ValueError("lag / staleness: must be >= 0")
        if self.sharing.mode not in ("init", "lowlr", "frozen"):
            raise ValueError(f"sharing.mode: init | lowlr | frozen, got {self.sharing.mode!r}")


# --------------------------------------------------------------------------- data
def prepare_data(cfg: ExperimentConfig, seed: int, root: Path) -> Path:
    src = cfg.data
    if src.kind == "sim":
        from opengem.data.sim_config import SimConfig
        from opengem.data.simulate import simulate

        out = root / "data"
        if not (out / "summary.json").exists():
            simulate(SimConfig.from_dict({**src.sim, "seed": seed}), out, force=True)
        return out
    if src.kind != "dataset":
        raise ValueError(f"data.kind: sim | dataset, got {src.kind!r}")
    if not src.repartition_days:
        return Path(src.path)
    out = root.parent / "data_days"  # one cut shared by every seed (seeds vary FM/VM init)
    if (out / "schema.toml").exists():
        return out
    ds = Dataset(src.path)
    t = pa.concat_tables([pq.read_table(f) for f in ds.files("@all")], promote_options="permissive")
    ts = t.column(ds.schema.time_column).to_numpy()
    day = (ts + src.day_offset) // src.ts_per_day
    if src.row_fraction < 1:
        h = t.column(ds.schema.example_id_column).to_numpy().astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        keep = (h >> np.uint64(40)).astype(np.float64) / float(1 << 24) < src.row_fraction
    else:
        keep = np.ones(len(day), bool)
    days = np.unique(day)
    if src.last_days:
        days = days[-src.last_days :]
    tmp = out.with_name(out.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    for i, d in enumerate(days):
        sel = keep & (day == d)
        part = t.filter(pa.array(sel))
        part = part.sort_by([(ds.schema.time_column, "ascending")])
        (tmp / f"day={i:03d}").mkdir(exist_ok=True)
        pq.write_table(part, tmp / f"day={i:03d}" / "part-00000.parquet", row_group_size=20_000)
    ds.schema.save(tmp / "schema.toml")
    tmp.rename(out)
    return out


def _window_len(ds: Dataset) -> float:
    spans = []
    for p in ds.partitions():
        ts = pc.min_max(pq.read_table(ds.files(p)[0], columns=[ds.schema.time_column]).column(0))
        spans.append(ts["max"].as_py() - ts["min"].as_py())
    return float(max(np.median(spans), 1))


# --------------------------------------------------------------------------- arms
def arm_configs(cfg: ExperimentConfig, kd_best: list[float]) -> dict[str, ArmConfig]:
    w, temp = kd_best[0], kd_best[1]
    mse = kd_best[2] if len(kd_best) > 2 else cfg.kd.mse_weight
    kd = ArmConfig("kd", kd_weight=w, kd_temperature=temp, kd_mse_weight=mse)
    aux = clone_arm(
        kd,
        name="aux_head",
        aux_head=True,
        aux_grad_scale=cfg.aux.grad_scale,
        aux_label_scale=cfg.aux.label_scale,
        kd_weight=w * cfg.aux.weight_scale,
    )
    sa = clone_arm(aux, name="student_adapter", adapter=True)
    emb = clone_arm(sa, name="fm_embeddings", fm_embeddings=True)
    share = clone_arm(
        emb,
        name="param_sharing",
        share=cfg.sharing.mode,
        share_lr_scale=cfg.sharing.lr_scale,
        share_sequence_encoder=cfg.sharing.sequence_encoder,
        share_encoder_mode=cfg.sharing.encoder_mode,
    )
    hier = clone_arm(aux, name="hierarchical", teacher="domain")
    return {
        "baseline": ArmConfig(),
        "kd": kd,
        "aux_head": aux,
        "student_adapter": sa,
        "fm_embeddings": emb,
        "param_sharing": share,
        "hierarchical": hier,
    }


class SeedRun:
    """Everything for one seed: data, FM versions, side tables, and the arms per lag and surface."""

    def __init__(
        self, cfg: ExperimentConfig, seed: int, out: Path, device: Any, pg: Any, log: Any = print
    ) -> None:
        from opengem.transfer.versions import train_fm_versions

        self.cfg, self.seed, self.device, self.pg, self.log = cfg, seed, device, pg, log
        self.root = out / f"seed{seed}"
        self.root.mkdir(parents=True, exist_ok=True)
        self.data = prepare_data(cfg, seed, self.root)
        self.ds = Dataset(self.data)
        self.schema = self.ds.schema
        self.parts = self.ds.partitions()
        lags = sorted({cfg.lag, *cfg.staleness})
        self.lags = lags
        self.vm_start = 1 + max(lags)
        if self.vm_start + 1 >= len(self.parts):
            raise ValueError(
                f"{self.data}: {len(self.parts)} windows; lag {max(lags)} needs at least "
                f"{self.vm_start + 2} (raise data.sim.days or lower the staleness)"
            )
        self.windows = self.parts[self.vm_start :]
        self.eval_windows = self.parts[self.vm_start + 1 :]
        fm_cfg = copy.deepcopy(cfg.fm)
        fm_cfg.train.seed = seed
        t0 = time.perf_counter()
        self.versions = train_fm_versions(fm_cfg, self.data, self.root / "fm", self.parts)
        self.fm_train_s = time.perf_counter() - t0
        self.window_len = _window_len(self.ds)
        names = cfg.surfaces or list(self.schema.surfaces)
        bad = [s for s in names if s not in self.schema.surfaces]
        if bad:
            raise ValueError(f"surfaces: {bad} not in the dataset's surfaces {self.schema.surfaces}")
        self.surfaces = names
        self.gen: dict[int, dict[str, Any]] = {}

    def side(self, lag: int) -> pa.Table:
        from opengem.transfer.generate import generate, read_side_table

        out = self.root / f"knowledge_lag{lag}"
        m = generate(
            self.root / "fm",
            self.data,
            out,
            lag=lag,
            partitions=",".join(self.windows),
            batch_size=self.cfg.generate_batch_size,
            threads=self.cfg.threads,
        )
        if m["rows"]:
            self.gen[lag] = m
        return read_side_table(out, self.windows)

    def fm_for_sharing(self, lag: int) -> Any:
        from opengem.transfer.generate import _load_version

        k = self.vm_start - lag  # the version the first VM window may use (trained on k windows)
        v = next(v for v in self.versions if v.version == k)
        return _load_version(v, self.schema, self.device, self.pg)

    def run_lag(
        self,
        lag: int,
        arms: list[str],
        arm_cfgs: dict[str, ArmConfig] | None,
        kd_results: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Predictions of every arm (and the FM) on the eval windows, per VM surface, at one lag."""
        from opengem.transfer.knowledge import KnowledgeTable
        from opengem.transfer.representation import embedding_lookup
        from opengem.transfer.vertical import build_vm_dataset, derive_vm_schema

        cfg = self.cfg
        side = self.side(lag)
        lut = embedding_lookup(side, cfg.fm_embeddings)
        widths = {n: lut[n].shape[1] for n in cfg.fm_embeddings}
        out: dict[str, Any] = {}
        for sname in self.surfaces:
            s = self.schema.surfaces.index(sname)
            vm_dir = self.root / f"vm_{sname}_lag{lag}"
            vm_schema = derive_vm_schema(self.schema, cfg.vm.schema, name=f"vm_{sname}")
            emb_schema = derive_vm_schema(self.schema, cfg.vm.schema, widths, name=f"vm_{sname}_fmemb")
            build_vm_dataset(self.data, [s], vm_dir, lut, self.windows, emb_schema)
            tasks = vm_schema.task_names
            know = KnowledgeTable.from_side_table(side, tasks, cfg.surface_bias, self.window_len)
            res: dict[str, Any] = {"surface": s, "tasks": tasks}
            if kd_results is None:  # tune KD at this lag
                grid = {}
                for g in cfg.kd.grid:
                    a = ArmConfig(
                        f"kd{g}",
                        kd_weight=g[0],
                        kd_temperature=g[1],
                        kd_mse_weight=g[2] if len(g) > 2 else cfg.kd.mse_weight,
                    )
                    grid[tuple(g)] = self.run_arm(a, vm_schema, vm_dir, know, s)
                res["kd_grid"] = grid
            for name in arms:
                a = arm_cfgs[name] if arm_cfgs else None
                if name == "hierarchical":
                    res[name] = self.run_hier(a, vm_schema, vm_dir, know, side, s, lag)
                elif name != "kd" or kd_results is not None:
                    schema = emb_schema if a.fm_embeddings else vm_schema
                    fm = self.fm_for_sharing(lag) if a.share != "none" else None
                    res[name] = self.run_arm(a, schema, vm_dir, know, s, fm)
            res["fm"] = self.fm_preds(know, res)
            out[sname] = res
        return out

    def student(
        self, arm: ArmConfig, schema: Any, data_dir: Path, model: ModelConfig | None = None, fm: Any = None
    ) -> Any:
        from opengem.transfer.vm_train import ProgressiveStudent

        vm_cfg = copy.deepcopy(self.cfg.vm)
        if model is not None:
            vm_cfg.model = model
        t = copy.deepcopy(self.cfg.train)
        t.seed = self.seed
        st = ProgressiveStudent(
            schema,
            vm_cfg,
            arm,
            t,
            str(data_dir),
            self.device,
            self.pg,
            batch_size=self.cfg.batch_size,
            epochs_per_window=self.cfg.epochs_per_window,
            fm_model=fm,
        )
        if model is None and vm_cfg.flops_budget and st.serving_flops > vm_cfg.flops_budget:
            raise ValueError(
                f"vm.flops_budget: arm {arm.name!r} needs {st.serving_flops:,} FLOPs/example, "
                f"over the budget {vm_cfg.flops_budget:,}"
            )
        return st

    def run_arm(
        self, arm: ArmConfig, schema: Any, data_dir: Path, know: Any, s: int, fm: Any = None
    ) -> dict[str, Any]:
        from opengem.transfer.knowledge import read_labels

        st = self.student(arm, schema, data_dir, fm=fm)
        adapter = (
            StudentAdapter(len(schema.tasks), len(schema.surfaces), self.cfg.adapter) if arm.adapter else None
        )
        preds = []
        adapter_dev = []
        for w in self.windows:
            if w in self.eval_windows:
                preds.append(st.predict(w))
            if w == self.windows[-1]:
                break
            if adapter is not None:
                lab = read_labels(st.ds.files(w), schema)
                know.fit_adapter(adapter, lab["example_id"], lab["surface"], lab["labels"], lab["mask"])
                raw, _ = know.lookup(lab["example_id"], lab["surface"], use_adapter=False)
                cor, _ = know.lookup(lab["example_id"], lab["surface"], use_adapter=True)
                ok = np.isfinite(raw)
                adapter_dev.append(float(np.abs(cor[ok] - raw[ok]).mean()) if ok.any() else float("nan"))
            st.train_window(w, know if arm.distils else None)
        know.adapter = None
        res = _concat(preds)
        res["serving_flops"] = st.serving_flops
        res["shared_params"] = int(sum(st.shared.values()))
        res["steps"] = st.steps
        if adapter_dev:
            res["adapter_mean_abs_correction"] = adapter_dev
        return res

    def run_hier(
        self, arm: ArmConfig, vm_schema: Any, vm_dir: Path, know_vm: Any, side: pa.Table, s: int, lag: int
    ) -> dict[str, Any]:
        """FM -> domain FM (surface group) -> VM, window by window; both evaluated on the VM's rows."""
        from opengem.transfer.knowledge import KnowledgeTable, read_labels
        from opengem.transfer.vertical import build_vm_dataset, derive_vm_schema

        cfg = self.cfg
        groups = cfg.hierarchical.groups or [list(self.schema.surfaces)]
        group = next((g for g in groups if self.schema.surfaces[s] in g), None)
        if group is None:
            raise ValueError(f"hierarchical.groups: surface {self.schema.surfaces[s]!r} is in no group")
        gidx = [self.schema.surfaces.index(x) for x in group]
        dom_dir = self.root / f"domain_{'+'.join(group)}_lag{lag}"
        dom_schema = derive_vm_schema(self.schema, cfg.hierarchical.schema, name="domain_fm")
        build_vm_dataset(self.data, gidx, dom_dir, None, self.windows, dom_schema)
        know_dom = KnowledgeTable.from_side_table(
            side, dom_schema.task_names, cfg.surface_bias, self.window_len
        )
        dom_arm = clone_arm(arm, name="domain_fm", adapter=True, teacher="fm")
        dom = self.student(dom_arm, dom_schema, dom_dir, model=cfg.hierarchical.model)
        vm = self.student(arm, vm_schema, vm_dir)
        adapter = StudentAdapter(len(dom_schema.tasks), len(dom_schema.surfaces), cfg.adapter)
        teacher = KnowledgeTable(np.zeros(0, np.int64), np.zeros((0, len(vm_schema.tasks)), np.float32))
        t_idx = [dom_schema.task_names.index(t) for t in vm_schema.task_names]
        vm_preds, dom_preds = [], []
        for w in self.windows:
            if w in self.eval_windows:
                vm_preds.append(vm.predict(w))
                d = dom.predict(w, [s])
                d["logits"] = d["logits"][:, t_idx]
                d["labels"], d["mask"] = d["labels"][:, t_idx], d["mask"][:, t_idx]
                dom_preds.append(d)
            if w == self.windows[-1]:
                break
            lab = read_labels(dom.ds.files(w), dom_schema)
            know_dom.fit_adapter(adapter, lab["example_id"], lab["surface"], lab["labels"], lab["mask"])
            dom.train_window(w, know_dom)
            d = dom.predict(w, [s])
            teacher.add(d["example_id"], d["logits"][:, t_idx])
            vm.train_window(w, teacher)
        res = _concat(vm_preds)
        dp = _concat(dom_preds)
        order = _align(res["example_id"], dp["example_id"])
        res["domain_logits"] = dp["logits"][order]
        res["serving_flops"] = vm.serving_flops
        res["domain_flops"] = dom.serving_flops
        res["steps"] = vm.steps
        return res

    def fm_preds(self, know: Any, res: dict[str, Any]) -> dict[str, Any]:
        ref = next((v for v in res.values() if isinstance(v, dict) and "example_id" in v), None)
        if ref is None:
            ref = next(iter(res["kd_grid"].values()))
        lg, ok = know.lookup(ref["example_id"], ref["surface"], use_adapter=False)
        return {"example_id": ref["example_id"], "logits": lg, "available": ok}


def _concat(preds: list[dict[str, np.ndarray]]) -> dict[str, Any]:
    return {k: np.concatenate([p[k] for p in preds]) for k in preds[0]}


def _align(ref: np.ndarray, other: np.ndarray) -> np.ndarray:
    """Index into ``other`` for each id of ``ref`` (the same rows, possibly another order)."""
    order = np.argsort(other)
    pos = order[np.searchsorted(other[order], ref)]
    if not np.array_equal(other[pos], ref):
        raise RuntimeError("arms were evaluated on different rows (a loader or dataset mismatch)")
    return pos


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-np.clip(x, -30, 30)))


# --------------------------------------------------------------------------- aggregation
def _key_data(
    seed_res: dict[str, Any], arms: list[str], sname: str, t: int
) -> dict[str, dict[str, np.ndarray]]:
    """Per arm p/y on the rows every arm, the FM, and the label mask agree on (one surface x task)."""
    r = seed_res[sname]
    base = r["baseline"]
    ids = base["example_id"]
    fm_ok = r["fm"]["available"][:, t]
    keep = base["mask"][:, t] & fm_ok
    out = {}
    for a in arms:
        pa_ = r[a]
        pos = _align(ids, pa_["example_id"])
        out[a] = {"p": _sigmoid(pa_["logits"][pos, t])[keep], "y": base["labels"][keep, t].astype(np.float64)}
    out["fm"] = {"p": _sigmoid(np.nan_to_num(r["fm"]["logits"][:, t]))[keep], "y": out["baseline"]["y"]}
    if "hierarchical" in arms:
        h = r["hierarchical"]
        pos = _align(ids, h["example_id"])
        out["domain_fm"] = {"p": _sigmoid(h["domain_logits"][pos, t])[keep], "y": out["baseline"]["y"]}
    return out


def aggregate(per_seed: list[dict[str, Any]], arms: list[str], cfg: ExperimentConfig) -> dict[str, Any]:
    from opengem.metrics import auc, calibration
    from opengem.transfer.results import ne_of, ratio, summarize_key

    first = per_seed[0]
    out: dict[str, Any] = {"arms": {a: {} for a in arms}, "fm": {}, "hierarchical": {}}
    for sname, r in first.items():
        for t, task in enumerate(r["tasks"]):
            key = f"{sname}/{task}"
            data = [_key_data(sr, arms, sname, t) for sr in per_seed]
            if any(
                len(d["baseline"]["y"]) == 0 or d["baseline"]["y"].min() == d["baseline"]["y"].max()
                for d in data
            ):
                continue
            stats = summarize_key(data, arms, "baseline", "kd", cfg.bootstrap)
            out["fm"][key] = stats.pop("fm")
            for a in arms:
                m = stats[a]
                m["auc"] = float(np.mean([auc(d[a]["p"], d[a]["y"]) for d in data]))
                m["calibration"] = float(np.mean([calibration(d[a]["p"], d[a]["y"]) for d in data]))
                m["rows"] = int(sum(len(d[a]["y"]) for d in data))
                out["arms"][a][key] = m
            if "hierarchical" in arms:
                ne_dom = float(np.mean([ne_of(d["domain_fm"]["p"], d["domain_fm"]["y"]) for d in data]))
                ne_fm, ne_b = out["fm"][key]["ne"], out["arms"]["baseline"][key]["ne"]
                ne_vm = out["arms"]["hierarchical"][key]["ne"]
                out["hierarchical"][key] = {
                    "fm_ne": ne_fm,
                    "domain_fm_ne": ne_dom,
                    "vm_ne": ne_vm,
                    "baseline_vm_ne": ne_b,
                    "hop1_fm_to_domain_ne_change": ne_dom - ne_fm,
                    "hop2_domain_to_vm_tr": ratio(ne_b - ne_vm, ne_b - ne_dom),
                    "end_to_end_tr": ratio(ne_b - ne_vm, ne_b - ne_fm),
                }
    return out


def tune_kd(seed_res: dict[str, Any], grid: list[list[float]]) -> list[float]:
    """The grid point with the lowest NE averaged over surfaces x tasks (on the first seed)."""
    from opengem.transfer.results import ne_of

    best, best_ne = None, np.inf
    for g in grid:
        nes = []
        for r in seed_res.values():
            run = r["kd_grid"][tuple(g)]
            for t in range(len(r["tasks"])):
                m = run["mask"][:, t]
                if m.any() and 0 < run["labels"][m, t].mean() < 1:
                    nes.append(ne_of(_sigmoid(run["logits"][m, t]), run["labels"][m, t].astype(np.float64)))
        ne = float(np.mean(nes))
        if ne < best_ne:
            best, best_ne = g, ne
    return list(best)


def run_experiment(cfg: ExperimentConfig, out: str | Path, log: Any = print) -> dict[str, Any]:
    from opengem.train.trainer import cpu_threads, process_group, resolve_device
    from opengem.transfer.results import arms_table, staleness_plot, staleness_table

    warnings.filterwarnings("ignore", category=FutureWarning)
    cfg.validate()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    dev = resolve_device("cpu")
    arms = [a for a in ALL_ARMS if a in cfg.arms]
    t0 = time.perf_counter()
    with process_group(dev) as pg, cpu_threads(cfg.threads):
        runs = [SeedRun(cfg, s, out, dev, pg, log) for s in cfg.seeds]
        log(
            f"FM versions ready ({len(runs[0].versions)} per seed); VM windows {runs[0].windows}, "
            f"eval {runs[0].eval_windows}"
        )
        # 1) default lag: tune KD on the first seed, then every arm on every seed
        first = runs[0].run_lag(cfg.lag, [], None)
        kd_best = tune_kd(first, cfg.kd.grid)
        acfg = arm_configs(cfg, kd_best)
        log(f"tuned KD: weight={kd_best[0]} temperature={kd_best[1]}")
        per_seed = []
        for i, r in enumerate(runs):
            res = r.run_lag(cfg.lag, arms, acfg, kd_results={})
            per_seed.append(res)
            log(f"seed {cfg.seeds[i]}: arms done ({time.perf_counter() - t0:.0f}s)")
        main = aggregate(per_seed, arms, cfg)
        # 2) staleness sweep: the sweep arms at every lag (the baseline is lag-free: reuse it)
        sweep: dict[str, Any] = {}
        sweep_arms = [a for a in cfg.sweep_arms if a in arms and a not in ("baseline",)]
        for lag in cfg.staleness:
            if lag == cfg.lag:
                lag_seed = per_seed
            else:
                lag_seed = []
                for i, r in enumerate(runs):
                    res = r.run_lag(lag, [a for a in sweep_arms if a != "baseline"], acfg, kd_results={})
                    for sname in res:
                        res[sname]["baseline"] = per_seed[i][sname]["baseline"]
                    lag_seed.append(res)
            agg = aggregate(lag_seed, ["baseline", *[a for a in sweep_arms if a != "baseline"]], cfg)
            sweep[str(lag)] = {
                a: {k: {"tr": m["tr"], "ne": m["ne"], "r": m["r"]} for k, m in agg["arms"][a].items()}
                for a in agg["arms"]
                if a != "baseline"
            }
            log(f"staleness lag {lag} done ({time.perf_counter() - t0:.0f}s)")
    flops = {}
    for a in arms:
        for sname in per_seed[0]:
            r = per_seed[0][sname][a]
            flops[a] = {
                "serving_flops_per_example": int(r["serving_flops"]),
                "shared_fm_params": int(r.get("shared_params", 0)),
            }
            if a == "hierarchical":
                flops[a]["domain_fm_flops_per_example"] = int(r["domain_flops"])
    gen = [g for r in runs for g in r.gen.values()]
    result = {
        "config": asdict(cfg),
        "kd_tuned": {"weight": kd_best[0], "temperature": kd_best[1]},
        "windows": {"vm": runs[0].windows, "eval": runs[0].eval_windows},
        "soft_labels": "per task, the FM head of the example's own surface",
        "arms": main["arms"],
        "fm": main["fm"],
        "hierarchical": main["hierarchical"],
        "staleness": sweep,
        "serving_flops": flops,
        "adapter_mean_abs_correction": {
            s: per_seed[0][s].get("student_adapter", {}).get("adapter_mean_abs_correction")
            for s in per_seed[0]
        },
        "generation": {
            "examples_per_s": float(np.mean([g["examples_per_s"] for g in gen])) if gen else None,
            "forward_examples_per_s": float(np.mean([g["forward_examples_per_s"] for g in gen]))
            if gen
            else None,
            "rows": int(sum(g["rows"] for g in gen)),
        },
        "fm_train_seconds": [r.fm_train_s for r in runs],
        "seconds": time.perf_counter() - t0,
    }
    (out / "transfer.json").write_text(json.dumps(_jsonable(result), indent=2))
    if sweep:
        staleness_plot(sweep, str(out / "staleness.png"))
    log(arms_table(result, arms))
    if sweep:
        log("\nstaleness sweep (transfer ratio)\n" + staleness_table(sweep))
    log(f"\nwrote {out / 'transfer.json'} ({result['seconds']:.0f}s)")
    return result


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.floating, float)):
        return None if not np.isfinite(x) else float(x)
    if isinstance(x, np.integer):
        return int(x)
    return x


def load_experiment_config(path: str | Path | None, overrides: list[str] | None = None) -> ExperimentConfig:
    cfg = load_config(ExperimentConfig, path, overrides)
    cfg.validate()
    return cfg


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="experiment TOML (configs/transfer*.toml)")
    p.add_argument("--out", default="runs/transfer", help="output folder (transfer.json, staleness.png)")
    p.add_argument("overrides", nargs="*", help="section.key=value overrides")


def run(args: argparse.Namespace) -> int:
    cfg = load_experiment_config(args.config, args.overrides)
    run_experiment(cfg, args.out)
    return 0
