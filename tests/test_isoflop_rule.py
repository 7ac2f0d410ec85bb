"""The iso-FLOP study's rule as batches (bench/isoflop_rule.py) and the study with several workers."""

import random
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from opengem.bench.isoflop import IsoflopConfig, load_isoflop_config, run_study
from opengem.bench.isoflop_rule import Job, family_rule, run_rules

ISO_SMALL = Path(__file__).resolve().parents[1] / "configs" / "isoflop-small.toml"


def fake_ne(job: Job) -> float:
    """A made-up validation NE with a known optimum per budget: rate 1e-2 best at budget 0, 3e-3 above;
    size 1 best at budget 0, size 2 above; seeds jitter it."""
    best_lr = 1e-2 if job.budget == 0 else 3e-3
    best_size = 1 if job.budget == 0 else 2
    jitter = (zlib.crc32(job.name.encode()) % 1000 / 1000.0 - 0.5) * 1e-3
    return (0.8 - 0.01 * job.budget + 0.02 * abs(np.log10(job.lr / best_lr))
            + 0.01 * abs(job.size - best_size) + (0.005 if job.family == "dlrm" else 0.0) + jitter)


def _cfg(**kw) -> IsoflopConfig:
    cfg = IsoflopConfig(budgets=[1e8, 3e8, 1e9], seeds=3, lr_grid=[1e-3, 3e-3, 1e-2], lr_budgets="each",
                        lr_seeds=2, size_seeds=2, size_finalists=2, lr_check=True)
    for k, v in kw.items():
        setattr(cfg, k, v)
    return cfg


def _drive(cfg: IsoflopConfig, workers: int, fail: str | None = None) -> tuple[dict, list[str]]:
    done: dict[str, float] = {}
    calls: list[str] = []
    lock = threading.Lock()

    def run(job: Job) -> float:
        with lock:
            calls.append(job.name)
            if job.name in done:  # the study's run() answers a repeated request from its records
                return done[job.name]
        time.sleep(random.random() * 0.01 if workers > 1 else 0.0)  # finish in a shuffled order
        if job.name == fail:
            raise RuntimeError(f"{job.name} failed")
        with lock:
            done[job.name] = fake_ne(job)
        return done[job.name]

    rules = {fam: family_rule(cfg, fam, 3) for fam in ("gem", "dlrm")}
    return run_rules(rules, run, workers, cost=lambda job: float(job.budget)), calls


def test_rule_chooses_the_known_optimum_per_budget():
    choice, calls = _drive(_cfg(), 1)
    for fam in ("gem", "dlrm"):
        c = choice[fam]
        assert c.lr == [1e-2, 3e-3, 3e-3] and c.best == [1, 2, 2]
        assert [set(g) for g in c.lr_grid] == [{"0.001", "0.003", "0.01"}] * 3
        assert all(len(s) == 2 for s in c.size_choice)  # two finalists, each over two seeds
        assert set(c.lr_check) == {"0.001", "0.003", "0.01"}  # the neighbours of 3e-3 at the largest budget
    names = set(calls)
    for fam in ("gem", "dlrm"):
        for b, lr in enumerate([1e-2, 3e-3, 3e-3]):
            assert all(f"{fam}-s0-b{b}-lr{g:g}-seed{s}" in names for g in (1e-3, 3e-3, 1e-2) for s in (0, 1))
            assert all(f"{fam}-s{i}-b{b}-lr{lr:g}-seed0" in names for i in range(3))
        assert f"{fam}-s2-b2-lr0.003-seed2" in names and f"{fam}-s0-b2-lr0.003-seed2" not in names
    # one worker: each family's chain in the rule's order, family after family
    last_gem = max(i for i, n in enumerate(calls) if n.startswith("gem"))
    assert calls.index("dlrm-s0-b0-lr0.001-seed0") > last_gem


def test_rule_smallest_budget_rate_and_one_seed():
    cfg = _cfg(lr_budgets="smallest", lr_seeds=1, size_seeds=1, seeds=1, lr_check=False)
    choice, calls = _drive(cfg, 1)
    assert choice["gem"].lr == [1e-2] * 3 and len(choice["gem"].lr_grid) == 1
    assert choice["gem"].best == [1, 2, 2]
    assert not any(n.endswith("seed1") for n in calls)  # seeds = 1: no extra seeds, the empty batch skipped
    assert choice["gem"].lr_check == {}


def size_lr_ne(job: Job) -> float:
    """A made-up validation NE in which the best rate falls with size (1e-2, 3e-3, 1e-3 for sizes 0-2) and
    size 2 is the best size at the largest budget only when it trains at its own rate."""
    best_lr = (1e-2, 3e-3, 1e-3)[job.size]
    size_term = (-0.005 if job.budget == 2 else 0.005) * job.size
    return 0.8 + 0.02 * abs(np.log10(job.lr / best_lr)) + size_term + job.seed * 1e-5


def test_rule_each_size_trains_at_its_own_rate():
    """lr_sizes = "each": the grid (and its walk past the edge) runs on every rung at every budget, every size
    trains at its own rate, and the size choice compares sizes at their own rates; with one rate (rung 0's)
    the largest budget's best size is hidden behind a rate too high for it."""
    def drive(**kw):
        calls: list[str] = []

        def run(job: Job) -> float:
            calls.append(job.name)
            return size_lr_ne(job)

        cfg = _cfg(lr_seeds=1, lr_check=False, **kw)
        return run_rules({"gem": family_rule(cfg, "gem", 3)}, run)["gem"], set(calls)

    one, _ = drive(lr_sizes="one")
    assert one.lr == [1e-2] * 3 and one.best == [0, 0, 0]
    each, calls = drive(lr_sizes="each", lr_extend=1)
    assert each.lr_sizes == [[1e-2, 3e-3, 1e-3]] * 3
    assert each.best == [0, 0, 2] and each.lr == [1e-2, 1e-2, 1e-3]
    assert set(each.lr_grid[2]) == {f"s{i} {lr:g}" for i in range(3) for lr in (1e-3, 3e-3, 1e-2)} | {
        "s0 0.03", "s2 0.0003"}  # the edges walked past on rungs 0 and 2, not on rung 1 (bracketed)
    assert {"gem-s0-b1-lr0.03-seed0", "gem-s2-b1-lr0.0003-seed0"} <= calls
    assert not any(n.startswith("gem-s1") and ("0.03" in n or "0.0003" in n) for n in calls)
    assert "gem-s2-b2-lr0.001-seed2" in calls and "gem-s2-b2-lr0.01-seed1" not in calls


def test_several_workers_choose_what_one_worker_does():
    one, calls1 = _drive(_cfg(), 1)
    four, calls4 = _drive(_cfg(), 4)
    assert one == four
    assert sorted(set(calls1)) == sorted(set(calls4))


def test_a_failed_run_stops_the_study():
    with pytest.raises(RuntimeError, match="gem-s1-b1-lr0.003-seed0 failed"):
        _drive(_cfg(), 3, fail="gem-s1-b1-lr0.003-seed0")
    with pytest.raises(RuntimeError, match="failed"):
        _drive(_cfg(), 1, fail="dlrm-s0-b0-lr0.001-seed0")


def test_study_with_two_workers_matches_one_worker(tmp_path):
    """The same tiny study trained one run at a time in-process and two at a time in worker processes: the
    same runs, the same validation NE per run, the same frontier, rescored on the whole test day in-process or
    in worker processes; the workers' logs kept; a rerun reuses."""
    import csv

    over = ["budgets=[1.0e8, 4.0e8]", "seeds=2", "lr_grid=[]", "lr_check=false", "bootstrap=5", "min_steps=1",
            "frontier_test_rows=0"]
    extra = ["data.sim.rows=8000", "data.eval_batch_size=4096"]
    results = {}
    for workers in (1, 2):
        cfg = load_isoflop_config(ISO_SMALL, [*over, f"workers={workers}"], ["dlrm"])
        cfg.families[0].sizes = cfg.families[0].sizes[:2]
        data = tmp_path / "w1" / "data" if workers == 2 else None
        results[workers] = run_study(cfg, tmp_path / f"w{workers}", data, run_overrides=extra,
                                     log=lambda m: None)
    a, b = results[1], results[2]
    assert a["runs"] == b["runs"] == b["runs_trained_now"] == 2 * 2 + 2 * 1  # every size, then a seed
    # the same choices; NE equal up to float noise (a fresh process's first run can differ in the 9th digit)
    fa, fb = a["frontier"]["dlrm"], b["frontier"]["dlrm"]
    assert [(p["size"], p["lr"], p["seeds"]) for p in fa] == [(p["size"], p["lr"], p["seeds"]) for p in fb]
    assert [p["ne"] for p in fa] == pytest.approx([p["ne"] for p in fb], rel=1e-6)
    assert [p["test_rows"] for p in fa] == [p["test_rows"] for p in fb] == [8000 // 8] * 2
    assert a["lr"]["chosen"] == b["lr"]["chosen"]
    assert a["lr"]["grid"]["dlrm"] == pytest.approx(b["lr"]["grid"]["dlrm"], rel=1e-6)

    def rows(d: Path) -> list[tuple[str, float]]:
        with open(d / "isoflop_runs.csv") as f:
            return [(r["name"], float(r["valid_ne"])) for r in csv.DictReader(f)]

    ra, rb = rows(tmp_path / "w1"), rows(tmp_path / "w2")
    assert [n for n, _ in ra] == [n for n, _ in rb]  # the same runs, in the same order
    assert [v for _, v in ra] == pytest.approx([v for _, v in rb], rel=1e-6)
    assert len(list((tmp_path / "w2" / "logs").glob("*.txt"))) == b["runs"]
    cfg = load_isoflop_config(ISO_SMALL, [*over, "workers=2"], ["dlrm"])
    cfg.families[0].sizes = cfg.families[0].sizes[:2]
    again = run_study(cfg, tmp_path / "w2", tmp_path / "w1" / "data", run_overrides=extra, log=lambda m: None)
    assert again["runs_trained_now"] == 0


def test_workers_config_checked():
    from opengem.config import ConfigError

    with pytest.raises(ConfigError, match="workers"):
        load_isoflop_config(ISO_SMALL, ["workers=0"])


def test_lr_extend_walks_past_the_grid_edge_until_the_best_rate_is_bracketed():
    """fake_ne's best rate at budget 0 is 1e-2, the grid's top: one step up (3e-2) brackets it; above budget 0
    the best (3e-3) is inside the grid, so nothing more runs there. With the optimum moved above the grid the
    walk goes on until lr_extend steps are spent."""
    choice, calls = _drive(_cfg(lr_extend=2), 1)
    for fam in ("gem", "dlrm"):
        c = choice[fam]
        assert c.lr == [1e-2, 3e-3, 3e-3]
        assert set(c.lr_grid[0]) == {"0.001", "0.003", "0.01", "0.03"}
        assert [set(g) for g in c.lr_grid[1:]] == [{"0.001", "0.003", "0.01"}] * 2
        assert f"{fam}-s0-b0-lr0.03-seed1" in calls and f"{fam}-s0-b0-lr0.1-seed0" not in calls
    none, _ = _drive(_cfg(lr_extend=0), 1)
    assert [set(g) for g in none["gem"].lr_grid] == [{"0.001", "0.003", "0.01"}] * 3


def test_next_rate_steps_outward_from_an_edge_and_stops_inside_or_on_nan():
    from opengem.bench.isoflop_rule import next_rate

    rates = [1e-3, 3e-3, 1e-2]
    assert next_rate(rates, {1e-3: 0.9, 3e-3: 0.8, 1e-2: 0.7}) == 3e-2
    assert next_rate(rates, {1e-3: 0.7, 3e-3: 0.8, 1e-2: 0.9}) == 3e-4
    assert next_rate(rates, {1e-3: 0.9, 3e-3: 0.7, 1e-2: 0.8}) is None
    assert next_rate(rates + [3e-2], {1e-3: 0.9, 3e-3: 0.8, 1e-2: 0.75, 3e-2: 0.7}) == 1e-1
    nan = float("nan")
    assert next_rate(rates, {1e-3: nan, 3e-3: nan, 1e-2: nan}) is None
    assert next_rate(rates, {1e-3: 0.9, 3e-3: 0.8, 1e-2: nan}) is None  # the top diverged: 3e-3 is inside
    assert next_rate([1e-3], {1e-3: 0.5}) is None


def test_lr_extend_with_lr_check_when_the_chosen_rate_lies_beyond_the_grid():
    """Best rate 3e-3 at budget 0 (inside the grid), 3e-2 above it (beyond): the walk finds 3e-2 at the larger
    budgets only, and the transfer check reruns the largest budget's neighbours among the rates tried there.
    """
    def ne(job: Job) -> float:
        best = 3e-3 if job.budget == 0 else 3e-2
        return 0.8 + 0.02 * abs(np.log10(job.lr / best)) + 0.01 * abs(job.size - 1)

    choice = run_rules({"gem": family_rule(_cfg(lr_extend=2, lr_seeds=1), "gem", 3)}, ne)["gem"]
    assert choice.lr == [3e-3, 3e-2, 3e-2]
    assert set(choice.lr_grid[0]) == {"0.001", "0.003", "0.01"}
    assert [set(g) for g in choice.lr_grid[1:]] == [{"0.001", "0.003", "0.01", "0.03", "0.1"}] * 2
    assert set(choice.lr_check) == {"0.01", "0.03", "0.1"}
