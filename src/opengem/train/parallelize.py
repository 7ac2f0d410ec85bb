"""parallelize(model, ...): sharding, memory savers and compile applied to a plain model from outside.

The model files know nothing of distribution (torchtitan's rule). In order:

1. Memory savers hook (``opengem.train.memory``): activation checkpointing per layer; then the CPU dense
   layers' kernel (``opengem.train.cpu_linear``: oneDNN where it beats PyTorch's BLAS).
2. Compile hook (``opengem.train.compile``): torch.compile of the dense children.
3. Embedding tables: TorchRec's planner picks a table-wise / row-wise / column-wise plan (``train.sharding``)
   and ``DistributedModelParallel(init_data_parallel=False)`` shards them; the fused sparse optimizer
   attached beforehand (``optim.apply_sparse_optimizer``) runs inside backward on each shard.
   ``train.sparse_replicas > 1`` asks for TorchRec's 2-D layout (``DMPCollection``: every table sharded
   over a group of ``world / sparse_replicas`` ranks, replicated across groups); torchrec 1.8 asserts a
   CUDA device there, so it is GPU-only and fails here with a clear message on CPU.
4. Dense part: FSDP2 ``fully_shard`` per block (each child of a ``ModuleList``) and on the root, over a
   1-D mesh (FSDP) or a 2-D ``(dp_replicate, dp_shard)`` mesh (HSDP); the embedding tables are ignored
   by FSDP (TorchRec owns them). Optional bf16 ``MixedPrecisionPolicy``. Alone (world 1) there is no FSDP.

Gradient scale: TorchRec *sums* embedding gradients over ranks (each rank's lookups come back to the
table's owner). So that dense and sparse gradients are both the gradient of the global-batch mean, the
trainer divides each rank's loss sum by the *global* label count, and multiplies the dense gradients,
which FSDP averages over the mesh, by the mesh size (``DENSE_GRAD_SCALE``; FSDP's own
``set_gradient_divide_factor(1.0)`` needs PREMUL_SUM, which gloo lacks). Then N ranks with batch B follow
one rank with batch N*B (exactly for N a power of two: the scale is exact in floating point).
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints
from torchrec.distributed.planner.types import KernelConfig, TopologyFactory, TrainerConfig
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.distributed.types import ShardedModule, ShardingEnv
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from opengem.data.schema import FeatureSchema
from opengem.errors import UsageError
from opengem.model.embedding import FeatureEmbedding
from opengem.model.registry import build_model
from opengem.train import distributed
from opengem.train.compile import apply_compile
from opengem.train.config import SHARDINGS, RunConfig, TrainConfig
from opengem.train.cpu_linear import apply_cpu_linear
from opengem.train.memory import apply_activation_checkpointing
from opengem.train.optim import apply_sparse_optimizer, embedding_modules
from opengem.train.startup import StartupTimer

# "auto" leaves column-wise out: row-wise optimizer state of column-wise tables cannot be resharded when
# the number of column shards changes (DESIGN §9), which would break loading into another world size.
# data_parallel is never allowed: it fails for EmbeddingCollection on CPU and, with init_data_parallel
# False, nothing would synchronise such a table across ranks.
SHARDING_TYPES = {"auto": ["table_wise", "row_wise"], "table_wise": ["table_wise"],
                  "row_wise": ["row_wise"], "column_wise": ["column_wise"]}


class ParallelizeError(UsageError, RuntimeError):
    pass


# --------------------------------------------------------------------------- hooks (memory, compile)
def apply_memory_savers(model: nn.Module, cfg: TrainConfig) -> list[str]:
    """Hook point for ``opengem.train.memory``: activation checkpointing per layer (if configured)."""
    mode = getattr(cfg, "activation_checkpointing", "none")
    if not mode or mode == "none":
        return []
    return apply_activation_checkpointing(model, mode)


def apply_compile_hook(model: nn.Module, cfg: TrainConfig) -> list[str]:
    """Hook point for ``opengem.train.compile``: compile the dense children (if ``train.compile``)."""
    if not getattr(cfg, "compile", False):
        return []
    return apply_compile(model, backend=getattr(cfg, "compile_backend", "inductor"))


# --------------------------------------------------------------------------- embedding tables
def _table_configs(m: nn.Module) -> list[Any]:
    return m.embedding_bag_configs() if isinstance(m, EmbeddingBagCollection) else m.embedding_configs()


def table_names(model: nn.Module) -> list[str]:
    return [t.name for m in embedding_modules(model) for t in _table_configs(m)]


def allowed_sharding_types(model: nn.Module, device: torch.device, sharding: str) -> dict[str, list[str]]:
    """Per table, the requested sharding types that its module's sharder supports on this device.

    TorchRec 1.8 has no row-wise EmbeddingBagCollection on CPU: with ``train.sharding = "row_wise"`` such
    tables fall back to table-wise (the EmbeddingCollection tables, i.e. the sequence tables, are row-wise).
    """
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    out = {}
    for m in embedding_modules(model):
        sharder = EmbeddingBagCollectionSharder() if isinstance(m, EmbeddingBagCollection) \
            else EmbeddingCollectionSharder()
        supported = set(sharder.sharding_types(device.type))
        types = [x for x in SHARDING_TYPES[sharding] if x in supported] or ["table_wise"]
        for t in _table_configs(m):
            out[t.name] = types
    return out


def plan_tables(model: nn.Module, device: torch.device, pg: dist.ProcessGroup, sharding: str = "auto",
                world: int | None = None) -> Any:
    """TorchRec's planner over ``world`` ranks (default: the group), restricted by ``train.sharding``.

    ``auto`` over one rank plans every table whole (table-wise): row-wise over one rank places the same
    rows on the same rank but pays its bucketising and splits exchange on every step (session 44, with two
    other per-step cuts: a study DCNv2 cell 0.93x the time side by side, every loss bit-identical;
    benchmarks/results/2026-12-06-s44/step_overhead/)."""
    if sharding not in SHARDINGS:
        raise ParallelizeError(f"train.sharding: {sharding!r} is not one of {', '.join(SHARDINGS)}")
    world = world or dist.get_world_size(pg)
    if sharding == "auto" and world == 1:
        sharding = "table_wise"
    constraints = {t: ParameterConstraints(sharding_types=types)
                   for t, types in allowed_sharding_types(model, device, sharding).items()}
    local = min(world, max(1, torch.cuda.device_count())) if device.type == "cuda" else world
    # the factory, not Topology(...): the same topology (TorchRec's defaults), without the warning that direct
    # construction prints on every run
    topology = TopologyFactory.create_topology(TrainerConfig(world_size=world, local_world_size=local),
                                               kernel_config=KernelConfig(compute_device=device.type))
    logging.getLogger("torchrec.distributed.planner").setLevel(logging.ERROR)  # chatty, not actionable
    planner = EmbeddingShardingPlanner(topology=topology, constraints=constraints)
    if world == dist.get_world_size(pg):
        return planner.collective_plan(model, get_default_sharders(), pg)
    return planner.plan(model, get_default_sharders())  # 2-D: a plan for one sharding group


def shard_tables(model: nn.Module, device: torch.device, pg: dist.ProcessGroup,
                 cfg: TrainConfig) -> nn.Module:
    """DMP (or DMPCollection for the 2-D layout) around ``model``; dense parameters are left alone."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    replicas = int(getattr(cfg, "sparse_replicas", 1))
    world = dist.get_world_size(pg)
    sharders = get_default_sharders()
    if replicas > 1:
        if device.type != "cuda":
            raise ParallelizeError(
                f"train.sparse_replicas = {replicas}: TorchRec's 2-D embedding layout (DMPCollection) "
                "needs CUDA devices in torchrec 1.8; on CPU use sparse_replicas = 1")
        if world % replicas:
            raise ParallelizeError(
                f"train.sparse_replicas = {replicas} does not divide the world size {world}")
        from torchrec.distributed.model_parallel import DMPCollection

        group = world // replicas
        plan = plan_tables(model, device, pg, cfg.sharding, world=group)
        return _whole_batch_to_sharded_tables(DMPCollection(
            module=model, device=device, plan=plan, world_size=world, sharding_group_size=group,
            global_pg=pg, sharders=sharders, init_data_parallel=False))
    plan = plan_tables(model, device, pg, cfg.sharding)
    dmp = DistributedModelParallel(model, env=ShardingEnv.from_process_group(pg), device=device, plan=plan,
                                   sharders=sharders, init_data_parallel=False)
    _whole_batch_to_sharded_tables(dmp)
    if device.type != "cpu":
        dmp._dmp_wrapped_module.to(device)  # without DDP DMP leaves the dense part where it was built
    return dmp


def _whole_batch_to_sharded_tables(dmp: DistributedModelParallel) -> DistributedModelParallel:
    """Sharded pooled tables take the batch's whole KJT (FeatureEmbedding.ebc_takes_whole_batch): their
    input all-to-all permutes it anyway, and TorchRec's train pipeline can then start that all-to-all on
    ``batch.sparse`` before the forward (train/pipeline.py) with the key order every other call uses."""
    for m in dmp.module.modules():
        if isinstance(m, FeatureEmbedding) and isinstance(m.ebc, ShardedModule):
            m.ebc_takes_whole_batch = True
    return dmp


# --------------------------------------------------------------------------- dense part
def dense_blocks(module: nn.Module) -> list[nn.Module]:
    """FSDP units: every child of a ModuleList that holds dense parameters and no embedding table."""
    blocks = []
    for m in module.modules():
        if isinstance(m, nn.ModuleList):
            for child in m:
                if not embedding_modules(child) and any(p.requires_grad for p in child.parameters()):
                    blocks.append(child)
    # outermost only: a block inside another block is already sharded with it
    ids = {id(b) for b in blocks}
    inner = {id(x) for b in blocks for x in b.modules() if x is not b and id(x) in ids}
    return [b for b in blocks if id(b) not in inner]


def shard_dense(inner: nn.Module, mesh: DeviceMesh, dense_params: set[nn.Parameter],
                mixed_precision: str = "none") -> list[str]:
    """FSDP2 per block + root on ``mesh``; everything not in ``dense_params`` (the tables) is ignored."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if mixed_precision not in ("none", "bf16"):
        raise ParallelizeError(f"train.fsdp_mixed_precision: {mixed_precision!r} is not one of none, bf16")
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
          if mixed_precision == "bf16" else MixedPrecisionPolicy())
    ignored = {p for p in inner.parameters() if p not in dense_params}
    names = {id(m): n for n, m in inner.named_modules()}
    wrapped = []
    for block in dense_blocks(inner):
        fully_shard(block, mesh=mesh, mp_policy=mp, ignored_params=ignored & set(block.parameters()) or None)
        wrapped.append(names[id(block)])
    fully_shard(inner, mesh=mesh, mp_policy=mp, ignored_params=ignored or None)
    return wrapped + ["<root>"]


# --------------------------------------------------------------------------- all of it
def parallelize(model: nn.Module, mesh: DeviceMesh | None, cfg: TrainConfig, device: torch.device,
                pg: dist.ProcessGroup) -> tuple[nn.Module, dict[str, Any]]:
    """Shard a plain model (sparse optimizer already attached); returns (model to train, what was done).

    ``mesh``: the dense data-parallel mesh (``distributed.dense_mesh``), None for no FSDP.
    """
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    info: dict[str, Any] = {"activation_checkpointing": apply_memory_savers(model, cfg),
                            "cpu_linear": apply_cpu_linear(model, getattr(cfg, "cpu_linear", "auto"), device),
                            "compiled": apply_compile_hook(model, cfg)}
    if not table_names(model):
        model = model.to(device)
    else:
        model = shard_tables(model, device, pg, cfg)
        info["plan"] = {t: s.sharding_type for mod in model.plan.plan.values() for t, s in mod.items()}
    inner = model.module if isinstance(model, DistributedModelParallel) else model
    if mesh is not None:
        dense = {p for _, p in in_backward_optimizer_filter(inner.named_parameters()) if p.requires_grad}
        info["fsdp"] = shard_dense(inner, mesh, dense, getattr(cfg, "fsdp_mixed_precision", "none"))
        info["mesh"] = dict(zip(mesh.mesh_dim_names or (), mesh.shape))
        info["dense_grad_scale"] = mesh.size()
    return model, info


def full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """A copy of a plain (unsharded) model's state: the one init every rank and world size starts from."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def init_from_full(model: nn.Module, full: dict[str, torch.Tensor]) -> None:
    """Copy a full state into a sharded model (each rank takes its shards).

    TorchRec re-initialises sharded tables per shard, so without this the initial tables would depend on
    the sharding plan and world size; with it, 1 and N processes start from the same parameters.
    """
    from torch.distributed.tensor import DTensor, distribute_tensor

    state = model.state_dict()
    missing = [k for k in state if k not in full]
    if missing:
        raise ParallelizeError(f"sharded model has state the plain model lacks: {missing[:5]}")
    with torch.no_grad():
        for k, v in state.items():
            src = full[k]
            if isinstance(v, DTensor):
                local = distribute_tensor(src.to(v.device), v.device_mesh, v.placements).to_local()
                v.to_local().copy_(local)
            elif hasattr(v, "local_shards"):  # ShardedTensor (TorchRec tables)
                for shard in v.local_shards():
                    o, s = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                    idx = tuple(slice(a, a + b) for a, b in zip(o, s))
                    shard.tensor.copy_(src[idx])
            elif isinstance(v, torch.Tensor):
                v.copy_(src)
    model.load_state_dict(state)


# --------------------------------------------------------------------------- a run's model
class ParallelModel(NamedTuple):
    """What :func:`build_run_model` made: the model to train and evaluate, the plain model inside it (for
    FLOPs and introspection), and what parallelize did (plan, FSDP units, mesh, ``dense_grad_scale``)."""

    model: nn.Module
    plain: nn.Module
    info: dict[str, Any]

    @property
    def dense_grad_scale(self) -> float:
        return float(self.info.get("dense_grad_scale", 1))


def build_run_model(schema: FeatureSchema, cfg: RunConfig, device: torch.device, pg: dist.ProcessGroup,
                    timer: StartupTimer | None = None, *, plain: nn.Module | None = None,
                    lr_scale: dict[int, float] | None = None) -> ParallelModel:
    """Build (or take) the plain model, attach the fused sparse optimizer and parallelize it.

    Every rank builds the same full model from the seed and the sharded model copies its shards from
    it, so the initial parameters do not depend on the world size or sharding plan. ``plain``: a model
    the caller built (a vertical model with FM parameters copied in), used instead of ``cfg.model``;
    ``lr_scale``: ``id(parameter)`` -> multiplier of its learning rates (0 = frozen), see ``optim``.
    """
    timer = timer or StartupTimer()
    with timer.phase("model_build"):
        if plain is None:
            torch.manual_seed(cfg.train.seed)
            plain = build_model(schema, cfg.model)
        full = full_state(plain)
        apply_sparse_optimizer(plain, cfg.train, lr_scale)
    with timer.phase("sharding"):
        mesh = distributed.dense_mesh(device, cfg.train.dp_replicate, cfg.train.dp_shard)
        model, info = parallelize(plain, mesh, cfg.train, device, pg)
        init_from_full(model, full)
    torch.manual_seed(cfg.train.seed + distributed.rank())  # e.g. dropout: a different stream per rank
    return ParallelModel(model, plain, info)
