"""Export a trained model: weights + contract into an artifact, and optionally a torch.export program and
an AOTInductor package of the whole forward pass, embedding lookups included.

The exported forward is :class:`ServingModule`: flat tensors in (dense, surface, each sparse feature's
values and lengths, each sequence group's lengths and per-field values), logits ``[B, T]`` out. Inside,
it rebuilds a :class:`~opengem.data.batch.Batch` and runs the trained model's own ``forward`` on it, with
the TorchRec tables swapped for plain lookups over the same weights (:mod:`opengem.serve.lookup`), so
the program is the model's code, not a re-implementation. The batch dimension and every jagged length
are dynamic; sequences are padded to the schema's ``max_len``.

A run is read the way ``opengem evaluate`` reads it (its config.toml, its newest or early-stopping-best
checkpoint, through a 1-process DMP), then its tables are gathered into a plain, unsharded model.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import tempfile
import time
import tomllib
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch._inductor import aoti_compile_and_package

from opengem.config import from_dict, to_dict
from opengem.data.adapters.common import AdapterError
from opengem.data.adapters.encoders_io import read_encoders
from opengem.data.batch import Batch, SequenceBatch
from opengem.data.dataset import Dataset
from opengem.data.random_batch import random_batch
from opengem.data.schema import FeatureSchema, dumps_toml
from opengem.errors import OpengemError
from opengem.model.registry import ModelConfig, build_model
from opengem.ops.kernel import export_for_inductor
from opengem.serve.artifact import Artifact, check_out, write_artifact
from opengem.serve.errors import ArtifactError
from opengem.serve.lookup import FlatFeatures, FlatJagged, with_plain_lookups
from opengem.train import checkpoint as ckpt
from opengem.train.calibration import apply_run_calibration
from opengem.train.config import load_run_config
from opengem.train.distributed import process_group
from opengem.train.evaluate import own_checkpoint
from opengem.train.parallelize import build_run_model
from opengem.train.published import VersionError, parse_fm_spec, read_version, version_files
from opengem.transfer.versions import max_ts

BACKENDS = ("eager", "export", "aoti")
MAX_BATCH = 1 << 20
MAX_VALUES = 1 << 30
WRAPPER_PREFIXES = ("_orig_mod.", "_checkpoint_wrapped_module.", "_fsdp_wrapped_module.")

FlatInputs = tuple[torch.Tensor, torch.Tensor, dict[str, tuple[torch.Tensor, torch.Tensor]],
                   dict[str, tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor]]]]


class ServingBatch(Batch):
    """A Batch whose size stays symbolic under torch.export (``Batch.batch_size`` takes ``int()`` of it,
    which would fix the exported batch size to the example's)."""

    @property
    def batch_size(self) -> int:
        return self.surface.shape[0]  # type: ignore[return-value]


class ServingModule(nn.Module):
    """The exported forward: flat tensors -> the model's logits [B, T] (probabilities are sigmoid(logits))."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, dense: torch.Tensor, surface: torch.Tensor,
                sparse: dict[str, tuple[torch.Tensor, torch.Tensor]],
                sequences: dict[str, tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor]]],
                ) -> torch.Tensor:
        B = surface.shape[0]
        batch = ServingBatch(
            dense=dense,
            sparse=FlatFeatures({k: FlatJagged(v, n) for k, (v, n) in sparse.items()}),  # type: ignore[arg-type]
            sequences={g: SequenceBatch(lengths=n, ids=ids, dense=dn)
                       for g, (n, ids, dn) in sequences.items()},
            labels=dense.new_zeros(B, 0), label_mask=dense.new_zeros(B, 0, dtype=torch.bool),
            surface=surface, example_id=surface, ts=surface,
        )
        return self.model(batch).logits


def flat_inputs(batch: Batch, schema: FeatureSchema) -> FlatInputs:
    """The ServingModule's inputs for ``batch``, in schema order (the order the program was exported in)."""
    sparse = _per_key(batch.sparse, schema.sparse_names, batch.surface.shape[0]) if schema.sparse else {}
    return (
        batch.dense,
        batch.surface,
        {f.name: sparse[f.name] for f in schema.sparse},
        {g.name: (batch.sequences[g.name].lengths,
                  {f.name: batch.sequences[g.name].ids[f.name] for f in g.id_fields},
                  {f.name: batch.sequences[g.name].dense[f.name] for f in g.dense_fields})
         for g in schema.sequences},
    )


def flat_tensors(batch: Batch, schema: FeatureSchema) -> list[torch.Tensor]:
    """:func:`flat_inputs` as the one flat list of tensors the compiled program takes, in the order
    ``torch.utils._pytree`` flattens them (dict values in insertion order, which is schema order).

    Why: ``AOTICompiledModel.__call__`` flattens its arguments with pytree on every call, ~0.1 ms of
    Python per forward pass of a served request; the Predictor hands this list to the package's loader
    directly (a test pins it equal to pytree's leaves)."""
    return _flatten(flat_inputs(batch, schema))


def _flatten(inputs: FlatInputs) -> list[torch.Tensor]:
    """The one definition of the flat order (:func:`flat_tensors`, :func:`flat_tensor_chunks`)."""
    dense, surface, sparse, sequences = inputs
    out = [dense, surface]
    for values, lengths in sparse.values():
        out.append(values)
        out.append(lengths)
    for lengths, ids, dn in sequences.values():
        out.append(lengths)
        out.extend(ids.values())
        out.extend(dn.values())
    return out


def flat_tensor_chunks(batch: Batch, schema: FeatureSchema, rows: int) -> list[list[torch.Tensor]]:
    """:func:`flat_tensors` of consecutive slices of at most ``rows`` rows of ``batch`` (one list when it
    has no more rows than that; ``rows <= 0``: never split).

    Why: the AOTInductor forward of a small vertical model can cost more per row on one large merged batch
    than on a few smaller ones (0.73-0.80 vs 0.64-0.72 ms per 512 candidates at 8,192 vs 2,048 rows,
    measured on the vertical model of configs/transfer.toml, whose intermediates then stop fitting in the
    core's cache), so the Predictor can run a large merged batch in slices (``aoti_chunk_rows``). Jagged
    values are sliced by their rows' offsets, so each slice is exactly the batch those rows make alone."""
    inputs = flat_inputs(batch, schema)
    dense, surface, sparse, sequences = inputs
    B = int(surface.shape[0])
    if rows <= 0 or B <= rows:
        return [_flatten(inputs)]
    bounds = list(range(0, B, rows)) + [B]

    def cuts(lengths: torch.Tensor) -> list[int]:
        offsets = torch.zeros(B + 1, dtype=torch.int64)
        offsets[1:] = lengths.cumsum(0)
        return offsets[bounds].tolist()

    sparse_cuts = {k: cuts(n) for k, (_, n) in sparse.items()}
    seq_cuts = {g: cuts(n) for g, (n, _, _) in sequences.items()}
    chunks = []
    for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        sp = {k: (v[sparse_cuts[k][i]:sparse_cuts[k][i + 1]], n[a:b]) for k, (v, n) in sparse.items()}
        sq = {}
        for g, (n, ids, dn) in sequences.items():
            lo, hi = seq_cuts[g][i], seq_cuts[g][i + 1]
            sq[g] = (n[a:b], {f: v[lo:hi] for f, v in ids.items()}, {f: v[lo:hi] for f, v in dn.items()})
        chunks.append(_flatten((dense[a:b], surface[a:b], sp, sq)))
    return chunks


def _per_key(kjt: Any, keys: list[str], rows: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Each key's (values, lengths) of a KeyedJaggedTensor whose keys each hold one length per row (every
    Batch the loader and the Predictor build): a view of the lengths per key and one split of the values.

    Why not ``kjt.to_dict()``: its bookkeeping (length per key, offsets, checks) cost 0.21 ms a call on
    a fresh KJT against 0.035 ms for this, once per forward pass of every served request. A KJT in another
    key order or without ``rows`` lengths per key takes ``to_dict``."""
    lengths = kjt.lengths()
    if list(kjt.keys()) != list(keys) or lengths.numel() != len(keys) * rows:
        d = kjt.to_dict()
        return {k: (d[k].values(), d[k].lengths()) for k in keys}
    per_key = lengths.view(len(keys), -1)
    values = kjt.values().split(per_key.sum(1).tolist())
    return {k: (values[i], per_key[i]) for i, k in enumerate(keys)}


def _dynamic_shapes(schema: FeatureSchema) -> tuple[Any, ...]:
    """Batch dimension shared by every per-row tensor; one length dimension per jagged feature/group."""
    B = torch.export.Dim("batch", min=1, max=MAX_BATCH)

    def n(name: str) -> Any:
        return torch.export.Dim(name, min=0, max=MAX_VALUES)

    seq = {}
    for g in schema.sequences:
        ev = n(f"events_{g.name}")
        seq[g.name] = ({0: B}, {f.name: {0: ev} for f in g.id_fields},
                       {f.name: {0: ev} for f in g.dense_fields})
    return ({0: B}, {0: B}, {f.name: ({0: n(f"values_{f.name}")}, {0: B}) for f in schema.sparse}, seq)


def serving_module(model: nn.Module) -> ServingModule:
    """The model with plain lookups behind the flat-tensor forward, in eval mode (for export)."""
    return ServingModule(with_plain_lookups(model)).eval()


def export_program(model: nn.Module, schema: FeatureSchema, *,
                   for_inductor: bool = False) -> torch.export.ExportedProgram:
    """``torch.export`` (non-strict) of the whole forward with a dynamic batch and dynamic lengths;
    ``for_inductor``: the program is for :func:`compile_aoti`, so ops take their forms that pay once
    compiled (:func:`opengem.ops.kernel.export_for_inductor`; the same values)."""
    inputs = flat_inputs(random_batch(schema, 8, seed=0), schema)
    module = serving_module(model)
    with torch.no_grad(), export_for_inductor() if for_inductor else contextlib.nullcontext():
        if for_inductor:
            module(*inputs)  # the warm-up: modules make their constants as buffers
        return torch.export.export(module, inputs,
                                   dynamic_shapes=_dynamic_shapes(schema), strict=False)


# Inductor settings of the AOTI package. ``freezing``: the weights become constants of the compiled code,
# so Inductor folds what depends only on them and lays out the linear layers' weights for the CPU's GEMM
# once, at compile time, instead of on every call (vertical model of configs/transfer.toml, per 512
# candidates: 1.10 -> 0.82 ms at 512 rows, 0.70 -> 0.59 at 2,048; same compile time, same outputs to 1e-6).
# A served package is never trained further, so nothing is lost by folding its weights in.
AOTI_INDUCTOR_CONFIGS: dict[str, Any] = {"freezing": True}


def compile_aoti(program: torch.export.ExportedProgram, path: Path) -> Path:
    """An AOTInductor package of ``program`` for this machine's CPU, written to ``path``."""
    return Path(aoti_compile_and_package(program, package_path=str(path),
                                         inductor_configs=dict(AOTI_INDUCTOR_CONFIGS)))


# --------------------------------------------------------------------------- a model <-> an artifact
def model_config_toml(cfg: ModelConfig) -> str:
    return dumps_toml(to_dict(cfg))


def model_from_artifact(art: Artifact) -> tuple[nn.Module, FeatureSchema, ModelConfig]:
    """Rebuild the model an artifact's weights belong to (eval mode); a mismatch is an ArtifactError."""
    schema = FeatureSchema.from_dict(tomllib.loads(art.schema), source="artifact schema.toml")
    cfg = from_dict(ModelConfig, tomllib.loads(art.model_config), where="artifact model.toml")
    model = build_model(schema, cfg)
    missing, unexpected = model.load_state_dict(art.weights, strict=False)
    if missing or unexpected:
        raise ArtifactError(f"{art.path or 'artifact'}: weights do not fit the model of model.toml "
                            f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    return model.eval(), schema, cfg


def serving_model(model: nn.Module) -> nn.Module:
    """The part of a model that is served: a VerticalModel's base model (its aux head is training-time
    only); any registry model as it is."""
    base = getattr(model, "base", None)
    if base is not None and hasattr(model, "aux_head"):
        if getattr(model, "shared_history", None) is not None:
            raise ArtifactError("a vertical model with a shared FM history encoder cannot be rebuilt from a "
                                "model config; export is not supported for it yet")
        return base
    return model


def make_artifact(model: nn.Module, schema: FeatureSchema, cfg: ModelConfig, version: str,
                  trained_through_ts: int | None, source: dict[str, Any] | None = None,
                  encoding: dict[str, Any] | None = None) -> Artifact:
    """An in-memory artifact of ``model`` (weights copied to CPU, plain tensors)."""
    model = serving_model(model)
    weights = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    manifest = {"version": version, "trained_through_ts": trained_through_ts, "source": source or {},
                "model": cfg.name, "schema": schema.name}
    return Artifact(manifest, model_config_toml(cfg), schema.to_toml(), encoding or {"kind": "ids"}, weights)


def export_model(model: nn.Module, schema: FeatureSchema, cfg: ModelConfig, out: str | Path, *,
                 backend: str = "export", version: str = "v0000", trained_through_ts: int | None = None,
                 source: dict[str, Any] | None = None, encoding: dict[str, Any] | None = None,
                 force: bool = False) -> dict[str, Any]:
    """Write an artifact of ``model`` to ``out`` with ``backend`` (eager: weights only; export: + program;
    aoti: + program + AOTInductor package); returns what was done and how long each part took."""
    if backend not in BACKENDS:
        raise ArtifactError(f"--backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    check_out(out, force)
    art = make_artifact(model, schema, cfg, version, trained_through_ts, source, encoding)
    rebuilt, _, _ = model_from_artifact(art)  # what a Predictor will build: export exactly that
    timings: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="opengem-export-") as tmp:
        programs: dict[str, Path] = {}
        if backend in ("export", "aoti"):
            t = time.perf_counter()
            program = export_program(rebuilt, schema)
            programs["export"] = Path(tmp) / "program.pt2"
            torch.export.save(program, programs["export"])
            timings["export_s"] = time.perf_counter() - t
            if backend == "aoti":  # (traced again for Inductor: see export_program)
                t = time.perf_counter()
                programs["aoti"] = compile_aoti(export_program(rebuilt, schema, for_inductor=True),
                                                Path(tmp) / "aoti.pt2")
                timings["aoti_compile_s"] = time.perf_counter() - t
        art.manifest["export_timings_s"] = {k: round(v, 3) for k, v in timings.items()}
        path = write_artifact(out, art, programs, force=force)
    return {"out": str(path), "version": version, "trained_through_ts": trained_through_ts,
            "backends": ["eager", *programs], **timings}


# --------------------------------------------------------------------------- a run -> a model
@dataclasses.dataclass
class LoadedRun:
    model: nn.Module  # plain, unsharded, eval mode
    schema: FeatureSchema
    cfg: ModelConfig
    version: str
    trained_through_ts: int | None
    source: dict[str, Any]
    data_path: Path


def parse_run_spec(spec: str | Path) -> tuple[Path, int | None]:
    """``RUN`` or ``RUN@3`` / ``RUN@v0003`` (a published version of an online or versioned run)."""
    return parse_fm_spec(str(spec))


def plain_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """A 1-process DMP model's state as full tensors (ShardedTensor tables gathered from their local
    shards, DTensors made full), under the plain model's names."""
    out: dict[str, torch.Tensor] = {}
    for k, v in model.state_dict().items():
        name = k[len("module."):] if k.startswith("module.") else k
        for wrapper in WRAPPER_PREFIXES:  # compile / activation-checkpoint wrappers, if any were applied
            name = name.replace(wrapper, "")
        if hasattr(v, "local_shards"):
            full = torch.empty(tuple(v.size()), dtype=v.dtype)
            for shard in v.local_shards():
                o, s = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                full[tuple(slice(a, a + b) for a, b in zip(o, s))] = shard.tensor.detach().cpu()
            out[name] = full
        elif hasattr(v, "full_tensor"):
            out[name] = v.full_tensor().detach().cpu()
        else:
            out[name] = v.detach().cpu()
    return out


def load_run(spec: str | Path) -> LoadedRun:
    """The trained model of ``RUN`` (newest/best checkpoint) or ``RUN@version``, unsharded, on CPU."""
    run, version = parse_run_spec(spec)
    ckpt_path: Path
    if version is None:  # a missing folder, not a run, an online run: each said as such
        cfg_path = run / "config.toml"
        ckpt_path, _best = own_checkpoint(run)
        trained_through: int | None = None
    else:
        try:  # this version's manifest only: another version's damaged one must not block it
            v = read_version(run, version)
            cfg_path, ckpt_path = version_files(v)
        except VersionError as e:
            raise ArtifactError(f"{spec}: {e}") from None
        trained_through = v.trained_through_ts
    cfg = load_run_config(cfg_path)
    data_path = Path(cfg.data.path)
    schema = Dataset(data_path).schema
    meta = ckpt.read_meta(ckpt_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchRec/DCP deprecation notices
        with process_group(torch.device("cpu")) as pg, torch.enable_grad():
            run_cfg = copy.deepcopy(cfg)  # one process, no wrappers: only the parameters matter here
            run_cfg.train.compile = False
            run_cfg.train.activation_checkpointing = "none"
            run_cfg.train.dp_replicate, run_cfg.train.dp_shard = 1, -1
            sharded = build_run_model(schema, run_cfg, torch.device("cpu"), pg).model
            step = ckpt.load_model(sharded, ckpt_path)
            state = plain_state(sharded)
    model = build_model(schema, cfg.model)
    model.load_state_dict(state)
    calibration = None
    if version is None:
        trained_through = _trained_through(data_path, cfg.data.train, schema)
        # the run's calibration (opengem calibrate) travels folded into the exported weights
        calibration = apply_run_calibration(model, run, ckpt_path, list(schema.surfaces), schema.task_names,
                                            who="opengem export")
    name = f"v{version:04d}" if version is not None else f"{meta.get('run_id') or run.name}@step{step}"
    source = {"run": str(run.resolve()), "checkpoint": str(ckpt_path), "step": step,
              "run_id": meta.get("run_id"), "data": str(data_path), "calibration": calibration}
    return LoadedRun(model.eval(), schema, cfg.model, name, trained_through, source, data_path)


def _trained_through(data_path: Path, train_spec: str, schema: FeatureSchema) -> int | None:
    """Newest example time of the run's training selection (None when the data is gone or unreadable)."""
    try:
        return max_ts(Dataset(data_path).files(train_spec), schema.time_column)
    except (OpengemError, OSError):
        return None


def dataset_encoding(data_path: Path) -> dict[str, Any]:
    """How raw values become the dataset's canonical ones, from what the data folder records.

    A dataset converted by ``opengem convert table`` holds the importer's fitted encoders
    (``encoders.json`` + ``_encoders/``, digests checked on read): they go into the artifact and the
    Predictor serves raw source values through them. A dataset converted before the importer wrote them
    is served with canonical ids, its summary.json's dense statistics and spec recorded for reference.
    """
    try:
        table = read_encoders(data_path)
    except AdapterError as e:
        raise ArtifactError(f"{e} (the run's dataset)") from None
    if table is not None:
        return table
    summary = data_path / "summary.json"
    if not summary.is_file():
        return {"kind": "ids"}
    try:
        s = json.loads(summary.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {"kind": "ids"}
    return {"kind": "ids", "converted": {k: s[k] for k in ("dataset", "dense_stats", "import_spec", "hashed",
                                                             "oov_rule") if k in s}}


def export_run(spec: str | Path, out: str | Path, backend: str = "export", force: bool = False
               ) -> dict[str, Any]:
    """``opengem export``: the run's (or version's) model -> an artifact at ``out``."""
    if backend not in BACKENDS:
        raise ArtifactError(f"--backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    check_out(out, force)
    t = time.perf_counter()
    r = load_run(spec)
    load_s = time.perf_counter() - t
    res = export_model(r.model, r.schema, r.cfg, out, backend=backend, version=r.version,
                       trained_through_ts=r.trained_through_ts, source=r.source,
                       encoding=dataset_encoding(r.data_path), force=force)
    return {**res, "load_s": load_s, "source": r.source}
