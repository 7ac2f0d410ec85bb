"""Process group and device mesh for one process or ``torchrun``; collectives the trainer needs.

Under torchrun (RANK/WORLD_SIZE/MASTER_ADDR in the environment) the default group is created from the
environment; alone, a private 1-process group on a FileStore, so the same code path (DMP, DCP) runs in
tests and the demo. Every group gets a finite timeout (``train.dist_timeout_s``): when one rank dies the
others fail in their next collective instead of waiting forever, and whichever group we created is
destroyed on the way out, error or not.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from opengem.config import ConfigError
from opengem.errors import DatasetError

log = logging.getLogger("opengem.train")


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def is_main() -> bool:
    return rank() == 0


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


@contextlib.contextmanager
def process_group(device: torch.device, timeout_s: float = 600.0) -> Iterator[dist.ProcessGroup]:
    """The existing default group, else one from torchrun's environment, else a private 1-process one.

    A group created here is destroyed on exit. On an exception the error is logged with the rank (only
    rank 0 logs otherwise, so without this a crash in rank 1 would be silent) and re-raised.
    """
    if dist.is_initialized():
        yield dist.group.WORLD
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = datetime.timedelta(seconds=timeout_s)
    tmp = None
    if under_torchrun():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend, timeout=timeout)
    else:
        tmp = tempfile.mkdtemp(prefix="opengem-pg-")
        dist.init_process_group(backend, store=dist.FileStore(f"{tmp}/store", 1), rank=0, world_size=1,
                                timeout=timeout)
    try:
        yield dist.group.WORLD
        if dist.get_world_size() > 1 and sys.exc_info()[0] is None:
            # Every rank leaves together, and gloo's worker threads get the GIL once more before the
            # interpreter can finalize. A rank of a finished 2-rank CPU job sometimes aborted at exit
            # (SIGABRT, "terminate called without an active exception"; 7 of 66 runs, session 36): a core
            # dump shows gloo's worker thread destroying a finished barrier work, which releases an earlier
            # all-gather's tensors, which decrefs their Python objects and so takes the GIL while the main
            # thread finalizes Python; the thread is then exited from inside a C++ destructor. The barrier
            # drains the queue; the short sleep lets the worker finish those releases while it can.
            # Only after success: an owner that closes this context from its own error handler (an
            # ExitStack closed in ``except``) must not wait here for peers that may be gone
            dist.barrier()
            time.sleep(0.1)
    except BaseException as e:
        if dist.get_world_size() > 1:
            log.error("rank %d failed: %s: %s", dist.get_rank(), type(e).__name__, e)
        raise
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def dense_mesh(device: torch.device, dp_replicate: int = 1, dp_shard: int = -1) -> DeviceMesh | None:
    """The data-parallel mesh of the dense part: 1-D ("dp_shard",) for FSDP, 2-D (dp_replicate,
    dp_shard) for HSDP; None alone (FSDP over one rank only costs time)."""
    world = world_size()
    if world == 1:
        return None
    if dp_shard == -1:
        if world % dp_replicate:
            raise ConfigError(f"train.dp_replicate = {dp_replicate} does not divide the world size {world}")
        dp_shard = world // dp_replicate
    if dp_replicate * dp_shard != world:
        raise ConfigError(f"train.dp_replicate * train.dp_shard = {dp_replicate} * {dp_shard} "
                          f"!= world size {world}")
    if dp_replicate == 1:
        return init_device_mesh(device.type, (dp_shard,), mesh_dim_names=("dp_shard",))
    return init_device_mesh(device.type, (dp_replicate, dp_shard),
                            mesh_dim_names=("dp_replicate", "dp_shard"))


def all_true(flag: bool, device: torch.device) -> bool:
    """True when ``flag`` holds on every rank (one tiny all_reduce; free alone)."""
    if world_size() == 1:
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def any_true(flag: bool, device: torch.device) -> bool:
    if world_size() == 1:
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum over ranks (a new tensor; no autograd)."""
    x = x.detach().clone()
    if world_size() > 1:
        dist.all_reduce(x)
    return x


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (JSON-like, small), in rank order, on every rank."""
    if world_size() == 1:
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()


def lockstep(batches: Iterable[Any], device: torch.device,
             max_batches: int = 0) -> Iterator[tuple[Any, bool]]:
    """(batch, real) while ANY rank still has a batch: sharded models need every rank in every forward.

    A rank whose shard ran out repeats its last batch with ``real = False`` (the caller discards the
    result). Training uses :func:`until_any_exhausted` instead, which stops at the first empty rank.
    """
    it = iter(batches)
    last = None
    n = 0
    while not max_batches or n < max_batches:
        batch = next(it, None)
        if not any_true(batch is not None, device):
            return
        if batch is None and last is None:
            # The loader splits rows, not only row groups, between ranks: a rank gets none only when the
            # files hold fewer rows than ranks x workers, or every row of its share was skipped as bad.
            raise DatasetError(f"rank {rank()} of {world_size()} has no rows to evaluate while other ranks "
                               "do: the evaluation partitions hold fewer usable rows than ranks x data "
                               "workers; use fewer processes or evaluate more rows")
        n += 1
        if batch is not None:
            last = batch
            yield batch, True
        else:
            yield last, False


def until_any_exhausted(batches: Iterable[Any], device: torch.device) -> Iterator[Any]:
    """Batches while EVERY rank still has one, so all ranks run the same number of steps."""
    it = iter(batches)
    while True:
        batch = next(it, None)
        if not all_true(batch is not None, device):
            return
        yield batch


INJECT_ENV = "OPENGEM_INJECT_FAILURE"


def maybe_inject_failure(step: int) -> None:
    """Raise in rank R at step S when $OPENGEM_INJECT_FAILURE = "R:S" (tests: a failing rank ends the job)."""
    spec = os.environ.get(INJECT_ENV)
    if not spec:
        return
    r, s = (int(x) for x in spec.split(":"))
    if r == rank() and s == step:
        raise RuntimeError(f"injected failure in rank {r} at step {s} (${INJECT_ENV})")
