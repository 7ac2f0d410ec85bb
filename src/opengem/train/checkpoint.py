"""Model checkpoints with torch.distributed.checkpoint (DCP).

DCP writes every rank's shards of the DMP state dict (sharded tables as ShardedTensors, dense weights
as tensors) and can reload them into another sharding plan, which is why it is used even for one
process. A checkpoint is written to ``<name>.tmp`` and renamed when complete, so a crash never leaves a
half-written checkpoint under a real name.

Layout: RUN/checkpoints/step-00000100/ (periodic) and RUN/checkpoints/final/. This module holds the model
weights only; full resume (optimizer, loader position, RNG) extends it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

CHECKPOINTS = "checkpoints"
FINAL = "final"


class CheckpointError(RuntimeError):
    pass


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def checkpoint_dir(run_dir: str | Path, step: int | None = None) -> Path:
    name = FINAL if step is None else f"step-{step:08d}"
    return Path(run_dir) / CHECKPOINTS / name


def save_model(model: nn.Module, path: str | Path, step: int) -> Path:
    """Save the (possibly sharded) model state to ``path`` atomically; every rank must call it."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    if _rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.parent.mkdir(parents=True, exist_ok=True)
    _barrier()
    dcp.save(model.state_dict(), checkpoint_id=str(tmp))
    _barrier()
    if _rank() == 0:
        (tmp / "step.json").write_text(json.dumps({"step": step}))
        shutil.rmtree(path, ignore_errors=True)
        tmp.rename(path)
    _barrier()
    return path


def load_model(model: nn.Module, path: str | Path) -> int:
    """Load weights saved by ``save_model`` into an identically built model; returns the saved step."""
    path = Path(path)
    if not (path / ".metadata").exists():
        raise CheckpointError(f"{path}: not a checkpoint (no .metadata)")
    state = model.state_dict()
    try:
        dcp.load(state, checkpoint_id=str(path))
    except Exception as e:  # DCP's errors name tensors, not the cause: say which checkpoint and why
        raise CheckpointError(f"{path}: cannot load into this model ({type(e).__name__}: {e}); "
                              "was it saved by a run with the same model config and schema?") from e
    model.load_state_dict(state)
    step_file = path / "step.json"
    return int(json.loads(step_file.read_text())["step"]) if step_file.exists() else -1


def latest_checkpoint(run_dir: str | Path) -> Path:
    """The final checkpoint of a run, else its newest periodic one."""
    root = Path(run_dir) / CHECKPOINTS
    final = root / FINAL
    if (final / ".metadata").exists():
        return final
    steps = sorted(p for p in root.glob("step-*")
                   if not p.name.endswith(".tmp") and (p / ".metadata").exists())
    if not steps:
        raise CheckpointError(f"{run_dir}: no checkpoint under {root}")
    return steps[-1]
