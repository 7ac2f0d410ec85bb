"""``opengem scale``: train a family of model sizes per architecture on one stream and fit NE vs compute.

Every run of a sweep sees the same data: the simulator is run once into OUT/data (or a canonical dataset is
given), each size trains one pass over the training partitions and is scored on the held-out last
partition. NE per run is one number (``metric``): by default the mean over surface x task of the NE on
the held-out partition, over the keys where the oracle NE is defined, so the oracle floor is averaged the
same way. Training compute is C = 3 x forward FLOPs/example (analytic, full sequence length) x examples
seen (forward + backward = 3 forwards, the usual convention).

Outputs: OUT/sweep.toml (resolved sweep), OUT/runs/<family>-<i>[-proxy]/ (each training run),
OUT/scaling.csv, OUT/fits.json, OUT/scaling.png. A finished run (its result.json matches its resolved
config) is reused, so an interrupted sweep resumes where it stopped.

``--design isoflop`` runs the compute-optimal study instead (bench/isoflop.py): fixed training budgets,
rows = budget / FLOPs per example, a learning rate per family, seeds at each budget's best size.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from opengem.bench.fit import PowerLaw, efficiency_ratios, fit_power_law, spearman
from opengem.bench.run_identity import config_sha256, is_same_run
from opengem.bench.size_ladder import (
    FamilySweep,
    check_metric,
    metric_keys,
    oracle_with_totals,
    select_ne,
    size_overrides,
)
from opengem.config import ConfigError, load_config, save_config
from opengem.data.commit import atomic_write_text
from opengem.errors import UsageError

FIT_FORMS = ("free", "floor")


@dataclass
class ProxyConfig:
    """The lightweight variant: every size again on fewer rows and a narrower d, ranked against the full."""

    enabled: bool = False
    rows_fraction: float = 0.25  # train steps = this fraction of one pass
    d_divisor: int = 2  # model.embedding.d // d_divisor, rounded down to a multiple of d_multiple
    d_multiple: int = 4
    overrides: list[str] = field(default_factory=list)


@dataclass
class SweepConfig:
    base: str = "small.toml"  # run recipe; relative paths: next to the sweep file, then the working dir
    data: str = ""  # canonical dataset folder; "" = simulate the base's data.sim once into OUT/data
    overrides: list[str] = field(default_factory=list)  # applied to every run (before family/size knobs)
    metric: str = "surface_task"  # surface_task | tasks | one key such as "all/click"
    fit: str = "free"  # free: c searched in [oracle floor, min NE); floor: c = oracle floor (log-linear)
    reference: str = "gem"  # the family whose sizes the efficiency ratios are quoted at
    families: list[FamilySweep] = field(default_factory=list)
    proxy: ProxyConfig = field(default_factory=ProxyConfig)


def load_sweep_config(path: str | Path, overrides: list[str] | None = None) -> SweepConfig:
    cfg = load_config(SweepConfig, path, overrides)
    base = Path(cfg.base)
    if not base.is_absolute():
        near = Path(path).parent / base
        base = near if near.exists() else base
    if not base.exists():
        raise ConfigError(f"{path}: base = {cfg.base!r}: run recipe not found (looked next to the sweep "
                          "file and in the working directory)")
    cfg.base = str(base.resolve())
    validate_sweep(cfg, str(path))
    return cfg


def validate_sweep(cfg: SweepConfig, where: str = "sweep") -> None:
    if cfg.fit not in FIT_FORMS:
        raise ConfigError(f"{where}: fit must be one of {', '.join(FIT_FORMS)} (got {cfg.fit!r})")
    if not cfg.families:
        raise ConfigError(f"{where}: no [[families]]")
    names = [f.name or f.model for f in cfg.families]
    if any(not n for n in names) or len(set(names)) != len(names):
        raise ConfigError(f"{where}: every [[families]] needs a unique name (got {names})")
    for f in cfg.families:
        if not size_overrides(f):
            raise ConfigError(f"{where}: family {f.name!r} has neither grid nor sizes")
    if cfg.reference not in names:
        raise ConfigError(f"{where}: reference = {cfg.reference!r} is not one of the families "
                          f"({', '.join(names)})")
    check_metric(cfg.metric, where)
    if not 0 < cfg.proxy.rows_fraction <= 1:
        raise ConfigError(f"{where}: proxy.rows_fraction must be in (0, 1] (got {cfg.proxy.rows_fraction})")
    if cfg.proxy.d_divisor < 1 or cfg.proxy.d_multiple < 1:
        raise ConfigError(f"{where}: proxy.d_divisor and proxy.d_multiple must be >= 1")




# --------------------------------------------------------------------------- one run
def _train_rows(data_path: Path, spec: str) -> int:
    import pyarrow.parquet as pq

    from opengem.data.dataset import Dataset

    return sum(pq.ParquetFile(f).metadata.num_rows for f in Dataset(data_path).files(spec))


def resolve_run(sweep: SweepConfig, fam: FamilySweep, size: list[str], proxy: bool, data_path: Path,
                extra: list[str]) -> Any:
    from opengem.train.config import load_run_config

    model = fam.model or fam.name
    ovr = ["train.progress=false", "train.epochs=1", "train.steps=0", *sweep.overrides, *fam.overrides,
           f"model.name={model}", *size, *extra]
    if proxy:
        ovr += sweep.proxy.overrides
    cfg = load_run_config(sweep.base, ovr)
    cfg.data.path = str(data_path)
    if proxy:
        p = sweep.proxy
        d = cfg.model.embedding.d // p.d_divisor
        cfg.model.embedding.d = max(p.d_multiple, d // p.d_multiple * p.d_multiple)
        if cfg.train.steps == 0:
            rows = _train_rows(data_path, cfg.data.train) * cfg.train.epochs
            cfg.train.steps = max(1, int(p.rows_fraction * rows / cfg.data.batch_size))
        else:
            cfg.train.steps = max(1, int(p.rows_fraction * cfg.train.steps))
        cfg.train.warmup_steps = min(cfg.train.warmup_steps, max(1, cfg.train.steps // 4))
    cfg.validate()
    return cfg


def run_one(cfg: Any, run_dir: Path) -> dict[str, Any]:
    """Train (or reuse a finished run of the same config, :mod:`run_identity`); returns its record."""
    from opengem.train.trainer import train

    ident = config_sha256(cfg)
    done = run_dir / "result.json"
    rec = _read_result(done)
    if rec is not None and is_same_run(cfg, run_dir, rec.get("config_sha256")):
        return rec
    summary = train(cfg, run_dir, data_dir=cfg.data.path, force=True)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    setup = [r for r in records if r.get("kind") == "setup"][-1]  # --force moved any old run aside
    rec = {"config_sha256": ident, "summary": summary, "dense_params": setup.get("dense_params"),
           "embedding_params": setup.get("embedding_params")}
    atomic_write_text(done, json.dumps(rec, indent=2))
    return rec


def _read_result(path: Path) -> dict[str, Any] | None:
    """A finished run's record, or None: none there, or one that cannot be read (cut short, edited), which
    is said and the run trained again rather than trusted or left to fail the study."""
    try:
        rec = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        print(f"scale: {path}: unreadable ({type(e).__name__}: {e}); training that run again",
              file=sys.stderr, flush=True)
        return None
    return rec if isinstance(rec, dict) and isinstance(rec.get("summary"), dict) else None


# --------------------------------------------------------------------------- the sweep
def run_sweep(sweep: SweepConfig, out: str | Path, data_dir: str | Path | None = None,
              run_overrides: list[str] | None = None, log: Any = None) -> dict[str, Any]:
    """Run every (family, size) [and its proxy], then write scaling.csv, fits.json and scaling.png."""
    from opengem.data.dataset import Dataset
    from opengem.train.config import load_run_config
    from opengem.train.data import prepare_data

    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    extra = list(run_overrides or [])
    base = load_run_config(sweep.base, [*sweep.overrides, *extra])
    t0 = time.perf_counter()
    data_path = prepare_data(base.data, out, data_dir or sweep.data or None)
    log(f"scale: data {data_path} ready in {time.perf_counter() - t0:.1f}s")
    ds = Dataset(data_path)
    oracle = None
    if ds.truth_files(base.data.eval):
        oracle = {k: v for k, v in oracle_with_totals(data_path, base.data.eval).items() if v == v}

    keys: list[str] | None = sorted(oracle) if oracle else None
    rows: list[dict[str, Any]] = []
    # size by size across families, so a sweep stopped early still has every family's small end
    plan = [(fam, i, size, proxy) for fam in sweep.families for i, size in enumerate(size_overrides(fam))
            for proxy in ([False, True] if sweep.proxy.enabled else [False])]
    plan.sort(key=lambda p: p[1])
    for n, (fam, i, size, proxy) in enumerate(plan):
        name = f"{fam.name or fam.model}-{i:02d}" + ("-proxy" if proxy else "")
        cfg = resolve_run(sweep, fam, size, proxy, data_path, extra)
        t1 = time.perf_counter()
        rec = run_one(cfg, out / "runs" / name)
        s = rec["summary"]
        metrics = s["final_eval"] or {}
        if keys is None:
            keys = sorted(metrics)
        mk = metric_keys(sweep.metric, keys)
        fwd = int(s["flops_per_example"])
        row = {
            "name": name, "family": fam.name or fam.model, "model": cfg.model.name, "size": i,
            "proxy": proxy, "overrides": " ".join(size), "d": cfg.model.embedding.d,
            "flops_per_example": fwd, "gflop_per_example": fwd / 1e9, "train_examples": s["examples"],
            "train_flops": 3.0 * fwd * s["examples"], "dense_params": rec["dense_params"],
            "embedding_params": rec["embedding_params"], "ne": select_ne(metrics, mk),
            "oracle_ne": float(np.mean([oracle[k] for k in mk])) if oracle else None,
            "train_seconds": s["train_seconds"], "examples_per_s": s["examples_per_s"],
            **{f"ne[{k}]": metrics.get(k, {}).get("ne") for k in keys},
        }
        rows.append(row)
        log(f"scale: [{n + 1}/{len(plan)}] {name}: {fwd / 1e6:.3f} MFLOP/ex, NE {row['ne']:.5f}, "
            f"{s['train_seconds']:.0f}s train, {time.perf_counter() - t1:.0f}s total")
    result = summarize(sweep, rows, oracle, keys or [])
    write_outputs(out, rows, result)
    result["elapsed_s"] = time.perf_counter() - t0
    atomic_write_text(out / "fits.json", json.dumps(result, indent=2, default=_json_default))
    # written with the results it describes (a re-run stopped early leaves the last finished study's), the
    # command line's run overrides included: the file re-runs this sweep as it is
    save_config(dataclasses.replace(sweep, overrides=[*sweep.overrides, *extra]), out / "sweep.toml")
    return result


def _json_default(o: Any) -> Any:
    if isinstance(o, PowerLaw):
        return o.to_dict()
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    raise TypeError(type(o).__name__)


def _fit(xs: list[float], ys: list[float], form: str, floor: float | None) -> PowerLaw | None:
    try:
        if form == "floor" and floor is not None:
            return fit_power_law(xs, ys, c=floor)
        return fit_power_law(xs, ys, c_min=floor)
    except ValueError:
        return None


def summarize(sweep: SweepConfig, rows: list[dict[str, Any]], oracle: dict[str, float] | None,
              keys: list[str]) -> dict[str, Any]:
    """Fits per family (vs training FLOPs and vs dense parameters), efficiency ratios, proxy Spearman."""
    full = [r for r in rows if not r["proxy"]]
    floor = full[0]["oracle_ne"] if full and full[0]["oracle_ne"] is not None else None
    fams = list(dict.fromkeys(r["family"] for r in full))
    fits: dict[str, PowerLaw] = {}
    fits_params: dict[str, PowerLaw | None] = {}
    ranges: dict[str, tuple[float, float]] = {}
    for fam in fams:
        pts = [r for r in full if r["family"] == fam and r["ne"] == r["ne"]]
        f = _fit([r["train_flops"] for r in pts], [r["ne"] for r in pts], sweep.fit, floor)
        if f is not None:
            fits[fam] = f
        fits_params[fam] = _fit([float(r["dense_params"]) for r in pts], [r["ne"] for r in pts], sweep.fit,
                                floor)
        if pts:
            ranges[fam] = (min(r["train_flops"] for r in pts), max(r["train_flops"] for r in pts))
    eff: dict[str, Any] = {}
    ref = sweep.reference
    if ref in fits:
        ref_x = sorted(r["train_flops"] for r in full if r["family"] == ref)
        for fam in fams:
            if fam != ref and fam in fits:
                eff[fam] = efficiency_ratios(fits[ref], ref_x, fits[fam], ranges[fam])
    # model-free companion to the ratios: each family's measured NE interpolated (linear in log C) at the
    # reference's measured compute; None outside the family's measured range (no extrapolation)
    matched: dict[str, Any] = {}
    ref_pts = sorted((r["train_flops"], r["ne"]) for r in full if r["family"] == ref)
    for fam in fams:
        pts = sorted((r["train_flops"], r["ne"]) for r in full if r["family"] == fam)
        if fam == ref or len(pts) < 2:
            continue
        lx = np.log([p[0] for p in pts])
        rows_m = []
        for x, ne in ref_pts:
            inside = lx[0] <= math.log(x) <= lx[-1]
            other = float(np.interp(math.log(x), lx, [p[1] for p in pts])) if inside else None
            rows_m.append({"x": x, "ne_ref": ne, "ne_other": other,
                           "delta": (other - ne) if other is not None else None})
        matched[fam] = rows_m
    proxy_res: dict[str, Any] = {}
    prox = {r["name"].removesuffix("-proxy"): r["ne"] for r in rows if r["proxy"]}
    if prox:
        pairs = [(r["ne"], prox[r["name"]]) for r in full if r["name"] in prox]
        proxy_res = {"spearman": spearman([p[0] for p in pairs], [p[1] for p in pairs]), "n": len(pairs),
                     "per_family": {fam: spearman([r["ne"] for r in full if r["family"] == fam],
                                                  [prox[r["name"]] for r in full if r["family"] == fam])
                                    for fam in fams}}
    examples = {fam: next(r["train_examples"] for r in full if r["family"] == fam) for fam in fams}
    return {
        "metric": sweep.metric, "metric_keys": metric_keys(sweep.metric, keys) if keys else [],
        "law": "NE = a * C^-b + c, C = training FLOPs = 3 * forward FLOPs/example * examples",
        "fit_form": sweep.fit, "oracle_ne": floor, "examples": examples,
        "fits": {k: v.to_dict() for k, v in fits.items()},
        "fits_vs_dense_params": {k: (v.to_dict() if v else None) for k, v in fits_params.items()},
        "efficiency_reference": ref,
        "reference_decreasing": bool(ref in fits and fits[ref].decreasing),
        "efficiency": eff, "ne_at_matched_compute": matched, "proxy": proxy_res,
    }


def write_outputs(out: Path, rows: list[dict[str, Any]], result: dict[str, Any]) -> None:
    from opengem.bench.scaling_plot import plot_scaling

    cols = list(dict.fromkeys(k for r in rows for k in r))
    with open(out / "scaling.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    (out / "fits.json").write_text(json.dumps(result, indent=2, default=_json_default))
    fits = {k: PowerLaw(**v) for k, v in result["fits"].items()}
    plot_scaling(rows, fits, result["oracle_ne"], out / "scaling.png", result["metric"], result["examples"])


def format_result(result: dict[str, Any]) -> str:
    lines = [f"NE metric: {result['metric']} (keys: {', '.join(result['metric_keys'])}); "
             f"oracle NE floor {result['oracle_ne']}", f"law: {result['law']} (fit: {result['fit_form']})"]
    for fam, f in result["fits"].items():
        lines.append(f"  {fam:<8} a={f['a']:.4g} b={f['b']:.4f} c={f['c']:.5f} rmse={f['rmse']:.2e} "
                     f"n={f['n']}")
    ref = result["efficiency_reference"]
    if not result.get("reference_decreasing", True):
        lines.append(f"WARNING: {ref}'s fitted NE does not fall with compute: the ratios below compare "
                     "against a curve that rises, read them with care")
    for fam, rows in result["efficiency"].items():
        lines.append(f"compute {fam} needs to match {ref}'s fitted NE (x {ref}'s compute):")
        for r in rows:
            if r["ratio"] is None:
                why = r.get("note") or "unreachable: its fitted asymptote is above this NE"
                lines.append(f"  {ref} C={r['x']:.3g} NE={r['ne']:.5f}: {why}")
            else:
                tag = " (extrapolated)" if r["extrapolated"] else ""
                lines.append(f"  {ref} C={r['x']:.3g} NE={r['ne']:.5f}: {r['ratio']:.2f}x{tag}")
    for fam, rows in result.get("ne_at_matched_compute", {}).items():
        lines.append(f"measured NE at {ref}'s compute (interpolated on {fam}'s points; + = {fam} worse):")
        for r in rows:
            other = "outside its range" if r["ne_other"] is None else \
                f"{fam} {r['ne_other']:.5f} ({r['delta']:+.5f})"
            lines.append(f"  C={r['x']:.3g}: {ref} {r['ne_ref']:.5f}, {other}")
    if result["proxy"]:
        p = result["proxy"]
        fam = ", ".join(f"{k} {v:.2f}" for k, v in p["per_family"].items())
        lines.append(f"proxy vs full ranking: Spearman {p['spearman']:.3f} over {p['n']} runs "
                     f"(per family: {fam})")
    return "\n".join(lines)


# after Ctrl-C (opengem.cli): a re-run into the same --out reuses every finished run and trains the
# interrupted one again from the start (its folder moved aside)
INTERRUPTED_ADVICE = ("run the same command again to continue (finished runs are reused; the interrupted "
                      "one trains again)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--design", choices=("sweep", "isoflop", "ablation"), default="sweep",
                   help="sweep: every size on the same rows (needs --config); isoflop: the compute-optimal "
                        "study, rows = budget / FLOPs per example (bench/isoflop.py); ablation: GEM's "
                        "components at equal compute, and the proxy (bench/ablation.py)")
    p.add_argument("--config", default=None, help="sweep or study TOML (e.g. configs/scaling-tiny.toml; "
                   "isoflop default: configs/isoflop[-<budget>].toml)")
    p.add_argument("--budget", choices=("small", "default", "large"), default=None,
                   help="isoflop and ablation: small (minutes, CPU), default (the default; ~70 min on 2 "
                        "AVX-512 cores, ~110-125 on AVX2), large (isoflop only: one H200)")
    p.add_argument("--families", default=None, help="isoflop: comma-separated subset, e.g. gem,dcnv2,dlrm")
    p.add_argument("--plan", action="store_true",
                   help="isoflop and ablation: print the rows each run gets and stop")
    p.add_argument("--out", default=None, help="output folder (default: runs/scale/<config name>)")
    p.add_argument("--data", default=None, help="canonical dataset folder (default: simulate once)")
    p.add_argument("--set", dest="sweep_overrides", action="append", default=[],
                   help="override a sweep/study key, e.g. --set proxy.enabled=false or --set seeds=5")
    p.add_argument("overrides", nargs="*", help="run overrides applied to every run, e.g. train.threads=1")


def run(args: argparse.Namespace) -> int:
    if args.design == "isoflop":
        return run_isoflop(args)
    if args.design == "ablation":
        from opengem.bench.ablation import run_cli

        return run_cli(args)
    given = [flag for flag, value in (("--budget", args.budget), ("--families", args.families),
                                      ("--plan", args.plan)) if value]
    if given:  # the sweep would otherwise ignore them and train every run
        raise UsageError(f"{', '.join(given)}: options of the studies (--budget and --plan: --design isoflop "
                         "or ablation; --families: isoflop); a sweep runs every family and size of its "
                         "--config")
    if not args.config:
        raise UsageError("--design sweep needs --config (e.g. configs/scaling-tiny.toml)")
    sweep = load_sweep_config(args.config, args.sweep_overrides)
    out = Path(args.out or Path("runs/scale") / Path(args.config).stem)
    result = run_sweep(sweep, out, args.data, args.overrides)
    print(format_result(result))
    print(f"wrote {out / 'scaling.csv'}, {out / 'fits.json'}, {out / 'scaling.png'}, {out / 'sweep.toml'}")
    return 0


def run_isoflop(args: argparse.Namespace) -> int:
    from opengem.bench.isoflop import default_config_path, load_isoflop_config, run_study
    from opengem.bench.isoflop_report import format_study

    path = Path(args.config) if args.config else default_config_path(args.budget or "default")
    fams = [f.strip() for f in args.families.split(",") if f.strip()] if args.families else None
    cfg = load_isoflop_config(path, args.sweep_overrides, fams)
    out = Path(args.out or Path("runs/scale") / path.stem)
    result = run_study(cfg, out, args.data, args.overrides, plan_only=args.plan)
    if args.plan:
        print(f"{result['train_rows']} training rows, batch size {result['batch_size']}")
        print(result["plan_text"])
        return 0
    print(format_study(result))
    print(f"study: {result['runs']} runs ({result['runs_trained_now']} trained now), "
          f"{result['elapsed_s']:.0f}s; wrote {out / 'isoflop.json'}, {out / 'isoflop_runs.csv'}, "
          f"{out / 'isoflop.png'}")
    return 0
