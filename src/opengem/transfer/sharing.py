"""Parameter sharing: initialise (or share, frozen or at a low lr) FM components inside a VM.

Components are matched by their path inside the embedding layer (``embedding.<...>``), so embedding
tables (by table name), the per-group sequence projection (the FM's sequence front end) and token
projections are shared wherever the VM has a component of the same name and a compatible shape. A table
the VM keeps smaller (``vocab_cap``, ids hashed mod vocab) takes the FM's first rows. Sharing adds no
serving FLOPs (lookups and same-shape layers); the extra serving cost is table memory, reported.
"""

from __future__ import annotations

import torch
from torch import nn


def _plain_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """name -> full tensor of a (possibly DMP-sharded, 1-process) model; sharded tables are gathered."""
    out = {}
    for k, v in model.state_dict().items():
        if hasattr(v, "local_shards"):
            shards = v.local_shards()
            full = torch.zeros(v.size(), dtype=shards[0].tensor.dtype)
            for s in shards:
                off = s.metadata.shard_offsets
                sz = s.metadata.shard_sizes
                full[off[0] : off[0] + sz[0], off[1] : off[1] + sz[1]] = s.tensor
            v = full
        out[
            k.replace("_dmp_wrapped_module.", "").replace("module.", "", 1 if k.startswith("module.") else 0)
        ] = v
    return out


def _suffix(name: str) -> str | None:
    """Match key: tables by table name (EBC or EC alike), other layers by their path in the embedding."""
    if ".embedding_bags." in name or ".embeddings." in name:
        return "table:" + name.split(".")[-2]
    i = name.find("embedding.")
    return name[i + len("embedding.") :] if i >= 0 else None


def share_fm_parameters(vm: nn.Module, fm: nn.Module) -> dict[str, int]:
    """Copy matching FM embedding-layer parameters into the plain (unsharded) VM; returns name -> numel.

    Call before the VM is wrapped by DMP. Tables copy min(rows) rows when the VM table is smaller.
    """
    fm_state = {s: v for k, v in _plain_state(fm).items() if (s := _suffix(k)) is not None}
    copied: dict[str, int] = {}
    with torch.no_grad():
        for name, p in vm.named_parameters():
            s = _suffix(name)
            if s is None or s not in fm_state:
                continue
            src = fm_state[s].to(p.dtype)
            if src.shape == p.shape:
                p.copy_(src)
            elif (
                src.dim() == 2
                and src.shape[1] == p.shape[1]
                and src.shape[0] >= p.shape[0]
                and (s.startswith("table:"))
            ):
                p.copy_(src[: p.shape[0]])
            else:
                continue
            copied[name] = p.numel()
    return copied
