"""Reading run and sweep folders for ``opengem report``, tolerant of missing or damaged pieces.

A report is most wanted exactly when something went wrong (a run died before evaluation, a log line was
cut by a crash), so nothing here raises for a missing or unreadable file: it records a note that the page
shows instead. Only a path that is not a run or sweep folder at all is an error.
"""

from __future__ import annotations

import csv
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from opengem.errors import OpengemError

RUN_FILES = ("config.toml", "metrics.jsonl", "train_summary.json", "eval.json")
ONLINE_SUMMARY = "online_summary.json"  # opengem train --online (train/online.py)
SWEEP_FILES = ("scaling.csv", "fits.json", "scaling.png")
# the studies of `opengem scale` as the report reads them: (runs table, summary, resolved config) per design;
# a folder is the first whose table or summary it holds (the sweep's names first: older reports read them)
STUDY_FILES = (("scaling.csv", "fits.json", "sweep.toml"),
               ("isoflop_runs.csv", "isoflop.json", "isoflop.toml"),
               ("ablation_runs.csv", "ablation.json", "ablation.toml"))
# optional: -> reliability curves. Long (columns surface, task, p, y) or as `opengem predict` writes it
# (surface, one probability column per task, <task>_label beside it)
PREDICTIONS = "predictions.parquet"


class ReportError(OpengemError, ValueError):
    pass


@dataclass
class RunData:
    path: Path
    name: str
    config_text: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] | None = None
    eval: dict[str, Any] | None = None
    reliability: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def kind(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("kind") == kind]

    @property
    def model(self) -> str:
        for src in (self.summary or {}, self.eval or {}, *self.kind("setup")):
            if src.get("model"):
                return str(src["model"])
        return str(self.config.get("model", {}).get("name", "?"))

    def final_metrics(self) -> tuple[dict[str, dict[str, Any]] | None, str]:
        """Per surface/task metrics and where they came from: eval.json, else training's final eval."""
        if self.eval and isinstance(self.eval.get("metrics"), dict):
            return self.eval["metrics"], "eval.json"
        if self.summary and isinstance(self.summary.get("final_eval"), dict):
            if self.kind("online_eval"):
                return self.summary["final_eval"], "metrics.jsonl (progressive evaluation of the last window)"
            return self.summary["final_eval"], "train_summary.json (final evaluation during training)"
        return None, ""

    def oracle(self) -> dict[str, Any]:
        o = (self.eval or {}).get("oracle")
        return o if isinstance(o, dict) else {}


@dataclass
class SweepData:
    path: Path
    name: str
    csv_header: list[str] = field(default_factory=list)
    csv_rows: list[list[str]] = field(default_factory=list)
    fits: Any = None
    pngs: dict[str, bytes] = field(default_factory=dict)
    sweep_toml: str | None = None
    files: tuple[str, str, str] = STUDY_FILES[0]  # which study's (table, summary, config) these are
    runs: list[str] = field(default_factory=list)  # run folders under runs/ (opengem scale's layout)
    notes: list[str] = field(default_factory=list)


def is_sweep(path: Path) -> bool:
    return any((path / f).exists() for f in SWEEP_FILES) or _study_files(path) != STUDY_FILES[0]


def _study_files(path: Path) -> tuple[str, str, str]:
    return next((f for f in STUDY_FILES if (path / f[0]).exists() or (path / f[1]).exists()), STUDY_FILES[0])


def is_run(path: Path) -> bool:
    return any((path / f).exists() for f in RUN_FILES)


def _read_json(path: Path, notes: list[str]) -> Any:
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        notes.append(f"{path.name}: unreadable ({e}); ignored")
        return None


def load_run(path: str | Path, name: str | None = None) -> RunData:
    path = Path(path)
    run = RunData(path=path, name=name or path.name)
    cfg = path / "config.toml"
    if cfg.exists():
        run.config_text = cfg.read_text()
        try:
            run.config = tomllib.loads(run.config_text)
        except tomllib.TOMLDecodeError as e:
            run.notes.append(f"config.toml: not valid TOML ({e}); shown as text")
    else:
        run.notes.append("no config.toml")
    m = path / "metrics.jsonl"
    if m.exists():
        for i, line in enumerate(m.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                run.notes.append(f"metrics.jsonl line {i}: not JSON (cut by a crash?); skipped")
                continue
            if isinstance(rec, dict):
                run.records.append(rec)
    else:
        run.notes.append("no metrics.jsonl: no training curves")
    run.summary = _read_json(path / "train_summary.json", run.notes)
    online = _read_json(path / ONLINE_SUMMARY, run.notes)
    if run.summary is None and (online is not None or run.kind("online_train")):
        _read_online(run, online if isinstance(online, dict) else None)
    elif run.summary is None and run.records and run.records[-1].get("kind") == "error":
        last = run.records[-1]
        run.notes.append(f"training stopped with an error at step {last.get('step')}: {last.get('error')}")
    elif run.summary is None and not any("train_summary" in n for n in run.notes):
        run.notes.append("no train_summary.json (training did not finish?)")
    run.eval = _read_json(path / "eval.json", run.notes)
    if run.eval is None and not any("eval.json" in n for n in run.notes):
        run.notes.append(f"no eval.json (run `opengem evaluate --run {path}` to add it)")
    if (path / PREDICTIONS).exists():
        try:
            run.reliability = reliability_from_predictions(path / PREDICTIONS)
        except (OSError, ValueError, KeyError) as e:
            run.notes.append(f"{PREDICTIONS}: unreadable ({e}); calibration shown as ratios")
    return run


def _read_online(run: RunData, online: dict[str, Any] | None) -> None:
    """An online run (``opengem train --online``) in the report's terms: each window's training as a
    ``train`` point and its progressive evaluation (the window scored by the version before it, then
    trained on) as an ``eval`` point, at the steps trained so far; its summary from online_summary.json,
    the last window's progressive metrics as its final ones."""
    steps, examples, seconds = 0, 0, 0.0
    converted: list[dict[str, Any]] = []
    last_eval: dict[str, Any] | None = None
    for rec in run.records:
        if rec.get("kind") == "online_eval" and isinstance(rec.get("metrics"), dict):
            converted.append({"kind": "eval", "step": steps, "loss": rec.get("loss"),
                              "metrics": rec["metrics"], "window": rec.get("window")})
            last_eval = rec
        elif rec.get("kind") == "online_train" and isinstance(rec.get("steps"), int):
            steps += rec["steps"]
            examples += int(rec.get("rows") or 0)
            eps = rec.get("examples_per_s")
            if isinstance(eps, (int, float)) and eps > 0 and rec.get("rows"):
                seconds += rec["rows"] / eps
            converted.append({"kind": "train", "step": steps, "loss": rec.get("loss"), "examples_per_s": eps,
                              "window": rec.get("window")})
    run.records += converted
    windows = len([r for r in converted if r["kind"] == "train"])
    run.summary = {"steps": (online or {}).get("steps", steps), "examples": examples,
                   "train_seconds": seconds or None,
                   "examples_per_s": examples / seconds if seconds else None,
                   "final_eval": last_eval["metrics"] if last_eval else None}
    stopped = (online or {}).get("stopped") or "still running, or stopped before writing online_summary.json"
    run.notes.append(f"an online run: {windows} window(s) trained, {(online or {}).get('versions', '?')} "
                     f"version(s) published ({stopped}); its evaluation is progressive: each window scored "
                     "by the version before it, then trained on; the metrics are the last window's")


def load_sweep(path: str | Path, name: str | None = None) -> SweepData:
    path = Path(path)
    sw = SweepData(path=path, name=name or path.name, files=_study_files(path))
    table, summary, config = sw.files
    c = path / table
    if c.exists():
        try:
            with c.open(newline="") as f:
                rows = list(csv.reader(f))
            sw.csv_header, sw.csv_rows = (rows[0], rows[1:]) if rows else ([], [])
            short = [i for i, row in enumerate(sw.csv_rows, 2) if len(row) != len(sw.csv_header)]
            if short:  # a file cut short (or edited): a row missing fields is no point to plot
                sw.notes.append(f"{table} line {short[0]}: {len(sw.csv_rows[short[0] - 2])} fields, the "
                                f"header has {len(sw.csv_header)} (cut short?); {len(short)} such row(s) "
                                "left out")
                sw.csv_rows = [row for row in sw.csv_rows if len(row) == len(sw.csv_header)]
        except (OSError, csv.Error, UnicodeDecodeError) as e:
            sw.notes.append(f"{table}: unreadable ({e})")
    else:
        sw.notes.append(f"no {table}")
    sw.fits = _read_json(path / summary, sw.notes)
    if sw.fits is None and not (path / summary).exists():
        sw.notes.append(f"no {summary}")
    for p in sorted(path.glob("*.png"), key=lambda p: (p.name != "scaling.png", p.name)):
        sw.pngs[p.name] = p.read_bytes()
    if not sw.pngs:
        sw.notes.append("no scaling.png")
    if (path / config).exists():
        sw.sweep_toml = (path / config).read_text()
    if (path / "runs").is_dir():
        # not the runs a re-run with another config moved aside (runs/NAME.old-<time>): not this sweep's
        sw.runs = sorted(str(p) for p in (path / "runs").iterdir()
                         if p.is_dir() and is_run(p) and ".old-" not in p.name)
    return sw


def reliability(p: np.ndarray, y: np.ndarray, bins: int = 10) -> tuple[list[float], list[float]]:
    """(mean prediction, observed rate) per equal-count bin of predictions: a reliability curve."""
    order = np.argsort(p, kind="mergesort")
    chunks = [c for c in np.array_split(order, min(bins, max(1, p.size))) if c.size]
    return [float(p[c].mean()) for c in chunks], [float(y[c].mean()) for c in chunks]


def reliability_from_predictions(path: Path) -> dict[str, tuple[list[float], list[float]]]:
    """Reliability curves per ``surface/task`` (and ``all/task``) from a predictions Parquet file."""
    import pyarrow.parquet as pq

    names = pq.read_schema(path).names
    if {"task", "p", "y"} <= set(names):
        t = pq.read_table(path, columns=["surface", "task", "p", "y"]).to_pydict()
        surf = np.asarray(t["surface"], dtype=object)
        task = np.asarray(t["task"], dtype=object)
        p = np.asarray(t["p"], dtype=np.float64)
        y = np.asarray(t["y"], dtype=np.float64)
    else:  # opengem predict's layout: one row per example
        tasks = [n[: -len("_label")] for n in names if n.endswith("_label") and n[: -len("_label")] in names]
        if not tasks:
            raise KeyError("neither columns task, p, y nor <task> with <task>_label")
        t = pq.read_table(path, columns=["surface", *tasks, *(f"{k}_label" for k in tasks)]).to_pydict()
        parts = [(np.asarray(t["surface"], dtype=object), np.full(len(t["surface"]), k, dtype=object),
                  np.asarray(t[k], dtype=np.float64),
                  np.asarray([np.nan if v is None else v for v in t[f"{k}_label"]], dtype=np.float64))
                 for k in tasks]
        surf, task, p, y = (np.concatenate([x[i] for x in parts]) for i in range(4))
    seen = ~np.isnan(y)  # unobserved labels say nothing about calibration
    surf, task, p, y = surf[seen], task[seen], p[seen], y[seen]
    out: dict[str, tuple[list[float], list[float]]] = {}
    for tk in sorted(set(task.tolist())):
        sel_t = task == tk
        for s in sorted(set(surf[sel_t].tolist())):
            sel = sel_t & (surf == s)
            out[f"{s}/{tk}"] = reliability(p[sel], y[sel])
        out[f"all/{tk}"] = reliability(p[sel_t], y[sel_t])
    return out


def load_inputs(paths: list[str | Path]) -> tuple[list[RunData], list[SweepData]]:
    """Classify each path as a run or a sweep folder; names made unique for legends and tables."""
    runs: list[RunData] = []
    sweeps: list[SweepData] = []
    names: dict[str, int] = {}
    for raw in paths:
        path = Path(raw)
        if not path.is_dir():
            raise ReportError(f"{path}: no such folder (give a run folder or a scaling sweep folder)")
        base = path.resolve().name or str(path)
        names[base] = names.get(base, 0) + 1
        name = base if names[base] == 1 else f"{base} ({names[base]})"
        if is_run(path):
            runs.append(load_run(path, name))
        elif is_sweep(path):
            sweeps.append(load_sweep(path, name))
        else:
            raise ReportError(f"{path}: neither a run folder (none of {', '.join(RUN_FILES)}) nor a "
                              f"study folder (none of {', '.join(SWEEP_FILES)}, nor an iso-FLOP or ablation "
                              "study's isoflop.json / ablation.json)")
    return runs, sweeps




def metric_keys(metric_dicts: list[dict[str, Any]]) -> list[str]:
    """surface/task keys in a stable order, the all/<task> aggregates last (as `opengem evaluate`)."""
    keys = {k for d in metric_dicts for k in d}
    return sorted(keys, key=lambda k: (k.startswith("all/"), k))
