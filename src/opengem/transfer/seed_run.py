"""One seed of the transfer experiment: its data, FM versions, side tables and every arm per lag."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from opengem.data.dataset import Dataset
from opengem.model.registry import ModelConfig, build_model
from opengem.transfer.adapter import StudentAdapter
from opengem.transfer.experiment_config import ExperimentConfig
from opengem.transfer.generate import _load_version, generate, read_side_table
from opengem.transfer.hierarchical import run_hierarchical
from opengem.transfer.knowledge import KnowledgeTable, read_labels
from opengem.transfer.preds import concat_preds
from opengem.transfer.representation import embedding_lookup
from opengem.transfer.vertical import build_vm_dataset, check_budget, derive_vm_schema
from opengem.transfer.vm_train import ArmConfig, ProgressiveStudent
from opengem.transfer.windows import (
    prepare_data,
    train_published_versions,
    version_for_window,
    vm_start_window,
    vm_surfaces,
    vm_train_windows,
    window_len,
)


class SeedRun:
    """Everything for one seed: data, FM versions, side tables, and the arms per lag and surface."""

    def __init__(
        self, cfg: ExperimentConfig, seed: int, out: Path, device: Any, pg: Any, log: Any = print
    ) -> None:
        self.cfg, self.seed, self.device, self.pg, self.log = cfg, seed, device, pg, log
        self.root = out / f"seed{seed}"
        self.root.mkdir(parents=True, exist_ok=True)
        self.data = prepare_data(cfg, seed, self.root)
        self.ds = Dataset(self.data)
        self.schema = self.ds.schema
        self.parts = self.ds.partitions()
        lags = sorted({cfg.lag, *cfg.staleness})
        self.lags = lags
        self.vm_start = vm_start_window(cfg, lags, len(self.parts), str(self.data))
        self.surfaces = vm_surfaces(cfg, list(self.schema.surfaces))
        # a VM recipe that does not fit the data (a feature it lacks) or cannot build (an unknown model, a
        # size below its minimum) is said before the FM versions train, not after
        build_model(derive_vm_schema(self.schema, cfg.vm.schema), cfg.vm.model, where="vm.model")
        # each VM surface's training windows (its own history length); ``windows`` is the longest of them,
        # the span the side tables are generated over (every surface's list is a suffix of it)
        self.surface_windows = {n: vm_train_windows(cfg, lags, self.parts, self.vm_start, n)
                                for n in self.surfaces}
        self.windows = max(self.surface_windows.values(), key=len)
        self.eval_windows = self.parts[self.vm_start + 1 :]
        fm_cfg = copy.deepcopy(cfg.fm)
        fm_cfg.train.seed = seed
        t0 = time.perf_counter()
        self.versions = train_published_versions(fm_cfg, self.data, self.root / "fm", self.parts,
                                                 cfg.publish_every, cfg.fm_versions)
        self.fm_train_s = time.perf_counter() - t0
        self.window_len = window_len(self.ds)
        self.gen: dict[int, dict[str, Any]] = {}

    def side(self, lag: int) -> pa.Table:
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

    def windows_for(self, s: int) -> list[str]:
        """The training windows of the VM of surface index ``s``."""
        return self.surface_windows[self.schema.surfaces[s]]

    def fm_for_sharing(self, lag: int) -> Any:
        k = version_for_window(self.vm_start, self.cfg.publish_every, lag)  # the first VM window's version
        v = next(v for v in self.versions if v.version == k)
        return _load_version(v, self.schema, self.device, self.pg)

    def run_lag(
        self,
        lag: int,
        arms: list[str],
        arm_cfgs: dict[str, ArmConfig] | None,
        kd_results: dict[str, Any] | None = None,
        kd_grid_epochs: int | None = None,
        surface_arm_cfgs: dict[str, dict[str, ArmConfig]] | None = None,
    ) -> dict[str, Any]:
        """Predictions of every arm (and the FM) on the eval windows, per VM surface, at one lag.

        ``kd_results is None``: also every KD grid point, trained ``kd_grid_epochs`` per window (default:
        KD's configured length). ``surface_arm_cfgs[surface]``, when given, replaces ``arm_cfgs`` on that
        surface (per-surface tuning: each surface's own KD point and epochs)."""
        cfg = self.cfg
        grid_epochs = kd_grid_epochs or cfg.epochs_for("kd")
        side = self.side(lag)
        lut = embedding_lookup(side, cfg.fm_embeddings)
        widths = {n: lut[n].shape[1] for n in cfg.fm_embeddings}
        out: dict[str, Any] = {}
        for sname in self.surfaces:
            s = self.schema.surfaces.index(sname)
            vm_dir = self.root / f"vm_{sname}_lag{lag}"
            vm_schema = derive_vm_schema(self.schema, cfg.vm.schema, name=f"vm_{sname}")
            emb_schema = derive_vm_schema(self.schema, cfg.vm.schema, widths, name=f"vm_{sname}_fmemb")
            build_vm_dataset(self.data, [s], vm_dir, lut, self.windows_for(s), emb_schema)
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
                        epochs_per_window=grid_epochs,
                    )
                    grid[tuple(g)] = self.run_arm(a, vm_schema, vm_dir, know, s)
                res["kd_grid"] = grid
            acfgs = surface_arm_cfgs[sname] if surface_arm_cfgs else arm_cfgs
            for name in arms:
                a = acfgs[name] if acfgs else None
                if name == "hierarchical":
                    res[name] = run_hierarchical(self, a, vm_schema, vm_dir, know, side, s, lag)
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
        if model is None:  # the domain FM of the hierarchical arm is not served
            # the budget bounds the VM's own model: an arm that runs FM blocks at serving time (parameter
            # sharing's sequence encoder) adds compute on purpose, is kept out of R and shown on the
            # NE-vs-serving-FLOPs plot beside bigger baseline VMs
            check_budget(st.own_flops, vm_cfg.flops_budget, f"arm {arm.name!r}")
        return st

    def run_arm(
        self, arm: ArmConfig, schema: Any, data_dir: Path, know: Any, s: int, fm: Any = None
    ) -> dict[str, Any]:
        st = self.student(arm, schema, data_dir, fm=fm)
        adapter = (
            StudentAdapter(len(schema.tasks), len(schema.surfaces), self.cfg.adapter) if arm.adapter else None
        )
        preds = []
        adapter_dev = []
        windows = self.windows_for(s)
        for w in windows:
            if w in self.eval_windows:
                preds.append(st.predict(w))
            if w == windows[-1]:
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
        res = concat_preds(preds)
        res["serving_flops"] = st.serving_flops
        res["shared_params"] = int(sum(st.shared.values()))
        res["steps"] = st.steps
        if adapter_dev:
            res["adapter_mean_abs_correction"] = adapter_dev
        return res

    def fm_preds(self, know: Any, res: dict[str, Any]) -> dict[str, Any]:
        ref = next((v for v in res.values() if isinstance(v, dict) and "example_id" in v), None)
        if ref is None:
            ref = next(iter(res["kd_grid"].values()))
        lg, ok = know.lookup(ref["example_id"], ref["surface"], use_adapter=False)
        return {"example_id": ref["example_id"], "logits": lg, "available": ok}
