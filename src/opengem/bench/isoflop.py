"""``opengem scale --design isoflop``: the compute-optimal (iso-FLOP) study.

A one-pass sweep that gives every size the same rows measures under-training, not scaling: a bigger model
is starved of data. Here the budget is fixed instead: at each total training budget C (training FLOPs =
3 x forward FLOPs/example x examples, the usual forward + backward convention) every size of every family
trains on rows = C / (3 x its forward FLOPs/example), so a bigger model sees fewer rows, and the best size
at each budget is the compute-optimal one. All rows come from ONE simulated stream generated once into
OUT/data; the days are split train (all but the last two) / validation (the day before the last) / test
(the last day). Validation chooses (learning rate, size); test is only reported.

Steps, in order (each run's result is OUT/runs/<name>/result.json; a killed study resumes from them):
1. learning rate per family: a small grid (``lr_grid``) at the smallest budget on one rung of the family's
   ladder (``lr_size``), seeds 0 .. ``lr_seeds``-1, lowest mean validation NE wins; the rate is reused at
   every budget and size of that family. ``lr_check`` reruns the grid's neighbours of the chosen rate at the
   largest budget's best size, which says whether the choice transfers to 30x the compute.
   ``lr_sizes = "each"`` runs the grid (and its extension) on every rung and trains each size at its own rate.
   ``lr_budgets = "each"`` runs the grid at every budget instead and uses each budget's own choice there
   (session 12 measured the smallest budget's choice under-tuning DCNv2 at the two largest budgets by up to
   0.016 NE). ``lr_extend`` > 0 walks past the grid's edge, one rate at a time, while the best rate tried
   is the highest or the lowest, so that every family's chosen rate is bracketed by worse ones.
2. every (budget, family, size) at the family's rate, seed 0;
3. the best size per (budget, family) by validation NE, rerun with seeds 1 .. seeds-1. With
   ``size_seeds`` > 1 the ``size_finalists`` sizes with the lowest seed-0 validation NE first run seeds
   1 .. size_seeds-1 and the lowest mean validation NE over seeds 0 .. size_seeds-1 is the budget's size
   (session 19: a 0.0008 seed-0 difference chose between two sizes whose five-seed validation means tied and
   whose test NE differed by 0.0095).
4. with ``frontier_test_rows`` >= 0, the frontier runs (each budget's size and rate, every seed) are scored
   again on that many test rows (0 = the whole test day) from their checkpoints: the rule has chosen by then,
   so more test rows narrow the frontier's intervals without touching a choice. Each worker scores its
   share of the runs in one pass over each day (bench/frontier_scoring.py).
The summary (bench/isoflop_report.py) turns the runs into the frontier, fitted laws, efficiency ratios.

Each family's rule is a chain of batches of runs that do not depend on one another (the grid's rates, a
budget's sizes, the extra seeds), and families never depend on each other; with ``workers`` > 1 the study
trains that many runs at once, each in its own process (bench/isoflop_worker.py, forked from a server
that imported it once: bench/worker_process.py), longest first.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from opengem.bench.frontier_scoring import eval_batches, frontier_tests
from opengem.bench.frontier_scoring import (
    frontier_test as frontier_test,  # imported from here by results scripts
)
from opengem.bench.isoflop_rule import Job, family_rule, run_name, run_rules
from opengem.bench.run_identity import config_sha256, is_same_run
from opengem.bench.size_ladder import FamilySweep, check_metric, selection_ne, size_overrides
from opengem.bench.worker_process import publish_config, running_config, train_in_worker_process
from opengem.config import ConfigError, load_config, save_config
from opengem.data.commit import atomic_write_text
from opengem.errors import TrainError

REPO = Path(__file__).resolve().parents[3]
BUDGETS = ("small", "default", "large")


CALIBRATE_CHOICES = ("none", "platt", "offset")  # a study's calibrate: none, or train.calibration.METHODS
TRAIN_WINDOWS = ("all", "latest", "latest_rows")  # IsoflopConfig.train_window
EVAL_SAMPLES = ("first", "spread")  # IsoflopConfig.eval_sample
LATEST_DAY_WINDOWS = ("latest", "latest_rows")  # the train_windows that read the latest days (day_rows)


@dataclass
class IsoflopConfig:
    """One study: the recipe every run starts from, the budgets, the families' size ladders, the lr rule."""

    base: str = "tiny.toml"  # run recipe; relative paths: next to this file, then the working dir
    overrides: list[str] = field(default_factory=list)  # applied to every run (data.sim.* size the stream)
    budgets: list[float] = field(default_factory=list)  # total training FLOPs per run, ascending
    families: list[FamilySweep] = field(default_factory=list)  # each with >= 3 sizes (its ladder)
    run_families: list[str] = field(default_factory=list)  # the families run without --families; [] = all
    seeds: int = 3  # runs at each budget's best size (seed 0 included)
    lr_grid: list[float] = field(default_factory=lambda: [1e-3, 3e-3, 1e-2])  # [] = the recipe's lr
    lr_size: int = 0  # ladder rung the lr grid runs on, at the smallest budget
    lr_check: bool = True  # rerun the neighbouring rates at the largest budget's best size
    # smallest: choose the rate at the smallest budget and reuse it everywhere | each: choose it per budget
    lr_budgets: str = "smallest"
    # one: the rate chosen on rung lr_size trains every size | each: the grid runs on every rung and each size
    # trains at its own rate (session 28: the rate chosen on a new bottom rung, 3e-3, made GEM's other sizes
    # worse at three of four budgets; larger models usually want smaller rates)
    lr_sizes: str = "one"
    # seeds 0 .. lr_seeds-1 of every rate of the grid; the rate with the lowest mean validation NE wins.
    # Session 13: one seed's validation NE chose a rate that tested worse over 9 seeds in 2 of 8 cells.
    lr_seeds: int = 1
    # up to this many rates beyond the grid, one at a time, while a budget's best rate is the highest or the
    # lowest tried there (the grid's ratio at that edge: 1e-2 -> 3e-2, 1e-3 -> 3e-4); 0 = the grid alone.
    # Session 26's default study chose its grid's top rate for GEM and Wukong at every budget, never bracketed
    lr_extend: int = 0
    # seeds 0 .. size_seeds-1 at each of the size_finalists sizes with the lowest seed-0 validation NE; the
    # lowest mean validation NE over them is each budget's size. 1 = seed 0 alone chooses (the original rule)
    size_seeds: int = 1
    size_finalists: int = 3
    metric: str = "tasks"  # tasks: mean over tasks of the all-surface NE | surface_task | one key
    reference: str = "gem"  # the family whose frontier the others' compute is measured against
    bootstrap: int = 1000  # resamples of seeds for the efficiency ratio's interval
    eval_rows: int = 0  # validation and test each on this many rows (eval_sample says which); 0 = all rows
    # which eval_rows rows: first = the days' first rows, in whole eval batches (in a time-ordered log, the
    # first minutes after midnight: the slice nearest the training days); spread = whole row groups spread
    # evenly over the day (data.loader.spread_units), the day's mix at the same cost. A study switched from
    # one to the other rescores its finished runs from their final checkpoints and trains none again
    eval_sample: str = "first"
    # none | platt | offset: after training, fit each run's calibration (opengem calibrate) on its validation
    # rows and report test calibrated (the uncalibrated test metrics stay in result.json as
    # test_uncalibrated; validation, which chooses rates and sizes, is the model's own)
    calibrate: str = "none"
    # the frontier's test NE: -1 = each run's own test rows (eval_rows); 0 = the whole test day; N = its
    # first N rows (whole eval batches). Only the frontier runs (each budget's chosen size and rate, every
    # seed) are scored again, from their final checkpoints once the rule has chosen them; the rule never
    # sees these numbers. The test slice's own noise moved cells by up to 0.003 NE (session 21)
    frontier_test_rows: int = -1
    # with calibrate = platt | offset and frontier_test_rows >= 0: -1 = the frontier runs keep the
    # calibration fitted on their eval_rows validation rows; 0 = refit it on the whole validation day (N = its
    # first N rows) before the rescoring (a 16,384-row slice holds ~57 conversions per surface x task cell)
    frontier_calibration_rows: int = -1
    min_steps: int = 8  # refuse a plan in which some run gets fewer optimizer steps than this
    max_epochs: float = 1.0  # refuse a plan in which some run reads the training days more often
    # Which training rows a run reads. all: row groups drawn (shuffled) from every training day, so every
    # budget's rows span the same days; latest: the latest whole training days that hold the run's rows (a
    # ranker with a fixed training budget trains on its most recent window; in the simulator the value of a
    # feature cross drifts day by day, drift_rad_per_day); latest_rows: the same days read in time order
    # (data.shuffle = false; data.shuffle_window still decides how each day's row groups mix), the first
    # batches dropped (data.skip_batches) so that the run ends on the newest rows, as a ranker trained on its
    # log in time order is. Needs day=NNN partitions.
    train_window: str = "all"
    # runs trained at once, each in its own process (set train.threads so that workers x threads fits the
    # cores); 1 = one after another in this process. The rule and every run's result are the same either way
    workers: int = 1


def default_config_path(budget: str) -> Path:
    """configs/isoflop.toml for ``default``, configs/isoflop-<budget>.toml otherwise."""
    if budget not in BUDGETS:
        raise ConfigError(f"--budget must be one of {', '.join(BUDGETS)} (got {budget!r})")
    name = "isoflop.toml" if budget == "default" else f"isoflop-{budget}.toml"
    for p in (REPO / "configs" / name, Path("configs") / name):
        if p.exists():
            return p
    raise ConfigError(f"configs/{name} not found: run from the repository root or pass --config")


def load_isoflop_config(path: str | Path, overrides: list[str] | None = None,
                        families: list[str] | None = None) -> IsoflopConfig:
    """Load, resolve ``base`` and keep only ``families`` (in the order given) when it is not None."""
    cfg = load_config(IsoflopConfig, path, overrides)
    base = Path(cfg.base)
    if not base.is_absolute():
        near = Path(path).parent / base
        base = near if near.exists() else base
    if not base.exists():
        raise ConfigError(f"{path}: base = {cfg.base!r}: run recipe not found")
    cfg.base = str(base.resolve())
    every = [f.name for f in cfg.families]
    # checked before --families narrows the study (it may leave the reference out); a study's own saved
    # config (run_families set, families already narrowed) was checked when it was first loaded
    if cfg.reference not in every and not cfg.run_families:
        raise ConfigError(f"{path}: reference = {cfg.reference!r} is not one of the families "
                          f"({', '.join(every)})")
    check_metric(cfg.metric, str(path))
    if families is None and cfg.run_families:
        families = list(cfg.run_families)
    if families is not None:
        have = {f.name: f for f in cfg.families}
        unknown = [f for f in families if f not in have]
        if unknown:
            raise ConfigError(f"--families / run_families: {', '.join(unknown)} not in {path} "
                          f"(have: {', '.join(have)})")
        cfg.families = [have[f] for f in families]
        cfg.run_families = list(families)
    validate_isoflop(cfg, str(path))
    return cfg


def validate_isoflop(cfg: IsoflopConfig, where: str = "isoflop") -> None:
    def need(ok: bool, msg: str) -> None:
        if not ok:
            raise ConfigError(f"{where}: {msg}")

    need(len(cfg.budgets) >= 2, f"budgets: need >= 2 training-FLOP budgets (got {cfg.budgets})")
    need(all(b > 0 for b in cfg.budgets) and list(cfg.budgets) == sorted(set(cfg.budgets)),
         f"budgets must be positive, distinct and ascending (got {cfg.budgets})")
    need(bool(cfg.families), "no [[families]]")
    names = [f.name for f in cfg.families]
    need(all(names) and len(set(names)) == len(names), f"every family needs a unique name (got {names})")
    for f in cfg.families:
        n = len(size_overrides(f))
        need(n >= 1, f"family {f.name!r} has no sizes")
        need(cfg.lr_size < n, f"lr_size = {cfg.lr_size} but family {f.name!r} has {n} sizes")
    need(cfg.seeds >= 1, f"seeds must be >= 1 (got {cfg.seeds})")
    need(cfg.lr_seeds >= 1, f"lr_seeds must be >= 1 (got {cfg.lr_seeds})")
    need(cfg.lr_extend >= 0, f"lr_extend must be >= 0 (got {cfg.lr_extend})")
    need(cfg.size_seeds >= 1 and cfg.size_finalists >= 1,
         f"size_seeds and size_finalists must be >= 1 (got {cfg.size_seeds}, {cfg.size_finalists})")
    need(all(lr > 0 for lr in cfg.lr_grid), f"lr_grid values must be > 0 (got {cfg.lr_grid})")
    need(cfg.lr_size >= 0, f"lr_size must be >= 0 (got {cfg.lr_size})")
    need(cfg.lr_budgets in ("smallest", "each"),
         f"lr_budgets must be smallest or each (got {cfg.lr_budgets!r})")
    need(cfg.lr_sizes in ("one", "each"), f"lr_sizes must be one or each (got {cfg.lr_sizes!r})")
    need(cfg.calibrate in CALIBRATE_CHOICES,
         f"calibrate must be none, platt or offset (got {cfg.calibrate!r})")
    need(cfg.workers >= 1, f"workers must be >= 1 (got {cfg.workers})")
    need(cfg.train_window in TRAIN_WINDOWS,
         f"train_window must be one of {', '.join(TRAIN_WINDOWS)} (got {cfg.train_window!r})")
    need(cfg.bootstrap >= 0 and cfg.min_steps >= 1 and cfg.max_epochs > 0 and cfg.eval_rows >= 0,
         "bootstrap >= 0, min_steps >= 1, max_epochs > 0 and eval_rows >= 0")
    need(cfg.eval_sample in EVAL_SAMPLES,
         f"eval_sample must be {' or '.join(EVAL_SAMPLES)} (got {cfg.eval_sample!r})")
    for key in ("frontier_test_rows", "frontier_calibration_rows"):
        need(getattr(cfg, key) >= -1, f"{key}: -1 (off), 0 (all) or a row count (got {getattr(cfg, key)})")


# --------------------------------------------------------------------------- the plan (pure arithmetic)
@dataclass
class PlannedRun:
    """One (budget, family, size) point: how many rows its budget buys."""

    family: str
    size: int
    budget: int  # index into budgets
    flops_budget: float  # C asked for
    fwd_flops: int  # forward FLOPs / example
    steps: int
    examples: int  # steps x batch size: the rows actually read
    train_flops: float  # 3 x fwd x examples: C as spent (rounded to whole batches)
    epochs: float  # examples / training rows


def rows_for_budget(flops_budget: float, fwd_flops: int, batch_size: int) -> tuple[int, int]:
    """(steps, examples) that spend ``flops_budget`` training FLOPs: rows = C / (3 x forward FLOPs),
    rounded to whole batches (at least one)."""
    if fwd_flops <= 0 or batch_size <= 0:
        raise ConfigError(f"forward FLOPs/example ({fwd_flops}) and batch size ({batch_size}) must be > 0")
    steps = max(1, round(flops_budget / (3.0 * fwd_flops) / batch_size))
    return steps, steps * batch_size


def plan_grid(budgets: list[float], fwd_flops: dict[str, list[int]], batch_size: dict[str, int],
              train_rows: int, min_steps: int = 1, max_epochs: float = 1.0) -> list[PlannedRun]:
    """Every (budget, family, size) with its rows (``batch_size`` per family); a ConfigError naming every
    run that would get fewer than ``min_steps`` steps or read the training rows more than ``max_epochs``
    times."""
    plan, bad = [], []
    fixes: set[str] = set()
    for b, c in enumerate(budgets):
        for fam, ladder in fwd_flops.items():
            for i, fwd in enumerate(ladder):
                steps, ex = rows_for_budget(c, fwd, batch_size[fam])
                run = PlannedRun(fam, i, b, float(c), int(fwd), steps, ex, 3.0 * fwd * ex, ex / train_rows)
                if steps < min_steps:
                    bad.append(f"{fam} size {i} at C={c:.3g}: {steps} steps < min_steps {min_steps}")
                    fixes.add("raise the smallest budgets or shrink the batch (steps = budget / (3 x FLOPs "
                              "per example x batch), whatever the rows), or lower min_steps")
                if run.epochs > max_epochs + 1e-9:
                    bad.append(f"{fam} size {i} at C={c:.3g}: {ex} rows = {run.epochs:.2f} passes over "
                               f"the {train_rows} training rows > max_epochs {max_epochs}")
                    fixes.add("give it more training rows (data.sim.rows, or a bigger --data), lower the "
                              "largest budgets, or raise max_epochs")
                plan.append(run)
    if bad:
        more = f"; and {len(bad) - 4} more" if len(bad) > 4 else ""
        raise ConfigError("isoflop plan: " + "; ".join(bad[:4]) + more + " (" + "; ".join(sorted(fixes))
                          + ")")
    return plan


def format_plan(plan: list[PlannedRun], lrs: int, seeds: int, size_seeds: int = 1, size_finalists: int = 1,
                lr_budgets: int = 1, lr_extend: int = 0, lr_check: bool = True, lr_each_size: bool = False
                ) -> str:
    """The grid as a table, plus the run count of the whole study (grid + lr grid, at ``lr_budgets`` budgets,
    on one rung or on every rung with ``lr_each_size`` + the size choice's seeds + extra seeds)."""
    lines = [f"{'family':<8}{'size':>5}{'C':>10}{'MFLOP/ex':>10}{'steps':>8}{'rows':>10}{'epochs':>8}"]
    for r in plan:
        lines.append(f"{r.family:<8}{r.size:>5}{r.flops_budget:>10.3g}{r.fwd_flops / 1e6:>10.3f}"
                     f"{r.steps:>8d}{r.examples:>10d}{r.epochs:>8.3f}")
    fams = sorted({r.family for r in plan})
    budgets = len({r.budget for r in plan})
    ladders = {fam: len({r.size for r in plan if r.family == fam}) for fam in fams}
    rungs = sum(ladders.values()) if lr_each_size else len(fams)  # the rungs the lr grid runs on, per budget
    n = len(plan) + rungs * lr_budgets * max(lrs - 1, 0)
    for fam in fams:  # per budget: the seeds of the size choice's other finalists, then the frontier's seeds
        ladder = ladders[fam]
        others = (min(size_finalists, ladder) - 1) * (size_seeds - 1) if size_seeds > 1 else 0
        n += budgets * (others + max(seeds, size_seeds) - 1)
    more = ([f"up to {2 * len(fams)} lr-transfer checks"] if lr_check and lrs > 0 else []) + (
        [f"up to {rungs * lr_budgets * lr_extend} rates beyond the grid's edges (each may move the "
         "family's runs at that budget to the new rate)"] if lr_extend and lrs > 0 else [])
    lines.append(f"{len(plan)} grid runs; with the lr grid and the extra seeds about {n} runs"
                 + "".join(f" (+ {m})" for m in more))
    return "\n".join(lines)


# --------------------------------------------------------------------------- runs
def study_splits(ds: Any) -> tuple[str, str, str]:
    """(train, validation, test) partition specs: days but the last two / the day before the last / the
    last day; a dataset with named splits uses @train / @valid / @test."""
    from opengem.data.splits import NAMED, TIME, layout

    parts = ds.select("@all")
    kind = layout(parts)
    if kind == NAMED and {"train", "valid", "test"} <= set(parts):
        return "@train", "@valid", "@test"
    if kind != TIME or len(parts) < 3:
        raise ConfigError(f"{ds.root}: the study needs >= 3 day=NNN partitions (train, validation, test) "
                          f"or named train/valid/test splits (have: {', '.join(parts)})")
    return ",".join(parts[:-2]), parts[-2], parts[-1]


@dataclass
class Study:
    """What every run of a study shares: the config, the data and its splits, the base run configs."""

    cfg: IsoflopConfig
    out: Path
    data: Path
    train_spec: str
    valid_spec: str
    test_spec: str
    train_rows: int
    extra: list[str]
    fwd: dict[str, list[int]] = field(default_factory=dict)
    sizes: dict[str, list[list[str]]] = field(default_factory=dict)
    day_rows: list[tuple[str, int]] = field(default_factory=list)  # train_window = latest: days, oldest first

    def run_config(self, fam: FamilySweep, size: int, steps: int, lr: float | None, seed: int) -> Any:
        from opengem.train.config import load_run_config

        # train.steps goes in first so that a study override such as train.lr_decay=cosine (which needs
        # steps > 0) validates; the run's own step count replaces it below.
        ovr = ["train.progress=false", "train.eval_every=0", "train.epochs=1", f"train.steps={max(steps, 1)}",
               *self.cfg.overrides,
               *fam.overrides, f"model.name={fam.model or fam.name}", *self.sizes[fam.name][size],
               *self.extra]
        rc = load_run_config(self.cfg.base, ovr)
        rc.data.path = str(self.data)
        rc.data.train, rc.data.eval = self.train_spec, self.valid_spec
        if self.cfg.train_window in LATEST_DAY_WINDOWS:
            rc.data.train = latest_days(self.day_rows, steps * rc.data.batch_size)
        if self.cfg.train_window == "latest_rows":
            have = sum(n for d, n in self.day_rows if d in rc.data.train.split(","))
            rc.data.shuffle = False
            rc.data.skip_batches = max(0, have // rc.data.batch_size - steps)
        rc.train.steps = steps
        rc.train.seed = seed
        rc.train.early_stop.patience = 0
        rc.train.final_eval = False  # train_and_test evaluates validation and test itself
        rc.train.warmup_steps = min(rc.train.warmup_steps, max(1, steps // 10))
        if lr is not None:
            rc.train.lr = lr
        rc.validate()
        return rc


def latest_days(day_rows: list[tuple[str, int]], rows: int) -> str:
    """The partition spec of the latest days (``day_rows``: oldest first) that together hold ``rows``; all of
    them when they hold fewer (the plan refuses more than max_epochs passes)."""
    chosen, have = [], 0
    for day, n in reversed(day_rows):
        chosen.append(day)
        have += n
        if have >= rows:
            break
    return ",".join(reversed(chosen))


def finished_run(rc: Any, run_dir: Path, test_spec: str, eval_rows: int = 0, calibrate: str = "none",
                 sample: str = "first") -> dict[str, Any] | None:
    """RUN/result.json when it was written for the identical resolved config and evaluation, else None."""
    rec = _result_for(rc, run_dir, test_spec, eval_rows, sample)
    return rec if rec is not None and rec.get("calibrate", "none") == calibrate else None


def _trained_result(rc: Any, run_dir: Path) -> dict[str, Any] | None:
    """RUN/result.json when it was written for the identical resolved config (however it was evaluated)."""
    done = run_dir / "result.json"
    if not done.exists():
        return None
    rec = json.loads(done.read_text())
    return rec if is_same_run(rc, run_dir, rec.get("config_sha256")) else None


def _result_for(rc: Any, run_dir: Path, test_spec: str, eval_rows: int, sample: str = "first"
                ) -> dict[str, Any] | None:
    """RUN/result.json when it was written for the identical resolved config, test spec and evaluation rows
    (whatever its calibration), else None."""
    rec = _trained_result(rc, run_dir)
    return rec if rec is not None and _scored_as(rec, rc, test_spec, eval_rows, sample) else None


def _eval_fields(rc: Any, test_spec: str, eval_rows: int, sample: str) -> dict[str, Any]:
    """The fields of a result that say which rows it was scored on (``eval_sample`` only when not "first",
    so that results written before the knob keep matching)."""
    fields = {"test_spec": test_spec, "eval_batches": eval_batches(rc, eval_rows)}
    return fields if sample == "first" else {**fields, "eval_sample": sample}


def _scored_as(rec: dict[str, Any], rc: Any, test_spec: str, eval_rows: int, sample: str) -> bool:
    """Whether the result ``rec`` was scored on the rows these settings name."""
    return (rec.get("test_spec"), rec.get("eval_batches"), rec.get("eval_sample", "first")) == (
        test_spec, eval_batches(rc, eval_rows), sample)


def eval_loader(holder: Any, spec: str, eval_rows: int, sample: str = "first") -> tuple[Any, int]:
    """(batches, max_batches) of the ``eval_rows`` rows of ``spec`` the study scores: the first ones in
    whole eval batches, or (``sample`` = spread) whole row groups spread over the partitions (0 = all).
    ``holder``: a Trainer or an OpenRun."""
    from opengem.train.data import make_loader

    if sample == "spread":
        return make_loader(holder.ds, spec, holder.cfg.data, train=False, spread_rows=eval_rows), 0
    return make_loader(holder.ds, spec, holder.cfg.data, train=False), eval_batches(holder.cfg, eval_rows)


def _score(holder: Any, spec: str, eval_rows: int, sample: str, on_logits: Any = None) -> dict[str, Any]:
    """Metrics of ``holder``'s model now on the rows of ``spec`` the study scores (``on_logits``: an observer
    of each batch's logits, see ``evaluate_model``). A Trainer evaluates through its own ``evaluate`` (which
    first detaches a training pipeline's prefetched lookups)."""
    from opengem.train.evaluate import evaluate_model

    batches, max_batches = eval_loader(holder, spec, eval_rows, sample)
    if hasattr(holder, "evaluate"):
        return holder.evaluate(batches=batches, max_batches=max_batches, on_logits=on_logits)["metrics"]
    return evaluate_model(holder.model, batches, holder.ds.schema, holder.device,
                          max_batches=max_batches, on_logits=on_logits)["metrics"]


def train_and_test(rc: Any, run_dir: Path, test_spec: str, eval_rows: int = 0, calibrate: str = "none",
                   sample: str = "first") -> tuple[dict[str, Any], bool]:
    """Train one run, then evaluate it on the validation (``data.eval``) and test partitions, each on
    ``eval_rows`` of their rows (0 = all; ``sample``: the first ones, or spread over the day, see
    :func:`eval_loader`); with ``calibrate`` (platt | offset) the run's calibration is fitted on those
    validation rows, written to RUN/calibration.json and test is evaluated again through it. Reuses
    RUN/result.json when it was written for the identical resolved config and evaluation; a run trained
    for the same config but scored on other rows is scored again from its final checkpoint
    (:func:`rescore_finished_run`), not trained again. Returns (record, trained now)."""
    from opengem.train.trainer import Trainer

    trained = _trained_result(rc, run_dir)
    if trained is not None and _scored_as(trained, rc, test_spec, eval_rows, sample):
        if trained.get("calibrate", "none") == calibrate:
            return trained, False
        if trained.get("calibrate", "none") == "none":  # finished uncalibrated: calibrate it now
            return calibrate_finished_run(trained, run_dir, test_spec, eval_rows, calibrate, sample), False
    if trained is not None and _final_checkpoint(run_dir) is not None:
        return rescore_finished_run(trained, rc, run_dir, test_spec, eval_rows, calibrate, sample), False
    ident = config_sha256(rc)
    done = run_dir / "result.json"
    with Trainer(rc, run_dir, rc.data.path, force=True) as tr:
        s = tr.fit()
        valid, test, test_raw = _score_run(tr, run_dir, test_spec, eval_rows, calibrate, sample)
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    setup = [r for r in records if r.get("kind") == "setup"][-1]
    rec = {"config_sha256": ident, **_eval_fields(rc, test_spec, eval_rows, sample),
           "steps": s["steps"], "examples": s["examples"],
           "flops_per_example": s["flops_per_example"], "train_seconds": s["train_seconds"],
           "examples_per_s": s["examples_per_s"], "dense_params": setup.get("dense_params"),
           "embedding_params": setup.get("embedding_params"), "valid": valid, "test": test,
           "calibrate": calibrate, "test_uncalibrated": test_raw}
    atomic_write_text(done, json.dumps(rec, indent=2))
    return rec, True


def _score_run(holder: Any, run_dir: Path, test_spec: str, eval_rows: int, calibrate: str, sample: str
               ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None]:
    """(validation, test, raw test) of a trained model on the study's rows, one pass over each: with
    ``calibrate`` (platt | offset) the validation pass also keeps the logits its calibration is fitted on
    (written to RUN/calibration.json), and the test pass scores each batch both raw (third) and through
    that fit (second); else the third is None. ``holder``: a Trainer or an OpenRun."""
    from opengem.train.calibrate import CalibratedMetrics, LogitCollector

    if calibrate == "none":
        valid, test = (_score(holder, spec, eval_rows, sample) for spec in (holder.cfg.data.eval, test_spec))
        return valid, test, None
    logits = LogitCollector()
    valid = _score(holder, holder.cfg.data.eval, eval_rows, sample, on_logits=logits)
    fit = _fit_calibration(holder, run_dir, calibrate, logits)
    schema = holder.ds.schema
    calibrated = CalibratedMetrics(fit, list(schema.surfaces), schema.task_names)
    test_raw = _score(holder, test_spec, eval_rows, sample, on_logits=calibrated)
    return valid, calibrated.compute(), test_raw


def _final_checkpoint(run_dir: Path) -> Path | None:
    from opengem.train.checkpoint import CheckpointError
    from opengem.train.evaluate import run_checkpoint

    try:
        return run_checkpoint(run_dir)[0]
    except CheckpointError:  # no checkpoint left (removed, or the run never wrote one): train it again
        return None


def rescore_finished_run(rec: dict[str, Any], rc: Any, run_dir: Path, test_spec: str, eval_rows: int,
                         calibrate: str, sample: str) -> dict[str, Any]:
    """``rec``, the result of a run trained for this config but scored on other rows (another
    ``eval_rows``, ``sample`` or test spec), scored again from its final checkpoint on the rows asked for:
    validation, then (``calibrate``) a calibration fitted on those validation rows, then test. The training
    fields are kept; validation and test are what :func:`train_and_test` would have written right after
    training, since the final checkpoint is the trained model."""
    from opengem.train.evaluate import open_run

    with open_run(run_dir, calibrated=False) as r:
        valid, test, test_raw = _score_run(r, run_dir, test_spec, eval_rows, calibrate, sample)
    rec = {k: v for k, v in rec.items() if k not in ("eval_sample", "calibrated_after_training")}
    rec.update(_eval_fields(rc, test_spec, eval_rows, sample), valid=valid, test=test, calibrate=calibrate,
               test_uncalibrated=test_raw, rescored=True)
    atomic_write_text(run_dir / "result.json", json.dumps(rec, indent=2))
    return rec


def calibrate_finished_run(rec: dict[str, Any], run_dir: Path, test_spec: str, eval_rows: int,
                           calibrate: str, sample: str = "first") -> dict[str, Any]:
    """``rec``, the result of a run finished uncalibrated, calibrated now from the run's final checkpoint as
    ``train_and_test`` would have right after training (fit on the same validation rows, test scored through
    it, the raw test kept as ``test_uncalibrated``) and written back. Validation, which chose the rates and
    sizes, is the model's own either way, so a finished study switched to ``calibrate`` = platt | offset
    rescores its test without retraining anything."""
    from opengem.train.evaluate import open_run

    with open_run(run_dir, calibrated=False) as r:
        _valid, test, _raw = _score_run(r, run_dir, test_spec, eval_rows, calibrate, sample)
    rec.update(calibrate=calibrate, test_uncalibrated=rec["test"], test=test, calibrated_after_training=True)
    atomic_write_text(run_dir / "result.json", json.dumps(rec, indent=2))
    return rec


def _fit_calibration(tr: Any, run_dir: Path, method: str, logits: Any) -> Any:
    """The calibration (platt | offset) of the trained model fitted on the validation rows whose logits
    ``logits`` (a LogitCollector) kept, written to RUN/calibration.json for the run's final checkpoint so
    that ``opengem evaluate`` of the run scores as the study does. ``tr``: the Trainer that just trained it,
    or the run opened from that checkpoint (``evaluate.open_run``)."""
    from opengem.train.calibrate import MIN_POSITIVES, fit_calibration, write_calibration
    from opengem.train.evaluate import run_checkpoint

    schema = tr.ds.schema
    zs, y, m, s = logits.arrays()
    fit = fit_calibration(zs["model"], y, m, s, list(schema.surfaces), schema.task_names, method,
                          MIN_POSITIVES)
    checkpoint, _best = run_checkpoint(run_dir)
    spec = tr.cfg.data.eval
    write_calibration(run_dir, fit, method, MIN_POSITIVES, checkpoint, tr.step, tr.data_path, spec,
                      tr.ds.select(spec), len(y), list(schema.surfaces), schema.task_names)
    return fit


def prepare_study(cfg: IsoflopConfig, out: Path, data_dir: str | Path | None, extra: list[str],
                  log: Callable[[str], None], plan_only: bool = False, study: str = "isoflop") -> Study:
    """Simulate the stream once (or take ``data_dir``), split it, resolve every size and count its FLOPs.

    ``plan_only`` with the simulator: a sample of a few thousand rows per day (same config otherwise, so
    the same schema) into OUT/plan-data, and the training rows the full stream will have from the
    simulator's even split of rows over days; so a plan costs seconds, not the stream's simulation."""
    import pyarrow.parquet as pq

    from opengem.data.dataset import Dataset
    from opengem.data.sim_config import SimConfig
    from opengem.data.sim_core import day_bounds
    from opengem.model.registry import build_model
    from opengem.train.config import load_run_config
    from opengem.train.data import prepare_data

    base = load_run_config(cfg.base, ["train.steps=1", *cfg.overrides, *extra])  # steps: see run_config
    t0 = time.perf_counter()
    simulated = not (data_dir or base.data.path)
    planned_rows = None
    if plan_only and simulated:
        sim = SimConfig.from_dict(dict(base.data.sim))
        planned_rows = int(day_bounds(sim)[-3])  # rows before the last two days (validation, test)
        base.data.sim["rows"] = min(sim.rows, sim.days * 2000)
        data = prepare_data(base.data, out / "plan-data", None)
    else:
        data = prepare_data(base.data, out, data_dir)
    ds = Dataset(data)
    train, valid, test = study_splits(ds)
    rows = planned_rows or sum(pq.ParquetFile(f).metadata.num_rows for f in ds.files(train))
    log(f"{study}: data {data} ({rows} training rows; train {train}, validation {valid}, test {test}) "
        f"ready in {time.perf_counter() - t0:.1f}s")
    st = Study(cfg, out, data, train, valid, test, rows, extra)
    if cfg.train_window in LATEST_DAY_WINDOWS:
        if train.startswith("@"):
            raise ConfigError(f"{data}: train_window = {cfg.train_window} needs day=NNN partitions "
                              f"(have {train})")
        st.day_rows = [(d, sum(pq.ParquetFile(f).metadata.num_rows for f in ds.files(d)))
                       for d in train.split(",")]
    for fam in cfg.families:
        st.sizes[fam.name] = size_overrides(fam)
        ladder = []
        for i in range(len(st.sizes[fam.name])):
            rc = st.run_config(fam, i, 1, None, 0)
            ladder.append(int(build_model(ds.schema, rc.model).flops_per_example()))
        st.fwd[fam.name] = ladder
    return st


def run_study(cfg: IsoflopConfig, out: str | Path, data_dir: str | Path | None = None,
              run_overrides: list[str] | None = None, log: Callable[[str], None] | None = None,
              plan_only: bool = False) -> dict[str, Any]:
    """Run (or resume) the study and write OUT/isoflop.json, OUT/isoflop_runs.csv and OUT/isoflop.png."""
    from opengem.bench.isoflop_report import summarize_study, write_study_outputs

    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, running_config(out, "isoflop.toml"))  # isoflop.toml once the results are written
    t_start = time.perf_counter()
    st = prepare_study(cfg, out, data_dir, list(run_overrides or []), log, plan_only)
    batch = _batch_size(st)
    plan = plan_grid(cfg.budgets, st.fwd, batch, st.train_rows, cfg.min_steps, cfg.max_epochs)
    if plan_only:
        running_config(out, "isoflop.toml").unlink()  # a plan writes no study
        return {"plan": [asdict(p) for p in plan], "train_rows": st.train_rows, "batch_size": batch,
                "plan_text": format_plan(plan, len(cfg.lr_grid), cfg.seeds, cfg.size_seeds,
                                         cfg.size_finalists,
                                         len(cfg.budgets) if cfg.lr_budgets == "each" else 1,
                                         cfg.lr_extend, cfg.lr_check, cfg.lr_sizes == "each")}
    fams = {f.name: f for f in cfg.families}
    cell = {(p.family, p.size, p.budget): p for p in plan}
    records: list[dict[str, Any]] = []
    counter = [0]
    lock = threading.Lock()

    def run(job: Job) -> float:
        p = cell[(job.family, job.size, job.budget)]
        with lock:
            existing = next((r for r in records if r["name"] == job.name), None)
            if existing is not None:
                existing["roles"] = sorted({*existing["roles"], job.role})
                return existing["valid_ne"]
        t1 = time.perf_counter()
        rc = st.run_config(fams[job.family], job.size, p.steps, job.lr, job.seed)
        run_dir = out / "runs" / job.name
        if cfg.workers > 1:
            rec = finished_run(rc, run_dir, st.test_spec, cfg.eval_rows, cfg.calibrate, cfg.eval_sample)
            trained = rec is None
            if trained:
                rec = _train_in_process_of_its_own(out, st, job, run_dir)
                if finished_run(rc, run_dir, st.test_spec, cfg.eval_rows, cfg.calibrate,
                                cfg.eval_sample) is None:
                    raise TrainError(f"isoflop: run {job.name} wrote a result for another config than the "
                                     f"study's ({run_dir / 'result.json'})")
                trained = not (rec.get("calibrated_after_training") or rec.get("rescored"))
        else:
            rec, trained = train_and_test(rc, run_dir, st.test_spec, cfg.eval_rows, cfg.calibrate,
                                           cfg.eval_sample)
        row = {"name": job.name, "family": job.family, "model": fams[job.family].model or job.family,
               "size": job.size, "budget": job.budget, "flops_budget": p.flops_budget, "lr": job.lr,
               "seed": job.seed, "roles": [job.role], "overrides": " ".join(st.sizes[job.family][job.size]),
               "fwd_flops": rec["flops_per_example"], "steps": rec["steps"], "examples": rec["examples"],
               "train_flops": 3.0 * rec["flops_per_example"] * rec["examples"],
               "dense_params": rec["dense_params"], "train_seconds": rec["train_seconds"],
               "examples_per_s": rec["examples_per_s"], "valid_ne": selection_ne(rec["valid"], cfg.metric),
               "test_ne": selection_ne(rec["test"], cfg.metric), "valid": rec["valid"], "test": rec["test"]}
        with lock:
            counter[0] += trained
            records.append(row)
            how = f"{time.perf_counter() - t1:.1f}s" if trained else "reused"
            log(f"isoflop: [{len(records)}] {job.name} ({job.role}): {rec['examples']} rows, "
                f"valid NE {row['valid_ne']:.5f}, test NE {row['test_ne']:.5f}, {how}")
        return row["valid_ne"]

    rules = {fam: family_rule(cfg, fam, len(st.sizes[fam])) for fam in fams}
    choice = run_rules(rules, run, cfg.workers,
                       cost=lambda job: cell[(job.family, job.size, job.budget)].train_flops)
    records.sort(key=lambda r: _record_order(r, list(fams)))
    lr_choice = {fam: choice[fam].lr for fam in fams}  # in the study's family order, not finishing order
    lr_sizes = {fam: choice[fam].lr_sizes for fam in fams}
    lr_grid_res = {fam: choice[fam].lr_grid for fam in fams}
    best = {fam: choice[fam].best for fam in fams}
    size_choice = {fam: choice[fam].size_choice for fam in fams}
    lr_check = {fam: choice[fam].lr_check for fam in fams if choice[fam].lr_check}
    rescored = _score_frontier(cfg, st, out, best, lr_choice, log)
    result = summarize_study(cfg, st, records, lr_choice, lr_grid_res, lr_check, best, plan, size_choice,
                             rescored, lr_sizes=lr_sizes)
    result["elapsed_s"] = time.perf_counter() - t_start
    result["runs_trained_now"] = counter[0]
    write_study_outputs(out, records, result)
    publish_config(out, "isoflop.toml")
    return result


def _score_frontier(cfg: IsoflopConfig, st: Study, out: Path, best: dict[str, list[int]],
                    lr_choice: dict[str, list[Any]], log: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """``frontier_test_rows`` >= 0: every frontier run's test metrics on those rows, by run name."""
    if cfg.frontier_test_rows < 0:
        return {}
    t0 = time.perf_counter()
    # a run's scoring cost is its forward FLOPs per example: every run scores the same rows
    cost = {run_name(fam, size, b, lr_choice[fam][b], seed): st.fwd[fam][size]
            for fam, sizes in best.items() for b, size in enumerate(sizes) for seed in range(cfg.seeds)}

    def score(names: list[str]) -> Any:
        return [out / "runs" / n for n in names], st.test_spec, cfg.frontier_test_rows, 1, \
            cfg.frontier_calibration_rows

    if cfg.workers > 1:
        # one thread per process, as the training runs: a frontier run's scoring is small matmuls and
        # attention that a second thread barely speeds up (the default's 60 runs: 1,794 s with two threads
        # in the study's process, session 22; 725 s in two processes, session 23). Each process scores its
        # share of the runs in one pass over each day (bench/frontier_scoring.py); the shares are balanced
        # on forward FLOPs plus the mean run's, for the lookups and framework work every run has alike
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        shares = balanced_shares(cost, cfg.workers)
        with ProcessPoolExecutor(len(shares), mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(frontier_tests, *score(share)) for share in shares]
            got = {n: r for f in futures for n, r in f.result().items()}
    else:
        got = frontier_tests(*score(list(cost)))
    rescored = {n: got[n] for n in cost}
    rows = {r["rows_scored"] for r in rescored.values()}
    fits = {r.get("calibration_fit_rows") for r in rescored.values()} - {None}
    refit = f", calibration refitted on {'/'.join(map(str, sorted(fits)))} validation rows" * bool(fits)
    log(f"isoflop: {len(rescored)} frontier runs scored on {'/'.join(map(str, sorted(rows)))} test rows"
        f"{refit} in {time.perf_counter() - t0:.1f}s")
    return rescored


def balanced_shares(cost: dict[str, float], parts: int) -> list[list[str]]:
    """``cost``'s names dealt into at most ``parts`` non-empty shares of near-equal total cost plus the mean
    cost per name (largest first, each to the lightest share so far), each share in ``cost``'s order."""
    if not cost:
        return []
    extra = sum(cost.values()) / len(cost)
    loads, shares = [0.0] * min(parts, len(cost)), [[] for _ in range(min(parts, len(cost)))]
    for name in sorted(cost, key=lambda n: -cost[n]):
        i = loads.index(min(loads))
        loads[i] += cost[name] + extra
        shares[i].append(name)
    order = {n: k for k, n in enumerate(cost)}
    return [sorted(share, key=order.__getitem__) for share in shares]


def train_cell(cfg: IsoflopConfig, out: str | Path, data_dir: str | Path | None, family: str, size: int,
               budget: int, lr: float | None, seeds: list[int], extra: list[str] | None = None,
               log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Train more runs of one cell (family, size, budget) of a study's plan into OUT/runs/, as the study
    would: the same stream, rows from the budget and the (overridden) model's FLOPs, the study's names.

    What follow-up measurements need (more seeds of a frontier cell; a variant of it under ``extra``
    overrides, e.g. ``model.head.context=time``, in its own OUT). Returns each run's record with its name."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    out = Path(out)
    fam = next((f for f in cfg.families if f.name == family), None)
    if fam is None:
        have = ", ".join(f.name for f in cfg.families)
        raise ConfigError(f"family {family!r} is not in the study (have: {have})")
    st = prepare_study(cfg, out, data_dir, list(extra or []), log)
    plan = plan_grid(cfg.budgets, st.fwd, _batch_size(st), st.train_rows, cfg.min_steps, cfg.max_epochs)
    p = next((q for q in plan if (q.family, q.size, q.budget) == (family, size, budget)), None)
    if p is None:
        raise ConfigError(f"no cell size {size}, budget {budget} for {family!r} in the study's plan "
                          f"({len(st.sizes[family])} sizes, {len(cfg.budgets)} budgets)")
    recs = []
    for seed in seeds:
        name = run_name(family, size, budget, lr, seed)
        rec, trained = train_and_test(st.run_config(fam, size, p.steps, lr, seed), out / "runs" / name,
                                      st.test_spec, cfg.eval_rows, cfg.calibrate, cfg.eval_sample)
        valid, how = selection_ne(rec["valid"], cfg.metric), "trained" if trained else "reused"
        log(f"isoflop: {name}: {rec['examples']} rows, valid NE {valid:.5f}, {how}")
        recs.append({"name": name, **rec})
    return recs


def _batch_size(st: Study) -> dict[str, int]:
    return {f.name: int(st.run_config(f, 0, 1, None, 0).data.batch_size) for f in st.cfg.families}


_ROLES = ("lr-grid", "grid", "size-choice", "frontier", "lr-check")


def _record_order(r: dict[str, Any], families: list[str]) -> tuple[Any, ...]:
    """Records in the rule's order whatever order they finished in: by first role, budget, family, size,
    rate, seed; so that isoflop_runs.csv is the same with one worker or several."""
    first = min(_ROLES.index(x) for x in r["roles"])
    return (first, r["budget"], families.index(r["family"]), r["size"], r["lr"] or 0.0, r["seed"])


def _train_in_process_of_its_own(out: Path, st: Study, job: Job, run_dir: Path) -> dict[str, Any]:
    """Train one run with bench/isoflop_worker.py in a process of its own, as the study would here."""
    return train_in_worker_process(
        "opengem.bench.isoflop_worker",
        [str(running_config(out, "isoflop.toml")), str(out), str(st.data), job.family, str(job.size),
         str(job.budget), "recipe" if job.lr is None else format(job.lr, "g"), str(job.seed), *st.extra],
        out, run_dir, "isoflop")
