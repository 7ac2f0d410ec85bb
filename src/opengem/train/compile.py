"""torch.compile of the dense part of a model, with a persistent, run-independent compile cache.

What is compiled: every direct child of the model that holds no TorchRec embedding module (GEM: the
sequence encoder, the InterFormer / Wukong stack and the head; DLRM/DCNv2: their MLPs and interactions).
The embedding module stays eager: TorchRec's sharded lookups and KeyedJaggedTensors do not trace, and a
lookup is no FLOPs to fuse. ``Module.compile()`` compiles in place, so parameter names and checkpoints are
the same as in eager.

Why a cache folder: a cold CPU compile of GEM costs tens of seconds of g++ and autotuning, repeated by
every run. Inductor's FX-graph cache and AOTAutograd's cache live under ``TORCHINDUCTOR_CACHE_DIR``; pointing
it at a folder that outlives the run (default ``~/.cache/opengem/inductor``) makes the next process with the
same model and shapes load compiled kernels instead of compiling. (The portable
``torch.compiler.save_cache_artifacts`` blob does not carry CPU kernels, DESIGN §9, so the folder is the
mechanism used here.)

Recompiles: jagged sequences give every batch a different padded length; the trainer therefore pads to the
schema's ``max_len`` when compiling (``model.embedding.pad_to_max_len``) and drops the last partial training
batch, so training sees one shape; evaluation batch sizes are left to dynamo's automatic dynamic shapes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torch import nn

from opengem.train.config import COMPILE_BACKENDS, RunConfig
from opengem.train.env import cache_dir
from opengem.train.optim import embedding_modules

CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def default_cache_dir() -> Path:
    return cache_dir() / "inductor"


def configure_compile_cache(cache_dir: str | Path | None = None) -> Path:
    """Point Inductor's on-disk caches at ``cache_dir`` (or the default) and make sure they are on.

    Must run before the first compile of the process: parts of Inductor remember the folder once used.
    """
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    path = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    path.mkdir(parents=True, exist_ok=True)
    os.environ[CACHE_ENV] = str(path.resolve())
    inductor_config.fx_graph_cache = True
    functorch_config.enable_autograd_cache = True
    return path.resolve()


def _has_embedding(module: nn.Module) -> bool:
    return bool(embedding_modules(module))


def compile_targets(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of the children that will be compiled: the dense blocks, not the embeddings."""
    targets = []
    for name, child in model.named_children():
        if _has_embedding(child) or not any(True for _ in child.parameters()):
            continue
        targets.append((name, child))
    return targets


def apply_compile(model: nn.Module, backend: str = "inductor", dynamic: bool | None = None,
                  fullgraph: bool = False) -> list[str]:
    """Compile the dense children of ``model`` in place; returns their names.

    Pass the plain model (``ParallelModel.plain``), not a DMP wrapper: its dense children are the same.
    """
    if backend not in COMPILE_BACKENDS:
        raise ValueError(f"train.compile_backend: {backend!r} is not one of {', '.join(COMPILE_BACKENDS)}")
    names = []
    for name, child in compile_targets(model):
        child.compile(backend=backend, dynamic=dynamic, fullgraph=fullgraph)
        names.append(name)
    if not names:
        raise ValueError(f"train.compile: {type(model).__name__} has no dense child module to compile")
    return names


def compile_counters() -> dict[str, Any]:
    """Cache hits/misses and graph counts so far in this process (for logs, tests and benchmarks)."""
    from torch._dynamo.utils import counters

    ind, aot, stats = counters["inductor"], counters["aot_autograd"], counters["stats"]
    return {
        "fxgraph_cache_hit": int(ind.get("fxgraph_cache_hit", 0)),
        "fxgraph_cache_miss": int(ind.get("fxgraph_cache_miss", 0)),
        "autograd_cache_hit": int(aot.get("autograd_cache_hit", 0)),
        "autograd_cache_miss": int(aot.get("autograd_cache_miss", 0)),
        "unique_graphs": int(stats.get("unique_graphs", 0)),
        "calls_captured": int(stats.get("calls_captured", 0)),
    }


def prepare_compile(cfg: RunConfig) -> dict[str, Any]:
    """With ``train.compile``: the persistent cache folder, and static sequence shapes (no recompiles)."""
    if not cfg.train.compile:
        return {}
    cache = configure_compile_cache(cfg.train.compile_cache_dir or None)
    cfg.model.embedding.pad_to_max_len = True  # saved in config.toml, so evaluation rebuilds the same
    return {"cache_dir": str(cache), "backend": cfg.train.compile_backend}
