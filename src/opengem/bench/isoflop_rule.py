"""The iso-FLOP study's selection rule, per family, as batches of runs; and the loop that trains them.

The rule (bench/isoflop.py, steps 1-4) is written once, as a generator per family that yields a batch of
runs whose results it needs next and receives every finished run's validation NE. Runs inside a batch do not
depend on one another (the grid's rates; a budget's sizes; the extra seeds), and families never depend on each
other, so :func:`run_rules` can keep ``workers`` runs going at once, longest first, while the choices stay
exactly those of the one-at-a-time study (the same rule reads the same numbers).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Job:
    """One run the rule asks for; ``role`` says why (lr-grid, grid, size-choice, frontier, lr-check)."""

    family: str
    size: int
    budget: int
    lr: float | None
    seed: int
    role: str

    @property
    def name(self) -> str:
        return run_name(self.family, self.size, self.budget, self.lr, self.seed)


@dataclass
class FamilyChoice:
    """What the rule chose for one family: a rate and a size per budget, and the numbers behind them."""

    lr: list[float | None]  # per budget: the rate of the size chosen there
    # per budget the grid ran at: rate -> mean validation NE ("s<rung> <rate>" with lr_sizes = "each")
    lr_grid: list[dict[str, float]]
    best: list[int]
    size_choice: list[dict[str, float]]  # per budget: finalist size -> mean validation NE
    lr_check: dict[str, float] = field(default_factory=dict)  # rate -> validation NE at the largest budget
    lr_sizes: list[list[float | None]] = field(default_factory=list)  # per budget, per size: its rate


Rule = Generator[list[Job], dict[str, float], FamilyChoice]


def run_name(family: str, size: int, budget: int, lr: float | None, seed: int) -> str:
    return f"{family}-s{size}-b{budget}-lr{'recipe' if lr is None else format(lr, 'g')}-seed{seed}"


def nan_last(x: float) -> float:
    return x if x == x else float("inf")


def next_rate(rates: list[float], scores: dict[float, float]) -> float | None:
    """The rate one grid step beyond the edge the best of ``rates`` (ascending) sits on, or None when the best
    is inside them (the optimum is bracketed) or did not train (NaN). The step is the rates' own ratio at
    that edge; on a 1-3-10 grid the new rate stays on it (1e-3, 3e-3, 1e-2 -> 3e-2, then 1e-1; 3e-4 below),
    otherwise it is rounded to one significant digit."""
    if len(rates) < 2:
        return None
    best = min(rates, key=lambda lr: nan_last(scores[lr]))
    if scores[best] != scores[best]:
        return None
    if best == rates[-1]:
        new = best * rates[-1] / rates[-2]
    elif best == rates[0]:
        new = best * rates[0] / rates[1]
    else:
        return None
    if all(_mantissa(lr) in (1, 3) for lr in rates):
        e0 = math.floor(math.log10(new))
        return min((float(f"{m}e{e}") for e in range(e0 - 1, e0 + 2) for m in (1, 3)),
                   key=lambda c: abs(math.log(c / new)))
    return float(f"{new:.0e}")


def _mantissa(lr: float) -> float:
    return round(lr / 10.0 ** math.floor(math.log10(lr)), 6)


def family_rule(cfg: Any, family: str, n_sizes: int) -> Rule:
    """Steps 1-4 of the study for one family (``cfg``: an IsoflopConfig). Each ``yield`` is a batch of runs;
    the answer is the validation NE of every finished run by name (at least this batch's)."""
    n_budgets = len(cfg.budgets)
    grid: list[float | None] = list(cfg.lr_grid) or [None]
    each_budget = cfg.lr_budgets == "each"
    each_size = cfg.lr_sizes == "each"
    # the grid's units: (budget, rung) pairs that each get a rate of their own
    units = [(b, i) for b in range(n_budgets if each_budget else 1)
             for i in (range(n_sizes) if each_size else [cfg.lr_size])]

    def ne(size: int, b: int, lr: float | None, seed: int) -> float:
        return answers[run_name(family, size, b, lr, seed)]

    def grid_ne(u: tuple[int, int], lr: float | None) -> float:
        return float(np.mean([ne(u[1], u[0], lr, s) for s in range(cfg.lr_seeds)]))

    # 1. the learning rate: the grid on rung lr_size (or on every rung), at the smallest budget or at each
    answers = yield [Job(family, i, b, lr, seed, "lr-grid")
                     for b, i in units for lr in grid for seed in range(cfg.lr_seeds)]
    tried = {u: list(grid) for u in units}
    # ... walked outward while a unit's best rate is an edge of the rates tried there (lr_extend steps)
    for _ in range(cfg.lr_extend if cfg.lr_grid else 0):
        step = {u: lr for u in units
                if (lr := next_rate(sorted(tried[u]), {r: grid_ne(u, r) for r in tried[u]})) is not None}
        if not step:
            break
        answers = yield [Job(family, i, b, lr, seed, "lr-grid")
                         for (b, i), lr in step.items() for seed in range(cfg.lr_seeds)]
        for u, lr in step.items():
            tried[u].append(lr)
    chosen: dict[tuple[int, int], float | None] = {}
    lr_grid: list[dict[str, float]] = [{} for _ in range(n_budgets if each_budget else 1)]
    for u in units:
        rates = sorted(tried[u], key=lambda lr: 0.0 if lr is None else lr)
        scores = {lr: grid_ne(u, lr) for lr in rates}
        chosen[u] = min(rates, key=lambda lr: nan_last(scores[lr]))
        tag = f"s{u[1]} " if each_size else ""
        lr_grid[u[0]].update({tag + ("recipe" if lr is None else format(lr, "g")): v
                              for lr, v in scores.items()})

    def unit_of(b: int, i: int) -> tuple[int, int]:  # the grid unit whose rate size i trains at, at budget b
        return (b if each_budget else 0, i if each_size else cfg.lr_size)

    def rate(b: int, i: int) -> float | None:
        return chosen[unit_of(b, i)]

    lr_sizes = [[rate(b, i) for i in range(n_sizes)] for b in range(n_budgets)]
    # 2. every size at every budget, seed 0, at its rate there (already trained by the grid where it ran)
    answers = yield [Job(family, i, b, rate(b, i), 0, "grid")
                     for b in range(n_budgets) for i in range(n_sizes)]
    # 3. the size: seed 0's best, or the finalists' mean over size_seeds seeds; then the extra seeds there
    keep = cfg.size_finalists if cfg.size_seeds > 1 else 1
    finalists = [sorted(range(n_sizes), key=lambda i: nan_last(ne(i, b, rate(b, i), 0)))[:keep]
                 for b in range(n_budgets)]
    answers = yield [Job(family, i, b, rate(b, i), s, "size-choice") for b in range(n_budgets)
                     for i in finalists[b] for s in range(cfg.size_seeds)]
    best, size_choice = [], []
    for b in range(n_budgets):
        scores = {i: float(np.mean([ne(i, b, rate(b, i), s) for s in range(cfg.size_seeds)]))
                  for i in finalists[b]}
        best.append(min(finalists[b], key=lambda i: nan_last(scores[i])))
        size_choice.append({str(i): v for i, v in scores.items()})
    lrs = [rate(b, best[b]) for b in range(n_budgets)]
    answers = yield [Job(family, best[b], b, lrs[b], s, "frontier") for b in range(n_budgets)
                     for s in range(1, cfg.seeds)]
    choice = FamilyChoice(lrs, lr_grid, best, size_choice, lr_sizes=lr_sizes)
    # 4. does the rate transfer? its grid neighbours at the largest budget's best size
    if cfg.lr_check and cfg.lr_grid:
        last = n_budgets - 1
        grid_s = sorted(tried[unit_of(last, best[last])])  # type: ignore[type-var]  # the last rate's rates
        j = grid_s.index(lrs[last])
        near = grid_s[max(j - 1, 0):j + 2]
        answers = yield [Job(family, best[last], last, lr, 0, "lr-check") for lr in near]
        choice.lr_check = {format(lr, "g"): ne(best[last], last, lr, 0) for lr in near}
    return choice


def run_rules(rules: dict[str, Rule], run: Callable[[Job], float], workers: int = 1,
              cost: Callable[[Job], float] | None = None) -> dict[str, FamilyChoice]:
    """Drive every family's rule to its end: ``run(job)`` trains (or reuses) one run and returns its
    validation NE. One worker: in this thread, family after family, in the rule's order. More: ``workers``
    threads (each ``run`` is expected to start its own process), the ready runs with the highest ``cost``
    first; the first failure stops new runs, lets the running ones finish and is raised."""
    answers: dict[str, float] = {}
    choices: dict[str, FamilyChoice] = {}
    batches: dict[str, list[Job]] = {}

    def advance(fam: str, first: bool = False) -> None:
        while True:  # skip empty batches (e.g. seeds = 1 asks for no extra seeds)
            try:
                batch = next(rules[fam]) if first else rules[fam].send(answers)
            except StopIteration as stop:
                choices[fam] = stop.value
                batches.pop(fam, None)
                return
            first = False
            if batch:
                batches[fam] = batch
                return

    for fam in rules:
        advance(fam, first=True)
    if workers <= 1:
        while batches:
            fam = next(iter(batches))
            for job in batches[fam]:
                answers[job.name] = run(job)
            advance(fam)
        return choices
    left: dict[str, int] = {}
    queue: list[tuple[str, Job]] = []

    def enqueue(fam: str) -> None:
        left[fam] = len(batches[fam])
        queue.extend((fam, job) for job in batches[fam])

    for fam in list(batches):
        enqueue(fam)
    running: dict[Future[float], tuple[str, Job]] = {}
    error: BaseException | None = None
    with ThreadPoolExecutor(workers) as pool:
        while queue or running:
            if error is None:
                queue.sort(key=lambda fj: -(cost(fj[1]) if cost else 0.0))
                while queue and len(running) < workers:
                    fam, job = queue.pop(0)
                    running[pool.submit(run, job)] = (fam, job)
            elif not running:
                break
            done, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for fut in done:
                fam, job = running.pop(fut)
                if fut.exception() is not None:
                    error = error or fut.exception()
                    continue
                answers[job.name] = fut.result()
                left[fam] -= 1
                if left[fam] == 0 and error is None:
                    advance(fam)
                    if fam in batches:
                        enqueue(fam)
    if error is not None:
        raise error
    return choices
