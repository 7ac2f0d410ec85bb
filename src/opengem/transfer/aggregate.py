"""From per-seed predictions to the experiment's numbers: NE, TR, R with CIs, AUC, calibration per key.

R compares arms at equal serving compute (issue 15, item 3): it is reported only for an arm whose serving
FLOPs/example stay within +10 % of the baseline VM's (``SERVING_FLOPS_TOLERANCE``). An arm that buys its
gain with serving compute (FM blocks run at serving time, wider inputs) gets ``r`` = None and
``r_withheld`` = "adds serving compute"; its NE and TR are still reported, with its FLOPs ratio, so it can
be set against a baseline VM made bigger by the same FLOPs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from opengem.metrics import auc, calibration
from opengem.transfer.experiment_config import ExperimentConfig
from opengem.transfer.preds import align_rows, sigmoid
from opengem.transfer.results import ne_of, ratio, summarize_key


def key_data(
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
        pos = align_rows(ids, pa_["example_id"])
        out[a] = {"p": sigmoid(pa_["logits"][pos, t])[keep], "y": base["labels"][keep, t].astype(np.float64)}
    out["fm"] = {"p": sigmoid(np.nan_to_num(r["fm"]["logits"][:, t]))[keep], "y": out["baseline"]["y"]}
    if "hierarchical" in arms:
        h = r["hierarchical"]
        pos = align_rows(ids, h["example_id"])
        out["domain_fm"] = {"p": sigmoid(h["domain_logits"][pos, t])[keep], "y": out["baseline"]["y"]}
    return out


SERVING_FLOPS_TOLERANCE = 0.10  # R only for arms within +10 % of the baseline VM's serving FLOPs/example
ADDS_SERVING_COMPUTE = "adds serving compute"


def serving_flops(per_seed: list[dict[str, Any]], arm: str, sname: str) -> float | None:
    """Mean serving FLOPs/example of an arm over seeds (None when a result does not record them)."""
    vals = [sr[sname][arm].get("serving_flops") for sr in per_seed]
    return None if any(v is None for v in vals) else float(np.mean(vals))


def apply_equal_flops_rule(m: dict[str, Any], flops: float | None, base_flops: float | None) -> None:
    """Record an arm's serving FLOPs and withhold its R when it serves more than the tolerance allows."""
    m["serving_flops"] = flops
    m["serving_flops_ratio"] = ratio(flops, base_flops) if flops is not None and base_flops else None
    if m["serving_flops_ratio"] is not None and m["serving_flops_ratio"] > 1 + SERVING_FLOPS_TOLERANCE:
        m["r"], m["r_ci"], m["r_withheld"] = None, None, ADDS_SERVING_COMPUTE


def aggregate(per_seed: list[dict[str, Any]], arms: list[str], cfg: ExperimentConfig) -> dict[str, Any]:
    first = per_seed[0]
    out: dict[str, Any] = {"arms": {a: {} for a in arms}, "fm": {}, "hierarchical": {}}
    for sname, r in first.items():
        for t, task in enumerate(r["tasks"]):
            key = f"{sname}/{task}"
            data = [key_data(sr, arms, sname, t) for sr in per_seed]
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
                apply_equal_flops_rule(m, serving_flops(per_seed, a, sname),
                                       serving_flops(per_seed, "baseline", sname))
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


def select_rows(seed_res: dict[str, Any], ids: np.ndarray) -> dict[str, Any]:
    """One seed's results restricted to the examples in ``ids`` (every per-example array, every arm, the KD
    grid and the FM), e.g. to split validation windows from evaluation windows."""

    def pick(x: Any) -> Any:
        if isinstance(x, dict) and "example_id" in x:
            keep = np.isin(x["example_id"], ids)
            n = len(keep)
            return {k: (v[keep] if isinstance(v, np.ndarray) and v.ndim and len(v) == n else v)
                    for k, v in x.items()}
        if isinstance(x, dict):
            return {k: pick(v) for k, v in x.items()}
        return x

    return {sname: pick(r) for sname, r in seed_res.items()}


def calibration_table(val_seed: list[dict[str, Any]], cfg: ExperimentConfig) -> dict[str, Any]:
    """Tuned KD's TR (and the NEs behind it) per VM surface x task on the validation windows: the number
    the regime is calibrated on (issue 15: TR in [0.15, 0.5] on every VM surface), pooled over seeds and
    per seed (the band must hold on every calibration seed), each with its paired bootstrap CI over rows
    (``tr_ci``: whether the validation rows resolve TR well enough to tell in-band from out)."""
    def table(seeds: list[dict[str, Any]]) -> dict[str, Any]:
        agg = aggregate(seeds, ["baseline", "kd"], cfg)
        return {key: {"baseline_ne": agg["arms"]["baseline"][key]["ne"], "kd_ne": m["ne"],
                      "fm_ne": agg["fm"][key]["ne"], "kd_tr": m["tr"], "kd_tr_ci": m["tr_ci"],
                      "rows": m["rows"]}
                for key, m in agg["arms"]["kd"].items()}

    pooled = table(val_seed)
    if len(val_seed) > 1:
        per_seed = [table([s]) for s in val_seed]
        for key, m in pooled.items():
            m["per_seed"] = [None if ps.get(key) is None else {"seed": seed, **ps[key]}
                             for seed, ps in zip(cfg.seeds, per_seed)]
    return pooled
