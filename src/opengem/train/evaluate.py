"""``opengem evaluate``: NE, AUC and calibration of a trained run per surface x task -> RUN/eval-<spec>.json.

The run's resolved config.toml rebuilds the model exactly; its checkpoint supplies the weights: the one
early stopping kept (RUN/checkpoints/best) when there is one, else the newest. Each partition selection
gets its own file (``eval-valid.json``, ``eval-test.json``), so evaluating one does not overwrite
another; the run's default selection (``data.eval``) is also written to RUN/eval.json, the file the
report and older readers look for. When the dataset was simulated (it has truth/ files) the oracle NE on
the same partitions is reported beside the model's, as the floor no model can beat.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from opengem.data.batch import Batch
from opengem.data.commit import atomic_write_text
from opengem.data.dataset import Dataset
from opengem.data.oracle import accumulate
from opengem.data.schema import FeatureSchema, schema_differences
from opengem.errors import DatasetError, OpengemError, UsageError
from opengem.metrics import NE_BASE_RATE, MetricAccumulator
from opengem.model.heads import masked_bce
from opengem.run_arg import add_run_argument, resolve_run
from opengem.train import checkpoint as ckpt
from opengem.train.calibration import apply_run_calibration, describe_calibration
from opengem.train.compile import prepare_compile
from opengem.train.config import RunConfig, load_run_config
from opengem.train.data import make_loader
from opengem.train.distributed import gather_objects, lockstep, process_group, world_size
from opengem.train.env import cpu_threads, resolve_device
from opengem.train.parallelize import build_run_model
from opengem.train.published import (
    VERSIONS,
    VersionError,
    list_versions,
    read_version,
    split_version,
    version_files,
)
from opengem.train.run_dir import CONFIG_FILE, checkpoint_run_id
from opengem.train.step import task_weights

LogitObserver = Callable[[str, torch.Tensor, Batch], None]
"""Called by :func:`evaluate_models` with (model name, logits [B, T], batch) for every batch it scores."""


class EvalDataError(DatasetError):
    """The evaluation rows give nothing to measure: no rows, or no observed label in any of them."""


class RunNotFoundError(OpengemError, FileNotFoundError):
    """``--run`` is not a training run folder."""


@torch.no_grad()
def evaluate_model(model: nn.Module, batches: Iterable[Batch], schema: FeatureSchema, device: torch.device,
                   max_batches: int = 0, on_logits: LogitObserver | None = None) -> dict[str, Any]:
    """Metrics over ``batches`` (all of them, or the first ``max_batches``); model is left in eval mode.

    Under several ranks each rank passes its own shard; ranks step in lockstep (a sharded model needs
    every rank in every forward) and predictions are gathered, so every rank returns the global metrics.
    ``on_logits(name, logits, batch)`` sees each of this rank's batches with the model's logits, so a caller
    that needs them too (a calibration fit, calibrated metrics) does not pay a second pass over the rows.
    """
    return evaluate_models({"model": model}, batches, schema, device, max_batches, on_logits)["model"]


@torch.no_grad()
def evaluate_models(models: Mapping[str, nn.Module], batches: Iterable[Batch], schema: FeatureSchema,
                    device: torch.device, max_batches: int = 0, on_logits: LogitObserver | None = None
                    ) -> dict[str, dict[str, Any]]:
    """:func:`evaluate_model` of several models, by name, in one pass over ``batches``: each batch is read
    and decoded once and given to every model (the iso-FLOP study scores its frontier runs on the same
    whole test day; a pass per run decoded the day once per run). Each model's result is the one
    :func:`evaluate_model` gives it alone."""
    for model in models.values():
        model.eval()
    accs = {name: MetricAccumulator(schema.surfaces, schema.task_names) for name in models}
    weights = task_weights(schema, device)
    loss_sums = dict.fromkeys(models, 0.0)
    n_batches, rows, labelled = 0, 0, 0
    for batch, real in lockstep(batches, device, max_batches):
        batch = batch.to(device)
        logits = {name: model(batch).logits for name, model in models.items()}
        if not real:  # this rank's shard ran out; it only keeps the others' forward going
            continue
        n_batches += 1
        rows += batch.batch_size
        labelled += int(batch.label_mask.bool().sum())
        for name, z in logits.items():
            loss_sums[name] += float(masked_bce(z, batch.labels, batch.label_mask, weights))
            accs[name].update(torch.sigmoid(z.float()), batch.labels, batch.label_mask, batch.surface)
            if on_logits is not None:
                on_logits(name, z, batch)
    if world_size() > 1:
        states = {name: acc.state() for name, acc in accs.items()}
        parts = gather_objects((n_batches, rows, labelled, loss_sums, states))
        n_batches, rows, labelled = (sum(x[i] for x in parts) for i in range(3))
        loss_sums = {name: sum(x[3][name] for x in parts) for name in models}
        accs = {name: MetricAccumulator(schema.surfaces, schema.task_names) for name in models}
        for *_, states in parts:  # in rank order, as before
            for name, acc in accs.items():
                acc.merge(states[name])
    if rows == 0:
        raise EvalDataError("the evaluation partitions gave no rows")
    if labelled == 0:  # the loss would read 0.0 and the metrics be empty: nothing was measured
        raise EvalDataError(f"none of the {rows} evaluation rows has an observed label (every task label is "
                            "null): nothing to evaluate; choose partitions with labels")
    return {name: {"metrics": accs[name].compute(), "loss": loss_sums[name] / n_batches, "rows": rows}
            for name in models}


class Validator:
    """Evaluation during training decides its own timing: every ``every`` steps (0 = only at the end),
    on at most ``max_batches`` batches' rows (0 = all; the Trainer spreads them over the partitions)."""

    def __init__(self, every: int = 0, max_batches: int = 0) -> None:
        self.every, self.max_batches = every, max_batches

    def should_run(self, step: int) -> bool:
        return bool(self.every) and step % self.every == 0


BEST = "best"  # RUN/checkpoints/best: written by the Trainer's early stopping


def run_checkpoint(run_dir: Path) -> tuple[Path, bool]:
    """(checkpoint to use, whether it is early stopping's best): best when it is this run's own and
    complete, else the newest checkpoint of the run."""
    run_id = checkpoint_run_id(run_dir)
    best = run_dir / ckpt.CHECKPOINTS / BEST
    try:
        if best.is_dir() and (run_id is None or ckpt.read_meta(best).get("run_id") == run_id):
            return best, True
    except ckpt.CheckpointError:
        pass  # an incomplete best (the run died while writing it): fall back to the newest
    return ckpt.latest_checkpoint(run_dir, run_id=run_id), False  # only the run's own


def eval_file_name(spec: str, version: int | None = None, dataset: str | None = None) -> str:
    """``eval-<spec>.json`` with the spec made a safe file name: ``@valid`` -> ``eval-valid.json``; of a
    published version, ``eval-v0003-valid.json``; of another dataset than the run's (``--data``), its
    folder's name too, ``eval-<dataset>-test.json``, so that it never replaces the run's own result."""
    def safe(text: str) -> str:
        return re.sub(r"[^A-Za-z0-9._=-]+", "_", text).strip("_.") or "all"

    where = "" if dataset is None else f"{safe(dataset)}-"
    return f"eval-{'' if version is None else f'v{version:04d}-'}{where}{safe(spec)}.json"


@dataclass
class OpenRun:
    """A trained run's model rebuilt and loaded, with what evaluation and prediction need beside it."""

    cfg: RunConfig
    ds: Dataset
    data_path: Path
    model: nn.Module
    device: torch.device
    checkpoint: Path
    best: bool  # the checkpoint is early stopping's best
    step: int
    run_dir: Path  # the run folder (of RUN@N: RUN)
    version: int | None  # the published version opened (RUN@N); None: the run's own checkpoint
    calibration: dict[str, Any] | None = None  # RUN/calibration.json as applied (None: none applied)

    @property
    def checkpoint_kind(self) -> str:
        """Which of the run's models this is, as evaluate and predict print it."""
        if self.version is not None:
            return f"published version {self.version}"
        return "best (early stopping)" if self.best else "newest"


def own_checkpoint(run_dir: Path) -> tuple[Path, bool]:
    """:func:`run_checkpoint` of a run folder named without a version, or a RunNotFoundError that says what
    the folder is: none, not a run, or an online run (whose models are its published versions)."""
    if not (run_dir / CONFIG_FILE).exists():
        raise RunNotFoundError(not_a_run(run_dir))
    if not (run_dir / ckpt.CHECKPOINTS).is_dir() and (run_dir / VERSIONS).is_dir():
        known = _published(run_dir)
        raise RunNotFoundError(
            f"{run_dir}: an online run keeps its models as published versions ({run_dir / VERSIONS}): "
            + (f"name one, e.g. {run_dir}@{known[-1]} (the newest)" if known else "none is published yet"))
    return run_checkpoint(run_dir)


def not_a_run(run_dir: Path) -> str:
    """Why ``run_dir`` is not a run folder, in the words that help."""
    if not run_dir.exists():
        return f"{run_dir}: no such folder"
    return f"{run_dir}: no config.toml (is it a training run folder?)"


def _check_readable(run_dir: Path, cfg: RunConfig, ds: Dataset) -> None:
    """--data of another schema than the run trained on is named as such (it failed loading the checkpoint,
    blamed on the checkpoint: 'saved by a different model')."""
    try:
        trained = Dataset(cfg.data.path).schema
    except (DatasetError, OSError):
        return  # the run's own data is gone: the checkpoint's fingerprint check is what is left
    diffs = schema_differences(trained, ds.schema)
    if diffs:
        raise UsageError(f"--data {ds.root} has schema {ds.schema.name!r}, but {run_dir} was trained on "
                         f"schema {trained.name!r}; they differ in {'; '.join(diffs)}: give data of the "
                         "run's schema")


def _published(run_dir: Path) -> list[int]:
    """The run's published version numbers, oldest first ([] when it has none, or none readable)."""
    try:
        return sorted(v.version for v in list_versions(run_dir))
    except VersionError:
        return []


@contextlib.contextmanager
def open_run(run_dir: str | Path, data_dir: str | Path | None = None, device: str | None = None,
             calibrated: bool = True) -> Iterator[OpenRun]:
    """Rebuild a run's model from RUN/config.toml and load its checkpoint (see :func:`run_checkpoint`),
    inside a process group that lives as long as the ``with`` block; with ``calibrated`` the run's
    calibration (``opengem calibrate``) is folded in when it was fitted on that checkpoint.

    ``RUN@N`` (or ``RUN@v0003``) opens published version N of an online or versioned run instead, from its
    own manifest and checkpoint: how one compares the versions a continuously training run published. A
    run's calibration is fitted on the run's own checkpoints and never applies to a version."""
    run_dir, version = split_version(run_dir)
    if not (run_dir / CONFIG_FILE).exists():
        raise RunNotFoundError(not_a_run(run_dir))
    best = False
    if version is not None:
        try:  # this version's manifest only: another version's damaged one must not block it
            cfg_path, path = version_files(read_version(run_dir, version))
        except VersionError as e:
            known = _published(run_dir)
            raise RunNotFoundError(f"{run_dir}@{version}: {e}" + (
                f" (published: {', '.join(str(n) for n in known)})" if known else "")) from None
    else:
        cfg_path = run_dir / CONFIG_FILE
        path, best = own_checkpoint(run_dir)
    cfg = load_run_config(cfg_path)
    prepare_compile(cfg)  # a compiled run evaluates with the same persistent compile cache
    data_path = Path(data_dir or cfg.data.path)
    ds = Dataset(data_path)
    if data_dir is not None:
        _check_readable(run_dir, cfg, ds)
    dev = resolve_device(device or cfg.train.device)
    with process_group(dev) as pg, cpu_threads(cfg.train.threads):
        model = build_run_model(ds.schema, cfg, dev, pg).model
        step = ckpt.load_model(model, path)
        applied = (apply_run_calibration(model, run_dir, path, list(ds.schema.surfaces), ds.schema.task_names)
                   if calibrated and version is None else None)
        yield OpenRun(cfg, ds, data_path, model, dev, path, best, step, run_dir, version, applied)


def evaluate_run(run_dir: str | Path, data_dir: str | Path | None = None, partitions: str | None = None,
                 device: str | None = None, write: bool = True) -> dict[str, Any]:
    """Rebuild a run's model, load its checkpoint, evaluate and write RUN/eval-<spec>.json (and
    RUN/eval.json for the run's default selection); the result names the file in ``written``. ``RUN@N``
    evaluates published version N and writes RUN/eval-vNNNN-<spec>.json (and RUN/eval-vNNNN.json): the
    version's own folder is a digest-checked checkpoint, never written after it is published."""
    with open_run(run_dir, data_dir, device) as r:
        cfg, ds, data_path, run_dir, version = r.cfg, r.ds, r.data_path, r.run_dir, r.version
        spec = partitions or cfg.data.eval
        chosen = ds.select(spec)
        try:
            res = evaluate_model(r.model, make_loader(ds, spec, cfg.data, train=False), ds.schema, r.device)
        except EvalDataError as e:
            raise EvalDataError(f"{data_path}: partitions {', '.join(chosen)}: {e}") from None
        path, step, kind, calibration = r.checkpoint, r.step, r.checkpoint_kind, r.calibration
    out: dict[str, Any] = {
        "model": cfg.model.name,
        "checkpoint": str(path),
        "checkpoint_kind": kind,
        "version": version,
        "step": step,
        "calibration": calibration,
        "spec": spec,
        "data": str(data_path.resolve()),
        "partitions": chosen,
        "rows": res["rows"],
        "loss": res["loss"],
        "metrics": res["metrics"],
        "ne_base_rate": NE_BASE_RATE,
    }
    if ds.truth_files(spec):
        acc = accumulate(data_path, spec)  # per surface x task, and pooled over surfaces as all/<task>
        ne = {**acc.results(), **acc.pooled_by_task().results()}
        out["oracle"] = {k: (v if v == v else None) for k, v in ne.items()}
    if write:
        own = data_dir is None or Path(data_dir).resolve() == Path(cfg.data.path).resolve()
        names = [eval_file_name(spec, version, None if own else Path(data_path).resolve().name)]
        if own and (partitions is None or _default_selection(ds, cfg.data.eval) == chosen):
            # the default selection: where the report and older readers look
            names.append("eval.json" if version is None else f"eval-v{version:04d}.json")
        for name in names:
            atomic_write_text(run_dir / name, json.dumps(out, indent=2))
        out["written"] = [str(run_dir / n) for n in names]
    return out


def _default_selection(ds: Dataset, spec: str) -> list[str] | None:
    """The partitions the run's own ``data.eval`` selects in ``ds``, or None where it selects nothing
    there (new rows encoded with ``convert table --encoders`` hold a test split and an empty valid one)."""
    try:
        return ds.select(spec)
    except DatasetError:
        return None


def format_metrics(results: dict[str, dict[str, Any]], oracle: dict[str, Any] | None = None) -> str:
    """One table, runs side by side: NE, AUC and calibration (mean prediction / observed rate, 1 = right
    on average: auctions price on the probability, so a good rank with a biased level still costs money)
    per surface/task and pooled (all/<task>); the oracle NE when known."""
    keys = sorted({k for r in results.values() for k in r["metrics"]},
                  key=lambda k: (k.startswith("all/"), k))
    width = {name: max(12, len(name) + 6) for name in results}  # long run names stay apart
    head = f"{'surface/task':<24}{'rows':>9}" + "".join(
        f"{name + ' NE':>{width[name]}}{name + ' AUC':>{width[name]}}{name + ' cal':>{width[name]}}"
        for name in results)
    if oracle:
        head += f"{'oracle NE':>11}"
    lines = [head, "-" * len(head)]

    def fmt(x: Any) -> str:
        return f"{x:.4f}" if isinstance(x, (int, float)) else "-"

    for k in keys:
        first = next(r["metrics"][k] for r in results.values() if k in r["metrics"])
        line = f"{k:<24}{first['rows']:>9d}"
        for name, r in results.items():
            m = r["metrics"].get(k, {})
            line += "".join(f"{fmt(m.get(c)):>{width[name]}}" for c in ("ne", "auc", "calibration"))
        if oracle:
            line += f"{fmt(oracle.get(k)):>11}"
        lines.append(line)
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_run_argument(p, many=True, help="training run folder(s) (config.toml and checkpoints/), or RUN@N: "
                                        "published version N of an online run; several "
                                        "compare runs side by side on the same partitions; under torchrun, "
                                        "whose own --run-path swallows --run, give them as RUN or --run-dir")
    p.add_argument("--data", default=None, help="dataset folder (default: the one the run trained on)")
    p.add_argument("--partitions", default=None, help="partition spec (default: the run's data.eval)")
    p.add_argument("--device", default=None, choices=["auto", "cpu", "cuda"])


def run(args: argparse.Namespace) -> int:
    warnings.filterwarnings("ignore", category=FutureWarning)  # TorchRec/DCP deprecation notices
    resolve_run(args, many=True)
    outs = {}
    for run_dir in args.run:
        out = evaluate_run(run_dir, args.data, args.partitions, args.device)
        name = out["model"] if len(args.run) == 1 else Path(run_dir).name
        if name in outs:  # two runs of one model: tell them apart by folder
            name = str(run_dir)
        outs[name] = out
    first = next(iter(outs.values()))
    print(format_metrics(outs, first.get("oracle")))
    for name, out in outs.items():
        cal_note = describe_calibration(out["calibration"])
        print(f"{name}: checkpoint {out['checkpoint']} (step {out['step']}, {out['checkpoint_kind']}"
              f"{cal_note}); wrote {', '.join(out['written'])}")
    print(f"(cal = mean prediction / observed rate; {first['ne_base_rate']})")
    return 0
