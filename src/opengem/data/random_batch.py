"""Random, schema-conformant Batches: for model and trainer tests that must not depend on a dataset."""

from __future__ import annotations

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from opengem.data.batch import Batch, SequenceBatch
from opengem.data.match_features import first_values, match_feature_values
from opengem.data.schema import FeatureSchema
from opengem.data.time_features import time_feature_values


def random_batch(
    schema: FeatureSchema,
    batch_size: int,
    seed: int = 0,
    max_seq_len: int | None = None,
    label_rate: float = 0.2,
    observed_rate: float = 0.9,
) -> Batch:
    """A Batch whose ids respect every vocabulary and whose sequences are jagged (some rows empty)."""
    g = torch.Generator().manual_seed(seed)
    B = batch_size
    keys, values, lengths = [], [], []
    for f in schema.sparse:
        n = torch.randint(1, 4, (B,), generator=g) if f.multi_valued else torch.ones(B, dtype=torch.long)
        keys.append(f.name)
        lengths.append(n)
        values.append(torch.randint(0, f.vocab, (int(n.sum()),), generator=g))
    sparse = (
        KeyedJaggedTensor.from_lengths_sync(keys=keys, values=torch.cat(values), lengths=torch.cat(lengths))
        if keys
        else KeyedJaggedTensor.empty()
    )
    seqs = {}
    for grp in schema.sequences:
        cap = min(grp.max_len, max_seq_len or grp.max_len)
        lens = torch.randint(0, cap + 1, (B,), generator=g)
        lens[0] = cap  # at least one full row, so padded shapes are exercised
        total = int(lens.sum())
        ids = {f.name: torch.randint(0, f.vocab, (total,), generator=g) for f in grp.id_fields}
        dense = {f.name: torch.randn(total, generator=g) for f in grp.dense_fields}
        seqs[grp.name] = SequenceBatch(lengths=lens, ids=ids, dense=dense)
    T = len(schema.tasks)
    ts = torch.arange(B, dtype=torch.long)
    dense = torch.randn(B, len(schema.dense), generator=g)
    if schema.time_features:  # derived from ts as to_batch derives them (a schema without any: same draws)
        clock = time_feature_values(ts.numpy(), schema.time_features, schema.time_unit)
        dense = torch.cat([dense, torch.from_numpy(clock)], dim=1)
    if schema.match_features:  # likewise from the drawn ids
        kjt = sparse.to_dict()
        for m in schema.match_features:
            sb = seqs[m.sequence]
            target = first_values(kjt[m.feature].lengths().numpy(), kjt[m.feature].values().numpy())
            got = match_feature_values(sb.lengths.numpy(), sb.ids[m.field].numpy(), target, m.recent)
            dense = torch.cat([dense, torch.from_numpy(got)], dim=1)
    return Batch(
        dense=dense,
        sparse=sparse,
        sequences=seqs,
        labels=(torch.rand(B, T, generator=g) < label_rate).float(),
        label_mask=torch.rand(B, T, generator=g) < observed_rate,
        surface=torch.randint(0, len(schema.surfaces), (B,), generator=g),
        example_id=torch.arange(B, dtype=torch.long) + seed * B,
        ts=ts,
    )
