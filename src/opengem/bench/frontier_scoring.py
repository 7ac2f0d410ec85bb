"""The iso-FLOP study's last step: its frontier runs scored again on whole days, from their checkpoints.

Every frontier run is scored on the same rows (its calibration refitted on the whole validation day, its
test on the whole test day), so the runs given to one process share each pass over a day: a batch is
read and decoded once and given to every model. Scoring them one pass per run decoded each day once per
run, and decoding was a fifth to a third of a run's scoring (session 45, one process: 6.4 s of the study's
DCNv2's 20.6 s over the two 800,000-row days, 6.2 of GEM's 34.5; the models' forward and imports the rest).
A run's result is the one it gets alone.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from opengem.data.commit import atomic_write_text


def eval_batches(rc: Any, eval_rows: int) -> int:
    """Whole evaluation batches that cover the first ``eval_rows`` rows (0 = all batches)."""
    batch = rc.data.eval_batch_size or rc.data.batch_size
    return -(-eval_rows // batch) if eval_rows else 0


def frontier_test(run_dir: Path, test_spec: str, rows: int, threads: int = 1, calibration_rows: int = -1
                  ) -> dict[str, Any]:
    """A finished run's test metrics on the first ``rows`` rows of ``test_spec`` (0 = all), from its final
    checkpoint (calibrated as ``opengem evaluate`` would; for a calibrated run and ``calibration_rows`` >= 0,
    through a fit made now on that many rows of its validation day, 0 = all, as ``opengem calibrate`` does),
    cached in RUN/frontier_test.json for the run's result.json (its config_sha256 and calibration), the spec
    and the rows."""
    run_dir = Path(run_dir)
    return frontier_tests([run_dir], test_spec, rows, threads, calibration_rows)[run_dir.name]


def frontier_tests(run_dirs: list[Path], test_spec: str, rows: int, threads: int = 1,
                   calibration_rows: int = -1) -> dict[str, dict[str, Any]]:
    """:func:`frontier_test` of several runs, by run folder name, in one process: the runs not cached
    yet are opened together and each day is read once for all of those that score the same rows."""
    import torch

    if len({Path(d).name for d in run_dirs}) != len(run_dirs):
        raise ValueError("frontier_tests: run folders need distinct names")
    out: dict[str, dict[str, Any]] = {}
    todo: dict[str, tuple[Path, dict[str, Any]]] = {}
    for run_dir in map(Path, run_dirs):
        key, cached = _cached(run_dir, test_spec, rows, calibration_rows)
        if cached is not None:
            out[run_dir.name] = cached
        else:
            todo[run_dir.name] = (run_dir, key)
    if not todo:
        return out
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    try:
        out.update(_score_together(todo, test_spec, rows, calibration_rows))
    finally:
        torch.set_num_threads(before)
    return {Path(d).name: out[Path(d).name] for d in run_dirs}


def _cached(run_dir: Path, test_spec: str, rows: int, calibration_rows: int
            ) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(the cache key of the run's scoring, RUN/frontier_test.json when it was written for that key)."""
    done, cache = json.loads((run_dir / "result.json").read_text()), run_dir / "frontier_test.json"
    key: dict[str, Any] = {"config_sha256": done.get("config_sha256"),
                           "calibrate": done.get("calibrate", "none"), "test_spec": test_spec, "rows": rows}
    refit = calibration_rows >= 0 and key["calibrate"] != "none"
    if refit:
        key["calibration_rows"] = calibration_rows
    if cache.exists():
        got = json.loads(cache.read_text())
        if {k: got.get(k) for k in key} == key and (refit or "calibration_rows" not in got):
            return key, got
    return key, None


def _score_together(todo: Mapping[str, tuple[Path, dict[str, Any]]], test_spec: str, rows: int,
                    calibration_rows: int) -> dict[str, dict[str, Any]]:
    from opengem.train.evaluate import open_run

    with contextlib.ExitStack() as stack:
        opened = {name: stack.enter_context(open_run(run_dir, calibrated="calibration_rows" not in key))
                  for name, (run_dir, key) in todo.items()}
        refit = [name for name, (_, key) in todo.items() if "calibration_rows" in key]
        fit_rows: dict[str, int | None] = dict.fromkeys(todo)
        for group in _same_rows(opened, refit, lambda r: r.cfg.data.eval, calibration_rows):
            fit_rows.update(_refit_calibration({n: opened[n] for n in group},
                                               {n: todo[n][1]["calibrate"] for n in group}, calibration_rows))
        metrics: dict[str, dict[str, Any]] = {}
        for group in _same_rows(opened, list(todo), lambda r: test_spec, rows):
            metrics.update(_test({n: opened[n] for n in group}, test_spec, rows))
    out = {}
    for name, (run_dir, key) in todo.items():
        res = metrics[name]
        out[name] = {**key, "eval_batches": res["eval_batches"], "rows_scored": res["rows"],
                     "metrics": res["metrics"], "calibration_fit_rows": fit_rows[name]}
        atomic_write_text(run_dir / "frontier_test.json", json.dumps(out[name], indent=2))
    return out


def _same_rows(opened: Mapping[str, Any], names: list[str], spec_of: Any, rows: int) -> list[list[str]]:
    """``names`` grouped by the batches they would read: the same data, partitions, batch size, rows and
    loader settings give the same batches, so one pass serves the group."""
    groups: dict[tuple[Any, ...], list[str]] = {}
    for name in names:
        r = opened[name]
        d = r.cfg.data
        key = (str(Path(r.data_path).resolve()), spec_of(r), d.eval_batch_size or d.batch_size,
               eval_batches(r.cfg, rows), d.num_workers, d.on_error)
        groups.setdefault(key, []).append(name)
    return list(groups.values())


def _refit_calibration(runs: Mapping[str, Any], methods: Mapping[str, str], calibration_rows: int
                       ) -> dict[str, int]:
    """Fit each run's calibration on the first ``calibration_rows`` rows of its validation partitions (one
    pass for all of them) and fold it into its model; returns the rows each fit saw."""
    from opengem.train.calibrate import calibrate_models
    from opengem.train.data import make_loader

    first = next(iter(runs.values()))
    schema = first.ds.schema
    batches = make_loader(first.ds, first.cfg.data.eval, first.cfg.data, train=False)
    _fits, fit_rows = calibrate_models({n: r.model for n, r in runs.items()}, batches, first.device,
                                       list(schema.surfaces), schema.task_names, methods,
                                       max_batches=eval_batches(first.cfg, calibration_rows))
    return dict.fromkeys(runs, fit_rows)


def _test(runs: Mapping[str, Any], test_spec: str, rows: int) -> dict[str, dict[str, Any]]:
    """Each run's metrics on the first ``rows`` rows of ``test_spec``, one pass for all of them."""
    from opengem.train.data import make_loader
    from opengem.train.evaluate import evaluate_models

    first = next(iter(runs.values()))
    batches = eval_batches(first.cfg, rows)
    res = evaluate_models({n: r.model for n, r in runs.items()},
                          make_loader(first.ds, test_spec, first.cfg.data, train=False), first.ds.schema,
                          first.device, max_batches=batches)
    return {name: {**r, "eval_batches": batches} for name, r in res.items()}
