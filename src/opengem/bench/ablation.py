"""``opengem scale --design ablation``: which of GEM's components earn their FLOPs, at equal compute.

Removing a component also removes its FLOPs, so a fair ablation gives the cheaper model the compute it
saved: every configuration (the full model and each ablation) trains on rows = budget / (3 x its own
forward FLOPs/example), the iso-FLOP study's rule (bench/isoflop.py, whose machinery this reuses: one
simulated stream, the same train / validation / test days, the same run config, the same trainer call).
Each configuration runs with the same seeds, and a seed fixes both the initialisation and the order of
the training rows (the loader shuffles with ``train.seed``), so seed s of an ablation and seed s of the
full model read the same rows in the same order, the cheaper one further into the stream: their NE
difference is paired. The learning rate is chosen once, on the full model, by validation NE at the budget
(seed 0, ``lr_grid``; with ``lr_extend``, walked past the grid's edge while the best rate sits on it), and
reused by every configuration: the iso-FLOP rule (validation, never test).

The proxy: each ``[[proxies]]`` variant reruns every configuration cheaper (a fraction of its rows, and/or
``embedding.d`` divided down) and bench/ablation_report.py measures how well its ranking of the
configurations matches the full runs' (Spearman, bootstrap CI over configurations and seeds).

Outputs in OUT: ablation.json (summary), ablation_runs.csv (one row per run), ablation.toml (the resolved
study), runs/<name>/ (every run, with predictions-test.parquet for the full-budget runs, which the paired
bootstrap over test rows needs). A finished run is reused, so a killed study resumes. With ``workers`` > 1
the runs of each stage (the rate grid, the configurations x seeds, the proxies) train that many at a time,
each in a Python process of its own (bench/ablation_worker.py, logs in OUT/logs/), as the iso-FLOP study does.
"""

from __future__ import annotations

import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from opengem.bench.ablation_report import FULL, format_ablation, summarize_ablation, write_ablation_outputs
from opengem.bench.isoflop import (
    CALIBRATE_CHOICES,
    EVAL_SAMPLES,
    REPO,
    TRAIN_WINDOWS,
    IsoflopConfig,
    Study,
    finished_run,
    plan_grid,
    prepare_study,
    run_name,
    train_and_test,
)
from opengem.bench.isoflop_rule import nan_last, next_rate
from opengem.bench.size_ladder import FamilySweep, selection_ne
from opengem.bench.worker_process import publish_config, running_config, train_in_worker_process
from opengem.config import ConfigError, load_config, save_config
from opengem.errors import TrainError, UsageError

_NAME = re.compile(r"^[A-Za-z0-9_.+-]+$")


@dataclass
class Ablation:
    """One configuration: the full model with ``overrides`` applied on top of its size."""

    name: str = ""
    component: str = ""  # what the table says this measures, e.g. "cross-layer attention (off)"
    overrides: list[str] = field(default_factory=list)
    model: str = ""  # model.name ("" = the study's model)


@dataclass
class ProxyVariant:
    """A cheap rerun of every configuration: ``rows_fraction`` of its full-budget rows, at
    ``embedding.d // d_divisor`` (rounded down to a multiple of ``d_multiple``)."""

    name: str = ""
    rows_fraction: float = 1.0
    d_divisor: int = 1
    d_multiple: int = 4
    seeds: int = 0  # seeds 0 .. seeds-1; 0 = the study's seeds


@dataclass
class AblationConfig:
    """One ablation study: the recipe, the full model's size, the budget, the configurations, the proxies."""

    base: str = "tiny.toml"  # run recipe; relative paths: next to this file, then the working dir
    overrides: list[str] = field(default_factory=list)  # applied to every run (data.sim.* size the stream)
    model: str = "gem"
    size: list[str] = field(default_factory=list)  # the full model's size (overrides), before each ablation's
    budget: float = 1.2e9  # training FLOPs of every full-budget run (3 x forward FLOPs/example x rows)
    seeds: int = 5  # paired seeds 0 .. seeds-1 for every configuration
    lr_grid: list[float] = field(default_factory=lambda: [1e-3, 3e-3, 1e-2])  # [] = the recipe's lr
    # while the best rate is the grid's top or bottom, try up to this many more beyond it, one at a time
    # (IsoflopConfig.lr_extend): an edge choice is not a tuned rate
    lr_extend: int = 0
    metric: str = "tasks"  # the NE a run is ranked by (see IsoflopConfig.metric)
    bootstrap: int = 1000  # resamples for every interval
    eval_rows: int = 0  # validation and test each on this many rows (eval_sample says which); 0 = all rows
    # first | spread: the days' first eval_rows rows, or whole row groups spread evenly over each day, as the
    # iso-FLOP study's (IsoflopConfig.eval_sample): the rate, the calibration fit and the paired test rows
    eval_sample: str = "first"
    # none | platt | offset: each run's calibration fitted on its validation rows, as the iso-FLOP study's
    # (IsoflopConfig.calibrate), and test (metrics and the paired predictions) scored through it; the rates
    # are still chosen on the model's own validation NE
    calibrate: str = "none"
    # all | latest | latest_rows: which training rows a run reads, as the iso-FLOP study's
    # (IsoflopConfig.train_window): latest = the newest whole days that hold its rows (a proxy's fewer rows:
    # fewer, still the newest, days); latest_rows = those days in time order, ending on the newest rows
    train_window: str = "all"
    min_steps: int = 5  # refuse a plan in which a full-budget run gets fewer optimizer steps than this
    max_epochs: float = 1.0  # refuse a plan in which a run reads the training days more often
    plan_steps: int = 8  # --plan: time this many training steps per configuration (0 = no time estimate)
    # runs trained at once, each in a process of its own (set train.threads so that workers x threads fits the
    # cores; 1 = in this process, one after another)
    workers: int = 1
    ablations: list[Ablation] = field(default_factory=list)
    proxies: list[ProxyVariant] = field(default_factory=list)


BUDGETS = ("small", "default")  # the recipes in configs/ (the large study is the iso-FLOP one)


def default_config_path(budget: str | None) -> Path:
    """configs/ablation.toml for ``default`` (or None: --budget not given), configs/ablation-<budget>.toml
    otherwise."""
    budget = budget or "default"
    if budget not in BUDGETS:
        raise ConfigError(f"--budget {budget}: the ablation study has a {' and a '.join(BUDGETS)} budget "
                          "(configs/ablation-small.toml, configs/ablation.toml); pass --config for another")
    name = "ablation.toml" if budget == "default" else f"ablation-{budget}.toml"
    for p in (REPO / "configs" / name, Path("configs") / name):
        if p.exists():
            return p
    raise ConfigError(f"configs/{name} not found: run from the repository root or pass --config")


def load_ablation_config(path: str | Path, overrides: list[str] | None = None) -> AblationConfig:
    """Load, resolve ``base`` (next to the file, then the working dir) and validate."""
    cfg = load_config(AblationConfig, path, overrides)
    base = Path(cfg.base)
    if not base.is_absolute() and (Path(path).parent / base).exists():
        base = Path(path).parent / base
    if not base.exists():
        raise ConfigError(f"{path}: base = {cfg.base!r}: run recipe not found")
    cfg.base = str(base.resolve())
    validate_ablation(cfg, str(path))
    return cfg


def validate_ablation(cfg: AblationConfig, where: str = "ablation") -> None:
    def need(ok: bool, msg: str) -> None:
        if not ok:
            raise ConfigError(f"{where}: {msg}")

    names = [a.name for a in cfg.ablations]
    need(bool(names), "no [[ablations]]")
    need(all(_NAME.match(n) for n in names) and len(set(names)) == len(names) and FULL not in names,
         f"every ablation needs a unique name of letters, digits, _ . + - other than {FULL!r} (got {names})")
    need(all(a.overrides for a in cfg.ablations),
         "every ablation needs overrides (else it is the full model)")
    need(cfg.budget > 0, f"budget must be > 0 (got {cfg.budget})")
    need(cfg.seeds >= 2, f"seeds must be >= 2: the intervals resample seeds (got {cfg.seeds})")
    need(all(lr > 0 for lr in cfg.lr_grid), f"lr_grid values must be > 0 (got {cfg.lr_grid})")
    need(cfg.lr_extend >= 0, f"lr_extend must be >= 0 (got {cfg.lr_extend})")
    need(cfg.workers >= 1, f"workers must be >= 1 (got {cfg.workers})")
    need(cfg.eval_sample in EVAL_SAMPLES,
         f"eval_sample must be {' or '.join(EVAL_SAMPLES)} (got {cfg.eval_sample!r})")
    need(cfg.calibrate in CALIBRATE_CHOICES,
         f"calibrate must be none, platt or offset (got {cfg.calibrate!r})")
    need(cfg.train_window in TRAIN_WINDOWS,
         f"train_window must be one of {', '.join(TRAIN_WINDOWS)} (got {cfg.train_window!r})")
    need(cfg.bootstrap >= 0 and cfg.min_steps >= 1 and cfg.max_epochs > 0 and cfg.eval_rows >= 0
         and cfg.plan_steps >= 0,
         "bootstrap >= 0, min_steps >= 1, max_epochs > 0, eval_rows >= 0 and plan_steps >= 0")
    pnames = [p.name for p in cfg.proxies]
    need(all(_NAME.match(n) for n in pnames) and len(set(pnames)) == len(pnames),
         f"every proxy needs a unique name of letters, digits, _ . + - (got {pnames})")
    for p in cfg.proxies:
        need(0 < p.rows_fraction <= 1 and p.d_divisor >= 1 and p.d_multiple >= 1 and p.seeds >= 0,
             f"proxy {p.name!r}: rows_fraction in (0, 1], d_divisor >= 1, d_multiple >= 1, seeds >= 0")
        need(p.rows_fraction < 1 or p.d_divisor > 1, f"proxy {p.name!r} is not cheaper than the full runs")


def configurations(cfg: AblationConfig) -> list[FamilySweep]:
    """The full model and every ablation as one-size 'families' of the iso-FLOP machinery: the full size
    first, then the ablation's overrides (so an ablation may change a size knob, e.g. embedding.d)."""
    full = FamilySweep(name=FULL, model=cfg.model, overrides=list(cfg.size), sizes=[{}])
    return [full] + [FamilySweep(name=a.name, model=a.model or cfg.model, overrides=[*cfg.size, *a.overrides],
                                 sizes=[{}]) for a in cfg.ablations]


def as_isoflop(cfg: AblationConfig) -> IsoflopConfig:
    """The iso-FLOP config whose one budget and one-size families are this study's configurations."""
    return IsoflopConfig(base=cfg.base, overrides=list(cfg.overrides), budgets=[cfg.budget],
                         families=configurations(cfg), seeds=cfg.seeds, lr_grid=list(cfg.lr_grid),
                         metric=cfg.metric, eval_rows=cfg.eval_rows, eval_sample=cfg.eval_sample,
                         calibrate=cfg.calibrate,
                         min_steps=cfg.min_steps, max_epochs=cfg.max_epochs, train_window=cfg.train_window)


def proxy_steps(full_steps: int, variant: ProxyVariant) -> int:
    """A proxy run's optimizer steps: ``rows_fraction`` of the full-budget run's (at least one)."""
    return max(1, round(full_steps * variant.rows_fraction))


def narrowed_d(d: int, variant: ProxyVariant) -> int:
    return max(variant.d_multiple, d // variant.d_divisor // variant.d_multiple * variant.d_multiple)


def run_config(st: Study, fam: FamilySweep, steps: int, lr: float | None, seed: int,
               variant: ProxyVariant | None = None) -> Any:
    """The iso-FLOP run config of one configuration; narrowed for a proxy variant with ``d_divisor``."""
    rc = st.run_config(fam, 0, steps, lr, seed)
    if variant is not None and variant.d_divisor > 1:
        rc.model.embedding.d = narrowed_d(rc.model.embedding.d, variant)
        rc.validate()
    return rc


# --------------------------------------------------------------------------- the plan
def plan_text(plan: dict[str, Any]) -> str:
    """Rows, steps and (when timed) estimated seconds per configuration and proxy, and the study's total."""
    lines = [f"budget {plan['budget']:.3g} training FLOPs per full run; {plan['train_rows']} training rows, "
             f"batch {plan['batch_size']}; {plan['seeds']} paired seeds; lr grid {plan['lr_grid']}"
             + (f" (up to {plan['lr_extend']} more beyond its edge, not counted below)"
                if plan["lr_extend"] else "")]
    lines.append(f"{'config':<14}{'MFLOP/ex':>9}{'FLOPs vs full':>14}{'steps':>7}{'rows':>8}{'epochs':>7}"
                 f"{'ex/s':>8}{'est s/run':>10}")
    for r in plan["configs"]:
        rel = r["fwd_flops"] / plan["full_fwd"] - 1
        timed = f"{r['examples_per_s']:>8.0f}{r['est_seconds']:>10.1f}" if "est_seconds" in r else ""
        lines.append(f"{r['name']:<14}{r['fwd_flops'] / 1e6:>9.3f}{rel:>+14.1%}"
                     f"{r['steps']:>7d}{r['examples']:>8d}{r['epochs']:>7.3f}{timed}")
    for v in plan["proxies"]:
        est = f", est {v['est_seconds']:.0f} s" if "est_seconds" in v else ""
        lines.append(f"proxy {v['name']}: {v['runs']} runs ({v['seeds']} seeds), "
                     f"rows x {v['rows_fraction']}, d / {v['d_divisor']}{est}")
    if "est_seconds" in plan:
        lines.append(f"{plan['runs']} runs; estimated {plan['est_seconds'] / 60:.1f} min of training plus "
                     f"set-up (timed: {plan['timed_steps']} steps per configuration on this machine, now; "
                     "evaluation and the stream's simulation not counted)")
    else:
        lines.append(f"{plan['runs']} runs (plan_steps = 0: not timed)")
    return "\n".join(lines)


def _time_config(st: Study, fam: FamilySweep, steps: int, variant: ProxyVariant | None
                 ) -> tuple[float, float]:
    """(examples/s, seconds of set-up) of ``steps`` training steps of one configuration, measured now."""
    from opengem.train.trainer import Trainer

    rc = run_config(st, fam, steps, None, 0, variant)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        with Trainer(rc, Path(tmp) / "run", rc.data.path, force=True) as tr:
            s = tr.fit()
        total = time.perf_counter() - t0
    return float(s["examples_per_s"]), max(0.0, total - s["train_seconds"])


def make_plan(cfg: AblationConfig, st: Study, timed: bool) -> dict[str, Any]:
    """Every configuration's rows at the budget (equal training FLOPs) and the proxies' runs; with
    ``timed``, each configuration trains ``plan_steps`` steps now and the plan estimates seconds."""
    fams = configurations(cfg)
    base = {f.name: st.run_config(f, 0, 1, None, 0) for f in fams}  # each configuration's resolved run config
    batch = {name: int(rc.data.batch_size) for name, rc in base.items()}
    grid = plan_grid([cfg.budget], st.fwd, batch, st.train_rows, cfg.min_steps, cfg.max_epochs)
    rows = [{"name": p.family, "fwd_flops": p.fwd_flops, "steps": p.steps, "examples": p.examples,
             "train_flops": p.train_flops, "epochs": p.epochs} for p in grid]
    full_runs = len(fams) * cfg.seeds + max(len(cfg.lr_grid) - 1, 0)
    plan: dict[str, Any] = {"budget": cfg.budget, "train_rows": st.train_rows, "batch_size": batch[FULL],
                            "seeds": cfg.seeds, "lr_grid": list(cfg.lr_grid), "lr_extend": cfg.lr_extend,
                            "full_fwd": st.fwd[FULL][0],
                            "configs": rows, "proxies": [], "runs": full_runs}
    timed = timed and cfg.plan_steps > 0
    speed: dict[tuple[str, int], tuple[float, float]] = {}
    if timed:
        for f in fams:
            speed[(f.name, 1)] = _time_config(st, f, cfg.plan_steps, None)
    total = 0.0
    for r in rows:
        if timed:
            eps, setup = speed[(r["name"], 1)]
            r["examples_per_s"], r["est_seconds"] = eps, setup + r["examples"] / eps
            extra_lr = max(len(cfg.lr_grid) - 1, 0) if r["name"] == FULL else 0
            total += r["est_seconds"] * (cfg.seeds + extra_lr)
    full_d = int(base[FULL].model.embedding.d)
    for v in cfg.proxies:
        if v.d_divisor > 1 and narrowed_d(full_d, v) == full_d:
            # e.g. the default study's d 4 with d_multiple 4: the proxy would train the full width and its
            # report would call it narrower (and blame or credit the width knob for what rows did)
            raise ConfigError(f"proxy {v.name!r}: the full model's embedding.d {full_d} // d_divisor "
                              f"{v.d_divisor} rounds back to {full_d} at d_multiple {v.d_multiple}: the "
                              "width knob changes nothing (lower d_multiple, or drop d_divisor)")
        seeds = v.seeds or cfg.seeds
        entry: dict[str, Any] = {**asdict(v), "seeds": seeds, "runs": len(fams) * seeds}
        if timed:
            est = 0.0
            for f, r in zip(fams, rows):
                key = (f.name, v.d_divisor)
                if key not in speed:
                    speed[key] = _time_config(st, f, cfg.plan_steps, v)
                eps, setup = speed[key]
                est += seeds * (setup + proxy_steps(r["steps"], v) * batch[f.name] / eps)
            entry["est_seconds"] = est
            total += est
        plan["proxies"].append(entry)
        plan["runs"] += entry["runs"]
    if timed:
        plan["est_seconds"], plan["timed_steps"] = total, cfg.plan_steps
    return plan


# --------------------------------------------------------------------------- the study
def write_test_predictions(run_dir: Path, st: Study, cfg: AblationConfig) -> Path:
    """The run's test predictions (probabilities and labels per row, for the per-row bootstrap), through the
    run's calibration where it has one (as ``opengem predict`` scores): RUN/predictions-test.parquet holds
    every test row (the summary reads its first ``eval_rows``), RUN/predictions-test-spread<N>.parquet
    (``eval_sample`` = spread) exactly the ``eval_rows`` rows the run's test was scored on. Written again
    when the checkpoint or the calibration is newer than it."""
    from opengem.train.calibration import CALIBRATION
    from opengem.train.predict import predict_run

    spread = cfg.eval_rows if cfg.eval_sample == "spread" else 0
    out = run_dir / ("predictions-test.parquet" if not spread else f"predictions-test-spread{spread}.parquet")
    ckpt_dir = run_dir / "checkpoints"
    cal = run_dir / CALIBRATION
    inputs = [p for p in ckpt_dir.rglob("*") if p.is_file()] + [cal] * cal.exists()
    newest = max((p.stat().st_mtime for p in inputs), default=0.0)
    if not out.exists() or out.stat().st_mtime < newest:
        predict_run(run_dir, out, st.data, st.test_spec, force=True, spread_rows=spread)
    return out


def job_run_name(name: str, lr: float | None, seed: int, variant: ProxyVariant | None = None) -> str:
    return run_name(name, 0, 0, lr, seed) if variant is None else f"proxy-{variant.name}-{name}-seed{seed}"


def _job_config(cfg: AblationConfig, st: Study, steps: dict[str, int], name: str, lr: float | None, seed: int,
                variant: ProxyVariant | None) -> Any:
    fam = next(f for f in configurations(cfg) if f.name == name)
    n_steps = steps[name] if variant is None else proxy_steps(steps[name], variant)
    return run_config(st, fam, n_steps, lr, seed, variant)


def train_job(cfg: AblationConfig, out: str | Path, data_dir: str | Path | None, name: str, lr: float | None,
              seed: int, proxy: str | None = None, extra: list[str] | None = None,
              log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Train (or reuse) one run of the study into OUT/runs/ as ``run_ablation`` would, and for a full-budget
    run write its test predictions: what a worker process does (bench/ablation_worker.py)."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    out = Path(out)
    if name not in {f.name for f in configurations(cfg)}:
        raise ConfigError(f"configuration {name!r} is not in the study")
    variant = next((v for v in cfg.proxies if v.name == proxy), None)
    if proxy is not None and variant is None:
        raise ConfigError(f"proxy {proxy!r} is not in the study")
    st = prepare_study(as_isoflop(cfg), out, data_dir, list(extra or []), log, study="ablation")
    steps = {r["name"]: r["steps"] for r in make_plan(cfg, st, timed=False)["configs"]}
    run_dir = out / "runs" / job_run_name(name, lr, seed, variant)
    rec, _ = train_and_test(_job_config(cfg, st, steps, name, lr, seed, variant), run_dir, st.test_spec,
                            cfg.eval_rows, cfg.calibrate, cfg.eval_sample)
    if variant is None:
        write_test_predictions(run_dir, st, cfg)
    return rec


def choose_rate(grid: list[float], extend: int, score: Callable[[list[float | None]], list[float]]
                ) -> tuple[float | None, dict[float | None, float]]:
    """(the rate with the lowest validation NE, every rate tried -> its NE, ascending). ``score`` trains the
    rates it is given and returns their NE; the grid goes in as one batch, then, while the best is the edge of
    the rates tried, one rate beyond it at a time (``extend`` at most; ``isoflop_rule.next_rate``'s step). An
    empty grid is the recipe's rate (None)."""
    rates: list[float | None] = list(grid) or [None]
    scores: dict[float | None, float] = dict(zip(rates, score(rates)))
    for _ in range(extend if grid else 0):
        tried = sorted(r for r in scores if r is not None)
        nxt = next_rate(tried, {r: scores[r] for r in tried})
        if nxt is None or nxt in scores:
            break
        scores[nxt] = score([nxt])[0]
    ordered = dict(sorted(scores.items(), key=lambda kv: 0.0 if kv[0] is None else kv[0]))
    return min(ordered, key=lambda r: nan_last(ordered[r])), ordered


def run_ablation(cfg: AblationConfig, out: str | Path, data_dir: str | Path | None = None,
                 run_overrides: list[str] | None = None, log: Callable[[str], None] | None = None,
                 plan_only: bool = False, time_plan: bool = True) -> dict[str, Any]:
    """Run (or resume) the study; writes OUT/ablation.json and OUT/ablation_runs.csv and returns the
    summary (with ``plan_only``: the plan, and nothing is trained beyond ``plan_steps`` timing steps)."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, running_config(out, "ablation.toml"))  # ablation.toml once the results are written
    t_start = time.perf_counter()
    st = prepare_study(as_isoflop(cfg), out, data_dir, list(run_overrides or []), log, plan_only,
                       study="ablation")
    plan = make_plan(cfg, st, timed=plan_only and time_plan)
    if plan_only:
        running_config(out, "ablation.toml").unlink()  # a plan writes no study
        return {"plan": plan, "plan_text": plan_text(plan)}
    fams = {f.name: f for f in configurations(cfg)}
    steps = {r["name"]: r["steps"] for r in plan["configs"]}
    records: dict[str, dict[str, Any]] = {}
    order: list[str] = []  # run names in the one-worker order, so that the CSV is the same with several
    trained = [0]
    lock = threading.Lock()

    def run(job: tuple[str, float | None, int, ProxyVariant | None]) -> dict[str, Any]:
        name, lr, seed, variant = job
        rname = job_run_name(name, lr, seed, variant)
        with lock:
            if rname in records:
                return records[rname]
        t1 = time.perf_counter()
        rc = _job_config(cfg, st, steps, name, lr, seed, variant)
        run_dir = out / "runs" / rname
        if cfg.workers > 1:
            rec = finished_run(rc, run_dir, st.test_spec, cfg.eval_rows, cfg.calibrate, cfg.eval_sample)
            now = rec is None
            if now:
                train_in_worker_process(
                    "opengem.bench.ablation_worker",
                    [str(running_config(out, "ablation.toml")), str(out), str(st.data), name,
                     "recipe" if lr is None else format(lr, "g"), str(seed), variant.name if variant else "-",
                     *st.extra], out, run_dir, "ablation")
                rec = finished_run(rc, run_dir, st.test_spec, cfg.eval_rows, cfg.calibrate, cfg.eval_sample)
                if rec is None:
                    raise TrainError(f"ablation: run {rname} wrote a result for another config than the "
                                     f"study's ({run_dir / 'result.json'})")
        else:
            rec, now = train_and_test(rc, run_dir, st.test_spec, cfg.eval_rows, cfg.calibrate,
                                      cfg.eval_sample)
        row = {"run": rname, "config": name, "proxy": variant.name if variant else None, "lr": lr,
               "seed": seed, "embedding_d": rc.model.embedding.d, "fwd_flops": rec["flops_per_example"],
               "steps": rec["steps"], "examples": rec["examples"],
               "train_flops": 3.0 * rec["flops_per_example"] * rec["examples"],
               "dense_params": rec["dense_params"], "train_seconds": rec["train_seconds"],
               "valid_ne": selection_ne(rec["valid"], cfg.metric),
               "test_ne": selection_ne(rec["test"], cfg.metric),
               "valid": rec["valid"], "test": rec["test"]}
        with lock:
            trained[0] += now
            records[rname] = row
            log(f"ablation: [{len(records)}] {rname}: {rec['examples']} rows, "
                f"valid NE {row['valid_ne']:.5f}, test NE {row['test_ne']:.5f}, "
                + (f"{time.perf_counter() - t1:.1f}s" if now else "reused"))
        return row

    def run_all(jobs: list[tuple[str, float | None, int, ProxyVariant | None]]) -> list[dict[str, Any]]:
        for rname in (job_run_name(*job) for job in jobs):
            if rname not in order:
                order.append(rname)
        if cfg.workers <= 1:
            return [run(j) for j in jobs]
        with ThreadPoolExecutor(cfg.workers) as pool:  # each run starts a process of its own
            futures = [pool.submit(run, j) for j in jobs]
            try:
                return [f.result() for f in futures]
            except BaseException:  # the first failure: start nothing more, let the running ones finish
                pool.shutdown(wait=True, cancel_futures=True)
                raise

    # 1. the learning rate: the full model at the budget, seed 0, lowest validation NE
    def grid_ne(lrs: list[float | None]) -> list[float]:
        return [row["valid_ne"] for row in run_all([(FULL, r, 0, None) for r in lrs])]

    lr, lr_scores = choose_rate(cfg.lr_grid, cfg.lr_extend, grid_ne)
    # 2. every configuration x seed at the budget (seed-major: a stopped one-worker study has whole seeds)
    run_all([(name, lr, seed, None) for seed in range(cfg.seeds) for name in fams])
    # 3. the proxies
    run_all([(name, lr, seed, v) for v in cfg.proxies for seed in range(v.seeds or cfg.seeds)
             for name in fams])
    rows = [records[n] for n in order]
    preds = {(r["config"], r["seed"]): write_test_predictions(out / "runs" / r["run"], st, cfg)
             for r in rows if r["proxy"] is None and r["lr"] == lr}
    result = summarize_ablation(cfg, st, rows, lr, lr_scores, preds, plan, configurations(cfg)[0])
    result["elapsed_s"] = time.perf_counter() - t_start
    result["runs_trained_now"] = trained[0]
    write_ablation_outputs(out, rows, result)
    publish_config(out, "ablation.toml")
    return result


def run_cli(args: Any) -> int:
    """``opengem scale --design ablation [--budget small|default] [--config F] [--plan] [--set k=v ...]``."""
    if args.families:  # the study's arms are GEM's components, not families: it would be ignored
        raise UsageError("--families: an option of --design isoflop (the ablation study trains GEM's "
                         "components and the proxies its --config names)")
    path = Path(args.config) if args.config else default_config_path(args.budget)
    cfg = load_ablation_config(path, args.sweep_overrides)
    out = Path(args.out or Path("runs/scale") / path.stem)
    result = run_ablation(cfg, out, args.data, args.overrides, plan_only=args.plan)
    if args.plan:
        print(result["plan_text"])
        return 0
    print(format_ablation(result))
    print(f"ablation: {result['runs']} runs ({result['runs_trained_now']} trained now), "
          f"{result['elapsed_s']:.0f}s; wrote {out / 'ablation.json'}, {out / 'ablation_runs.csv'}")
    return 0
