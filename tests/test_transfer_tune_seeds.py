"""Pooled tuning over seeds in `opengem transfer` (`tune_seeds`, calibration round 7): every tuning choice
is made on the validation rows of the first N seeds, each seed on its own validation rows, scored as the
mean of the seeds' validation NEs; 1 keeps the first-seed rule; the evaluation rows choose nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from opengem.config import ConfigError, load_config, save_config
from opengem.transfer.experiment_config import ExperimentConfig, load_experiment_config
from opengem.transfer.tuning import pooled, tune_on_validation

TINY = "configs/transfer-tiny.toml"
TWO_ARMS = 'arms=["baseline", "kd"]'
THREE_SEEDS = "seeds=[100, 101, 102]"
GRID = [[1.0, 1.0], [2.0, 1.0]]
ROWS = 3000  # validation rows per seed; each seed has as many evaluation rows after them


def quiet(*_a: object) -> None:
    pass


# sharpness of a candidate's logits on a seed's validation rows (higher = lower NE); keys ("kd", weight,
# epochs) and ("baseline", epochs). Seed 100 alone prefers KD w 1 at E 1 and the baseline at E 1, by a
# hair on both surfaces; seeds 101-102 prefer KD w 2 at E 2 and the baseline at E 2, clearly: pooled, the
# choice is theirs.
SEED_SHARP = {
    100: {("kd", 1.0, 1): 1.30, ("kd", 1.0, 2): 1.00, ("kd", 2.0, 1): 1.00, ("kd", 2.0, 2): 1.25,
          ("baseline", 1): 1.05, ("baseline", 2): 1.00},
    101: {("kd", 1.0, 1): 0.60, ("kd", 1.0, 2): 0.70, ("kd", 2.0, 1): 0.80, ("kd", 2.0, 2): 1.80,
          ("baseline", 1): 0.50, ("baseline", 2): 1.20},
    102: {("kd", 1.0, 1): 0.70, ("kd", 1.0, 2): 0.60, ("kd", 2.0, 1): 0.90, ("kd", 2.0, 2): 1.70,
          ("baseline", 1): 0.40, ("baseline", 2): 1.10},
}


class SeedFake:
    """SeedRun's interface for one seed: made-up predictions whose quality on the seed's own validation
    rows follows SEED_SHARP; its evaluation rows get the reversed order (``eval_sharp``), so a choice
    that read them would differ. Each seed's example ids are its own (offset by the seed), so a seed
    scored on another seed's validation ids would have no rows."""

    def __init__(self, cfg: ExperimentConfig, seed: int, eval_sharp=lambda c: 3.0 - c) -> None:
        self.cfg, self.seed, self.eval_sharp = cfg, seed, eval_sharp
        self.surfaces = ["feed", "stories"]
        self.val = seed * 100_000 + np.arange(ROWS)
        self.eval = seed * 100_000 + np.arange(ROWS, 2 * ROWS)
        self.calls = 0

    def preds(self, sname: str, key: tuple) -> dict:
        ids = np.concatenate([self.val, self.eval])
        rng = np.random.default_rng([self.seed, self.surfaces.index(sname)])
        y = (rng.random(len(ids)) < 0.3).astype(np.float32)
        noise = np.random.default_rng([self.seed, 7]).standard_normal(len(ids))
        sharp = SEED_SHARP[self.seed][key]
        c = np.where(np.isin(ids, self.val), sharp, self.eval_sharp(sharp))
        return {"example_id": ids, "surface": np.zeros(len(ids), np.int32),
                "logits": (c * (2 * y - 1) + noise)[:, None], "labels": y[:, None],
                "mask": np.ones((len(ids), 1), bool)}

    def run_lag(self, lag, arms, arm_cfgs, kd_results=None, kd_grid_epochs=None, surface_arm_cfgs=None):
        self.calls += 1
        out = {}
        for s in self.surfaces:
            res = {"surface": 0, "tasks": ["click"]}
            if kd_results is None:
                res["kd_grid"] = {tuple(g): self.preds(s, ("kd", g[0], kd_grid_epochs))
                                  for g in self.cfg.kd.grid}
            for a in arms:
                res[a] = self.preds(s, (a, (surface_arm_cfgs or {s: arm_cfgs})[s][a].epochs_per_window))
            out[s] = res
        return out


def cfg_with(*extra: str) -> ExperimentConfig:
    cfg = load_experiment_config(TINY, [TWO_ARMS, THREE_SEEDS, "validation_windows=1", "tune_epochs=[1, 2]",
                                        *extra])
    cfg.kd.grid = [list(g) for g in GRID]
    return cfg


def tune(cfg: ExperimentConfig, **kw) -> tuple:
    runs = [SeedFake(cfg, s, **kw) for s in cfg.seeds]
    return tune_on_validation(runs, [r.val for r in runs], ["baseline", "kd"], log=quiet), runs


@pytest.mark.parametrize("per_surface", [False, True])
def test_pooled_choice_differs_from_the_first_seeds_when_the_seeds_say_so(per_surface):
    extra = ["tune_per_surface=true"] if per_surface else []
    first, _ = tune(cfg_with(*extra))  # tune_seeds = 1: today's rule
    pooled3, runs = tune(cfg_with("tune_seeds=3", *extra))
    assert first.kd_point == {"feed": [1.0, 1.0], "stories": [1.0, 1.0]}
    assert first.epochs == {"kd": {"feed": 1, "stories": 1}, "baseline": {"feed": 1, "stories": 1}}
    assert pooled3.kd_point == {"feed": [2.0, 1.0], "stories": [2.0, 1.0]}
    assert pooled3.epochs == {"kd": {"feed": 2, "stories": 2}, "baseline": {"feed": 2, "stories": 2}}
    assert all(r.calls == 4 for r in runs)  # every tuning seed ran the grid and the baseline at E 1 and 2
    # a candidate's pooled score is the mean of its seeds' scores, each seed's kept beside it
    for c in [*pooled3.kd_scores, *pooled3.epoch_scores["baseline"]]:
        assert len(c["seeds"]) == 3
        assert c["ne"] == pytest.approx(np.mean([s["ne"] for s in c["seeds"]]))
        for sname in ("feed", "stories"):
            assert c["ne_per_surface"][sname] == pytest.approx(
                np.mean([s["ne_per_surface"][sname] for s in c["seeds"]]))
    assert all("seeds" not in c for c in first.kd_scores)  # one seed: the record is as before


def test_tune_seeds_1_reads_only_the_first_seed():
    cfg = cfg_with("tune_per_surface=true")
    runs = [SeedFake(cfg, s) for s in cfg.seeds]
    tuned = tune_on_validation(runs, [r.val for r in runs], ["baseline", "kd"], log=quiet)
    alone = tune_on_validation(runs[:1], [runs[0].val], ["baseline", "kd"], log=quiet)
    assert [r.calls for r in runs] == [8, 0, 0]
    assert tuned.kd_scores == alone.kd_scores and tuned.kd_point == alone.kd_point


@pytest.mark.parametrize("per_surface", [False, True])
def test_pooled_tuning_reads_each_seeds_own_validation_rows_never_the_evaluation_rows(per_surface):
    extra = ["tune_seeds=3", *(["tune_per_surface=true"] if per_surface else [])]
    base, _ = tune(cfg_with(*extra))
    garbage, _ = tune(cfg_with(*extra), eval_sharp=lambda c: -4.0 * c)
    assert garbage.kd_scores == base.kd_scores and garbage.epoch_scores == base.epoch_scores
    # the same rule on the evaluation rows chooses otherwise (so the check above can fail)
    cfg = cfg_with(*extra)
    runs = [SeedFake(cfg, s) for s in cfg.seeds]
    on_eval = tune_on_validation(runs, [r.eval for r in runs], ["baseline", "kd"], log=quiet)
    assert on_eval.kd_point != base.kd_point
    # every seed scored on seed 100's validation ids would leave 101-102 without rows: the choice would be
    # seed 100's alone, which it is not
    runs = [SeedFake(cfg, s) for s in cfg.seeds]
    wrong = tune_on_validation(runs, [runs[0].val] * 3, ["baseline", "kd"], log=quiet)
    assert wrong.kd_point == {"feed": [1.0, 1.0], "stories": [1.0, 1.0]} != base.kd_point


def test_pooled_leaves_out_a_seed_that_cannot_score_and_is_nan_when_none_can():
    a = {"ne": 0.9, "ne_per_surface": {"feed": 0.8}}
    b = {"ne": float("nan"), "ne_per_surface": {"feed": float("nan")}}
    assert pooled([a, b])["ne"] == 0.9 and pooled([a, b])["ne_per_surface"]["feed"] == 0.8
    assert np.isnan(pooled([b, b])["ne"])
    assert pooled([a]) == a


def test_tune_seeds_loads_from_toml_and_overrides_and_round_trips(tmp_path):
    toml = tmp_path / "t.toml"
    toml.write_text(Path(TINY).read_text().replace("seeds = [0]", "seeds = [0, 1, 2]\ntune_seeds = 2\n"
                                                   "validation_windows = 1"))
    cfg = load_experiment_config(toml, [TWO_ARMS])
    assert cfg.tune_seeds == 2
    assert load_experiment_config(toml, [TWO_ARMS, "tune_seeds=3"]).tune_seeds == 3
    save_config(cfg, tmp_path / "saved.toml")
    assert load_config(ExperimentConfig, tmp_path / "saved.toml") == cfg
    assert ExperimentConfig().tune_seeds == 1  # the original rule stays the default


@pytest.mark.parametrize("bad, match", [
    ([THREE_SEEDS, "validation_windows=1", "tune_seeds=0"], "tune_seeds: an integer from 1 to the number"),
    ([THREE_SEEDS, "validation_windows=1", "tune_seeds=4"], r"number of seeds \(3\), got 4"),
    ([THREE_SEEDS, "validation_windows=1", "tune_seeds=true"], "tune_seeds: expected an integer"),
    ([THREE_SEEDS, "tune_seeds=2"], "tune_seeds: chooses on the validation windows"),
])
def test_bad_tune_seeds_is_a_config_error_naming_the_key(bad, match):
    with pytest.raises(ConfigError, match=match):
        load_experiment_config(TINY, [TWO_ARMS, *bad])


def test_bad_tune_seeds_on_the_command_line_is_one_line_and_exit_2(tmp_path):
    p = subprocess.run([sys.executable, "-m", "opengem.cli", "transfer", "--config", TINY, "--out",
                        str(tmp_path), TWO_ARMS, THREE_SEEDS, "validation_windows=1", "tune_seeds=5"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().count("\n") == 0 and "tune_seeds" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "transfer.json").exists()


@pytest.mark.slow
def test_transfer_cli_tunes_on_two_seeds_pooled_and_records_it(tmp_path):
    """Through the CLI (about a minute on the shared 2 cores): two seeds, tune_seeds = 2; transfer.json
    records the tuning seeds, every candidate's per-seed scores, and each surface's choice is the lowest
    pooled validation NE."""
    from opengem import cli

    small = ["data.sim.rows=2000", "data.sim.days=4", "validation_windows=1", 'surfaces=["feed", "stories"]',
             "fm.train.epochs=1", TWO_ARMS, "bootstrap=20", "seeds=[0, 1]", "tune_seeds=2",
             "tune_epochs=[1, 2]", "tune_per_surface=true"]
    assert cli.main(["transfer", "--config", TINY, "--out", str(tmp_path), *small]) == 0
    res = json.loads((tmp_path / "transfer.json").read_text())
    kd, ep = res["kd_tuned"], res["epochs_per_window"]
    assert kd["tune_seeds"] == 2 and kd["tuned_on_seeds"] == [0, 1] and ep["tuned_on_seeds"] == [0, 1]
    assert res["config"]["tune_seeds"] == 2
    for s in ("feed", "stories"):
        best = min(kd["grid_ne"], key=lambda c: (c["ne_per_surface"][s], c["epochs"]))
        assert kd["surfaces"][s]["point"] == best["point"] and kd["surfaces"][s]["epochs"] == best["epochs"]
        for c in kd["grid_ne"]:
            assert len(c["seeds"]) == 2
            per_seed = [x["ne_per_surface"][s] for x in c["seeds"]]
            assert c["ne_per_surface"][s] == pytest.approx(np.mean(per_seed))


def test_a_labels_only_experiment_trains_no_kd_grid_and_records_no_kd_point():
    """The bigger baselines of a Pareto plot (arms = ["baseline"]) used to train every KD grid point at
    every tuned length (12 x 3 VMs per surface and seed) for a point no arm reads."""
    cfg = cfg_with("tune_seeds=3", "tune_per_surface=true", 'arms=["baseline"]')
    runs = [SeedFake(cfg, s) for s in cfg.seeds]
    grid_calls = []
    for r in runs:
        plain = r.run_lag

        def spy(lag, arms, arm_cfgs, kd_results=None, _plain=plain, **kw):
            grid_calls.append(kd_results is None)
            return _plain(lag, arms, arm_cfgs, kd_results=kd_results, **kw)

        r.run_lag = spy
    ids = [r.val for r in runs]
    tuned = tune_on_validation(runs, ids, ["baseline"], quiet)
    assert grid_calls and not any(grid_calls)
    assert tuned.epochs["baseline"] == {"feed": 2, "stories": 2}  # seeds 101-102 outweigh 100, as pooled
    assert tuned.record()["grid_ne"] == [] and tuned.record()["weight"] is None
