"""Training checkpoints with torch.distributed.checkpoint (DCP): everything needed to resume exactly.

One checkpoint is a folder RUN/checkpoints/step-00000100/ (periodic) or RUN/checkpoints/final/ with
- DCP files (every rank writes its shards): ``model.*`` (sharded tables as ShardedTensors, FSDP shards as
  DTensors, plain tensors alone), ``dense_optim.*`` (AdamW state keyed by parameter name, via
  ``torch.distributed.checkpoint.state_dict``), ``sparse_optim.*`` (the fused row-wise Adagrad state);
- meta.json (rank 0): format tag, step, epoch, world size, the run id of the run that wrote it, the
  sha256 of DCP's ``.metadata``, the data loader position (every rank's position merged with
  ``loader.merge_states``, so it resumes under any world size), every rank's RNG state, the lr scheduler,
  the optimizers' non-tensor state (param groups), counters, and a fingerprint of the model's parameter
  names and shapes.

Only tensors go through DCP; everything else is JSON. DCP's own ``.metadata`` file is a pickle, and a
checkpoint may come from someone else, so it is never handed to ``pickle.load`` (DCP's reader included):
its bytes must match the sha256 recorded at save time, then an unpickler that resolves exactly the
(module, class) pairs a DCP metadata holds (no prefix match, no dotted names) builds it, and DCP is given
that object (:class:`SafeReader`). Either defence alone stops a crafted file; both are applied.

Run ids: when the trainer passes ``run_id``, finding checkpoints (:func:`latest_checkpoint`,
:func:`periodic_checkpoints`) and retention only ever consider that run's own checkpoints.

Atomic: written to ``<name>.tmp`` and renamed when every rank has finished and meta.json (written last)
is in place, so a crash at any moment leaves either the previous checkpoints or a ``.tmp`` that nothing
reads. The newest ``keep`` periodic checkpoints are kept.

DCP pitfall handled here: optimizer state must exist before loading into it (AdamW creates it lazily);
``get_optimizer_state_dict`` initialises it, and the fused optimizer's state exists from construction.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import io
import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from opengem.data.loader import merge_states
from opengem.errors import OpengemError

CHECKPOINTS = "checkpoints"
FINAL = "final"
META = "meta.json"
METADATA = ".metadata"  # DCP's own index of the tensors: a pickle
DIGEST = "metadata_sha256"  # meta.json key: sha256 of .metadata as written
FORMAT = "opengem-checkpoint"
VERSION = 1
TENSOR = "__tensor__"


class CheckpointError(OpengemError, RuntimeError):
    pass


class TruncatedCheckpoint(CheckpointError):
    """A checkpoint whose metadata names data that is not there (a disk filled, a copy cut short)."""


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _gather(obj: Any) -> list[Any]:
    if _world() == 1:
        return [obj]
    out: list[Any] = [None] * _world()
    dist.all_gather_object(out, obj)
    return out


def checkpoint_dir(run_dir: str | Path, step: int | None = None) -> Path:
    name = FINAL if step is None else f"step-{step:08d}"
    return Path(run_dir) / CHECKPOINTS / name


# --------------------------------------------------------------------------- tensors vs JSON
def split_tensors(obj: Any, prefix: str) -> tuple[dict[str, Any], Any]:
    """(flat {key: tensor}, a JSON skeleton with {"__tensor__": key} where the tensors were)."""
    flat: dict[str, Any] = {}

    def walk(x: Any, key: str) -> Any:
        if isinstance(x, torch.Tensor):
            flat[key] = x
            return {TENSOR: key}
        if isinstance(x, dict):
            return {"__dict__": [[k, walk(v, f"{key}.{k}")] for k, v in x.items()]}
        if isinstance(x, (list, tuple)):
            return [walk(v, f"{key}.{i}") for i, v in enumerate(x)]
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        raise CheckpointError(f"checkpoint: {key} holds a {type(x).__name__}, which is neither a tensor "
                              "nor JSON")

    return flat, walk(obj, prefix)


def join_tensors(skeleton: Any, flat: dict[str, Any]) -> Any:
    """Inverse of :func:`split_tensors` (dict keys that were ints come back as ints)."""
    if isinstance(skeleton, dict) and TENSOR in skeleton:
        return flat[skeleton[TENSOR]]
    if isinstance(skeleton, dict):
        return {k: join_tensors(v, flat) for k, v in skeleton["__dict__"]}
    if isinstance(skeleton, list):
        return [join_tensors(v, flat) for v in skeleton]
    return skeleton


# --------------------------------------------------------------------------- safe DCP metadata
# Exactly the globals a DCP ``.metadata`` of ours holds (found by saving model + AdamW + fused row-wise
# Adagrad checkpoints in 1 and 2 processes, every sharding plan, FSDP2 DTensors included), plus every torch
# dtype and BytesStorageMetadata (DCP's record for a non-tensor value). Exact (module, name) pairs: a prefix
# would admit every function of those modules, and a dotted name would let pickle walk attributes from an
# admitted module to anything it imports (``os.system`` through ``filesystem.os``).
_DCP_MD = "torch.distributed.checkpoint.metadata"
_SAFE_GLOBALS: frozenset[tuple[str, str]] = frozenset({
    (_DCP_MD, "Metadata"), (_DCP_MD, "StorageMeta"), (_DCP_MD, "MetadataIndex"),
    (_DCP_MD, "TensorStorageMetadata"), (_DCP_MD, "BytesStorageMetadata"), (_DCP_MD, "ChunkStorageMetadata"),
    (_DCP_MD, "TensorProperties"), (_DCP_MD, "_MEM_FORMAT_ENCODING"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"), ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"), ("pathlib._local", "PosixPath"),  # the same class (Python 3.13 moved it)
    *(("torch", name) for name, value in vars(torch).items() if isinstance(value, torch.dtype)),
})


class _MetadataUnpickler(pickle.Unpickler):
    """An unpickler that can only build the objects in ``_SAFE_GLOBALS``: nothing else is ever imported,
    looked up or called while reading a checkpoint's ``.metadata``."""

    def find_class(self, module: str, name: str) -> Any:
        if "." in name or (module, name) not in _SAFE_GLOBALS:
            raise CheckpointError(f"DCP metadata refers to {module}.{name}, which a checkpoint never needs "
                                  "(not loaded: the file is damaged or crafted; use a trusted copy)")
        return vars(importlib.import_module(module))[name]


def metadata_digest(data: bytes) -> str:
    """sha256 of a ``.metadata`` file's bytes, recorded in meta.json when the checkpoint is written."""
    return hashlib.sha256(data).hexdigest()


def read_dcp_metadata(path: str | Path, sha256: str) -> Metadata:
    """The DCP metadata of checkpoint ``path``, read once: the bytes must have the digest written at save
    time, then only our unpickler sees them, and the result must be a DCP ``Metadata``."""
    f = Path(path) / METADATA
    try:
        data = f.read_bytes()
    except OSError as e:
        raise CheckpointError(f"{f}: cannot read the DCP metadata ({e.strerror or e})") from None
    if metadata_digest(data) != sha256:
        raise CheckpointError(f"{f}: its sha256 is not the one recorded in {META} when the checkpoint was "
                              "written; the file was changed after saving, so it is not read (restore the "
                              "checkpoint from a trusted copy)")
    try:
        md = _MetadataUnpickler(io.BytesIO(data)).load()
    except CheckpointError as e:
        raise CheckpointError(f"{f}: {e}") from None
    except Exception as e:
        raise CheckpointError(f"{f}: unreadable DCP metadata ({type(e).__name__}: {e}); "
                              "the checkpoint is truncated or not a checkpoint") from None
    if not isinstance(md, Metadata):
        raise CheckpointError(f"{f}: holds a {type(md).__name__}, not DCP checkpoint metadata")
    return md


def recorded_digest(path: str | Path, meta: dict[str, Any] | None = None) -> str:
    """The ``.metadata`` digest that meta.json of checkpoint ``path`` records (refused when absent)."""
    meta = read_meta(path) if meta is None else meta
    digest = meta.get(DIGEST)
    if not isinstance(digest, str):
        raise CheckpointError(f"{Path(path) / META}: records no sha256 of {METADATA} (written by an older "
                              "opengem, or edited); an unverified .metadata is never unpickled")
    return digest


class SafeReader(dcp.FileSystemReader):
    """FileSystemReader whose metadata is read by :func:`read_dcp_metadata`, never by DCP's own plain
    ``pickle.load``, and read once (so what DCP loads is what was checked).

    ``read_metadata`` takes no keyword arguments on purpose: DCP then never falls back to rank-local
    ``__N.metadata`` files, which opengem does not write.
    """

    def __init__(self, path: str | os.PathLike, sha256: str | None = None) -> None:
        super().__init__(path)
        self.sha256 = sha256
        self._metadata: Metadata | None = None

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        super().reset(checkpoint_id)
        if checkpoint_id:
            self._metadata, self.sha256 = None, None

    def read_metadata(self, *args: Any) -> Metadata:  # the parent's signature, less **kwargs (see above)
        if self._metadata is None:
            digest = self.sha256 or recorded_digest(self.path)
            self._metadata = read_dcp_metadata(self.path, digest)
        md = self._metadata
        if getattr(md, "storage_meta", None) is None:  # as FileSystemReader.read_metadata does
            md.storage_meta = StorageMeta()
        md.storage_meta.load_id = self.load_id
        return md


def _check_files(path: Path, md: Metadata) -> None:
    """Every byte range the DCP metadata names must exist: a truncated checkpoint fails here, clearly."""
    need: dict[str, int] = {}
    for info in (md.storage_data or {}).values():
        rel = getattr(info, "relative_path", None)
        if rel is not None:
            if not isinstance(rel, str) or rel in ("", ".", "..") or Path(rel).name != rel:
                raise CheckpointError(f"{path / METADATA}: names data file {rel!r} outside the checkpoint "
                                      "folder; a checkpoint only reads its own files")
            need[rel] = max(need.get(rel, 0), int(info.offset) + int(info.length))
    for rel, size in need.items():
        f = path / rel
        if not f.exists():
            raise TruncatedCheckpoint(f"{path}: data file {rel} is missing (truncated checkpoint)")
        if f.stat().st_size < size:
            raise TruncatedCheckpoint(f"{path}: data file {rel} has {f.stat().st_size} bytes, the metadata "
                                  f"says at least {size} (truncated checkpoint)")


# --------------------------------------------------------------------------- what is saved
def model_fingerprint(model: nn.Module) -> str:
    """Hash of parameter/buffer names and global shapes: same model config and schema -> same value."""
    items = []
    for k, v in model.state_dict().items():
        shape = tuple(v.size()) if isinstance(v, torch.Tensor) else ()
        items.append(f"{k}:{shape}")
    return hashlib.sha256("\n".join(sorted(items)).encode()).hexdigest()[:16]


def _rng_state() -> dict[str, Any]:
    st = {"torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        st["cuda"] = base64.b64encode(torch.cuda.get_rng_state().numpy().tobytes()).decode()
    return st


def _set_rng_state(st: dict[str, Any]) -> None:
    import numpy as np

    torch.set_rng_state(torch.from_numpy(np.frombuffer(base64.b64decode(st["torch"]), dtype=np.uint8).copy()))
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state(
            torch.from_numpy(np.frombuffer(base64.b64decode(st["cuda"]), dtype=np.uint8).copy()))


def _dense_optim_state(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(_inner(model), opt)


def _inner(model: nn.Module) -> nn.Module:
    """The module inside a DMP wrapper: DCP's state_dict helpers resolve names against it."""
    return getattr(model, "module", model)


def _state(model: nn.Module, dense_opt: torch.optim.Optimizer | None,
           sparse_opt: Any | None) -> tuple[dict[str, Any], dict[str, Any]]:
    flat: dict[str, Any] = {}
    skel: dict[str, Any] = {}
    for k, v in model.state_dict().items():
        flat[f"model.{k}"] = v
    if dense_opt is not None:
        f, s = split_tensors(_dense_optim_state(model, dense_opt), "dense_optim")
        flat.update(f)
        skel["dense_optim"] = s
    if sparse_opt is not None:
        f, s = split_tensors(sparse_opt.state_dict(), "sparse_optim")
        flat.update(f)
        skel["sparse_optim"] = s
    return flat, skel


# --------------------------------------------------------------------------- save
def save(path: str | Path, step: int, model: nn.Module, *, dense_opt: torch.optim.Optimizer | None = None,
         sparse_opt: Any | None = None, scheduler: Any | None = None,
         loader_state: dict[str, Any] | None = None,
         extra: dict[str, Any] | None = None, keep: int = 0, run_id: str | None = None) -> Path:
    """Write a checkpoint atomically; every rank must call it (collective).

    ``loader_state``: this rank's loader state (merged over ranks here). ``extra``: JSON counters the
    trainer wants back (epoch, examples, ...). ``keep`` > 0 deletes all but the newest ``keep`` periodic
    checkpoints of the same ``run_id`` next to ``path`` after the new one is in place (another run's
    checkpoints in the same folder are never deleted). meta.json records ``run_id`` and the sha256 of DCP's
    ``.metadata``, which loading checks before unpickling anything.
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    if _rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.parent.mkdir(parents=True, exist_ok=True)
    _barrier()
    flat, skel = _state(model, dense_opt, sparse_opt)
    dcp.save(flat, checkpoint_id=str(tmp))
    loaders = _gather(loader_state)
    rngs = _gather(_rng_state())
    fingerprint = model_fingerprint(model)
    if _rank() == 0:  # DCP's coordinator (rank 0) has written .metadata when dcp.save returns
        meta = {"format": FORMAT, "version": VERSION, "step": step, "world_size": _world(),
                "run_id": run_id, DIGEST: metadata_digest((tmp / METADATA).read_bytes()),
                "fingerprint": fingerprint, "rng": rngs,
                "loader": merge_states(loaders) if loader_state is not None else None,
                "scheduler": scheduler.state_dict() if scheduler is not None else None,
                "optim_skeleton": skel, "extra": extra or {}}
        with open(tmp / META, "w") as f:
            json.dump(meta, f)
            f.flush()
            os.fsync(f.fileno())
        shutil.rmtree(path, ignore_errors=True)
        tmp.rename(path)
        if keep > 0 and path.name != FINAL:
            ours = [p for p in periodic_checkpoints(path.parent) if _run_id_of(p) == run_id]
            for old in ours[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
    _barrier()
    return path


def read_meta(path: str | Path) -> dict[str, Any]:
    """meta.json of a complete checkpoint, or a CheckpointError saying what is wrong with it."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint folder")
    if path.name.endswith(".tmp"):
        raise CheckpointError(f"{path}: an incomplete checkpoint (the run stopped while writing it)")
    meta_file = path / META
    if not (path / METADATA).exists() or not meta_file.exists():
        raise CheckpointError(f"{path}: not an opengem checkpoint (needs {METADATA} and {META})")
    try:
        meta = json.loads(meta_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{meta_file}: not valid JSON ({e}); the checkpoint is damaged") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{meta_file}: not an opengem checkpoint (format {meta.get('format')!r})"
                              if isinstance(meta, dict) else f"{meta_file}: not an opengem checkpoint")
    if meta.get("version") != VERSION:
        raise CheckpointError(f"{meta_file}: checkpoint version {meta.get('version')!r}, this opengem "
                              f"reads version {VERSION}")
    return meta


_UNREADABLE = object()  # the run id of a checkpoint whose meta.json cannot be read: matches no run


def _run_id_of(path: Path) -> Any:
    try:
        return read_meta(path).get("run_id")
    except CheckpointError:
        return _UNREADABLE


def periodic_checkpoints(root: str | Path, run_id: str | None = None) -> list[Path]:
    """Complete periodic checkpoints under ``root``, oldest first; only run ``run_id``'s when one is given."""
    root = Path(root)
    found = sorted(p for p in root.glob("step-*")
                   if not p.name.endswith(".tmp") and (p / META).exists() and (p / METADATA).exists())
    return found if run_id is None else [p for p in found if _run_id_of(p) == run_id]


def latest_checkpoint(run_dir: str | Path, run_id: str | None = None) -> Path:
    """The newest complete checkpoint of a run by step (the final one wins a tie); with ``run_id``, only
    that run's checkpoints count (an older run's checkpoints in the same folder are never picked)."""
    return checkpoints_newest_first(run_dir, run_id)[0]


def checkpoints_newest_first(run_dir: str | Path, run_id: str | None = None) -> list[Path]:
    """Every checkpoint of a run whose metadata reads, newest first (see :func:`latest_checkpoint`); a
    CheckpointError when there is none."""
    root = Path(run_dir) / CHECKPOINTS
    found: list[tuple[int, int, Path]] = []
    others: set[str] = set()
    for p in [*periodic_checkpoints(root), root / FINAL]:
        try:
            meta = read_meta(p)
            step = int(meta["step"])
        except (CheckpointError, KeyError, TypeError, ValueError):
            continue
        if run_id is not None and meta.get("run_id") != run_id:
            others.add(str(meta.get("run_id") or "(none: written before run ids)"))
            continue
        found.append((step, int(p.name == FINAL), p))
    if not found:
        if others:
            raise CheckpointError(f"{run_dir}: no checkpoint of run {run_id} under {root} (only of run(s) "
                                  f"{', '.join(sorted(others))})")
        raise CheckpointError(f"{run_dir}: no checkpoint under {root}")
    return [p for _, _, p in sorted(found, reverse=True)]


# --------------------------------------------------------------------------- load
def _dcp_load(flat: dict[str, Any], path: Path, reader: SafeReader) -> None:
    try:
        dcp.load(flat, storage_reader=reader)
    except CheckpointError:
        raise
    except Exception as e:  # DCP's errors name tensors, not the cause: say which checkpoint and why
        raise CheckpointError(f"{path}: cannot load into this model ({type(e).__name__}: {str(e)[:500]}); "
                              "was it saved by a run with the same model config and schema?") from e


def load(path: str | Path, model: nn.Module, *, dense_opt: torch.optim.Optimizer | None = None,
         sparse_opt: Any | None = None, scheduler: Any | None = None, restore_rng: bool = True
         ) -> dict[str, Any]:
    """Load a checkpoint into an identically configured model (any world size); returns its meta.json.

    The caller restores the loader from ``meta["loader"]`` and its counters from ``meta["extra"]``.
    """
    path = Path(path)
    meta = read_meta(path)
    reader = SafeReader(path, recorded_digest(path, meta))
    _check_files(path, reader.read_metadata())  # verified and unpickled by us, once, before DCP runs
    fp = model_fingerprint(model)
    if meta.get("fingerprint") != fp:
        raise CheckpointError(f"{path}: saved by a different model (parameter names/shapes differ: "
                              f"fingerprint {meta.get('fingerprint')} vs {fp}); use the run's config.toml")
    skel = meta.get("optim_skeleton") or {}
    flat, cur = _state(model, dense_opt if "dense_optim" in skel else None,
                       sparse_opt if "sparse_optim" in skel else None)
    _dcp_load(flat, path, reader)
    model.load_state_dict({k[len("model."):]: v for k, v in flat.items() if k.startswith("model.")})
    if dense_opt is not None and "dense_optim" in skel:
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        set_optimizer_state_dict(_inner(model), dense_opt, join_tensors(skel["dense_optim"], flat))
    if sparse_opt is not None and "sparse_optim" in skel:
        # this rank's own layout: with table-wise sharding every rank holds the state of other tables
        sparse_opt.load_state_dict(join_tensors(cur["sparse_optim"], flat))
    if scheduler is not None and meta.get("scheduler") is not None:
        scheduler.load_state_dict(meta["scheduler"])
    if restore_rng and meta.get("rng"):
        rngs = meta["rng"]
        _set_rng_state(rngs[_rank() % len(rngs)])
    return meta


def load_model(model: nn.Module, path: str | Path) -> int:
    """Load only the weights of a checkpoint; returns its step."""
    return int(load(path, model, restore_rng=False)["step"])


class Checkpointer:
    """When and where a run's checkpoints go: the component decides its own timing (``should_save``).

    Periodic checkpoints every ``every`` steps (0 = none) in ``RUN/checkpoints/step-N``, the newest
    ``keep`` kept (0 = all), the final one in ``RUN/checkpoints/final``; each carries the run id, and only
    the run's own are found again (another run's in the same folder are never read or deleted).
    """

    def __init__(self, run_dir: str | Path, every: int = 0, keep: int = 0, run_id: str | None = None) -> None:
        self.run_dir, self.every, self.keep, self.run_id = Path(run_dir), every, keep, run_id

    def should_save(self, step: int) -> bool:
        return bool(self.every) and step % self.every == 0

    def save(self, step: int, model: nn.Module, *, dense_opt: torch.optim.Optimizer | None = None,
             sparse_opt: Any | None = None, scheduler: Any | None = None,
             loader_state: dict[str, Any] | None = None, extra: dict[str, Any] | None = None,
             final: bool = False) -> Path:
        """Collective: every rank calls it."""
        path = checkpoint_dir(self.run_dir, None if final else step)
        return save(path, step, model, dense_opt=dense_opt, sparse_opt=sparse_opt, scheduler=scheduler,
                    loader_state=loader_state, extra=extra, keep=0 if final else self.keep,
                    run_id=self.run_id)

    def latest(self, run_id: str | None) -> Path | None:
        """The newest complete checkpoint of ``run_id`` (None: of any run, for a folder adopted from before
        run ids), None when there is none."""
        found = self.newest_first(run_id)
        return found[0] if found else None

    def newest_first(self, run_id: str | None) -> list[Path]:
        """Every checkpoint of ``run_id`` whose metadata reads, newest first ([] when there is none)."""
        try:
            return checkpoints_newest_first(self.run_dir, run_id=run_id)
        except CheckpointError:
            return []

