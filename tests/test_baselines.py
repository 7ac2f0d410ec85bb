from pathlib import Path

import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from opengem.data.batch import SequenceBatch
from opengem.data.random_batch import random_batch
from opengem.data.schema import FeatureSchema
from opengem.model.baselines import (
    DIN,
    DLRM,
    DCNv2,
    DCNv2Config,
    DINConfig,
    DLRMConfig,
    TargetAttention,
)
from opengem.model.cross import CrossLayer
from opengem.model.embedding import EmbeddingConfig
from opengem.model.heads import HeadConfig, masked_bce

TINY = Path(__file__).resolve().parents[1] / "configs" / "schemas" / "tiny.toml"
EMB = EmbeddingConfig(d=16)
HEAD = HeadConfig(hidden=[32], adapter_dim=8)


@pytest.fixture(scope="module")
def schema() -> FeatureSchema:
    return FeatureSchema.load(TINY)


def _models(schema):
    return {
        "dlrm": DLRM(schema, EMB, HEAD, DLRMConfig(bottom_mlp=[16], top_mlp=[32])),
        "dcnv2": DCNv2(schema, EMB, HEAD, DCNv2Config(num_cross_layers=2, deep_mlp=[32])),
        "dcnv2_lr_stacked": DCNv2(
            schema, EMB, HEAD, DCNv2Config(low_rank=4, deep_mlp=[32], structure="stacked")
        ),
        "din": DIN(schema, EMB, HEAD, DINConfig(attention_mlp=[16], mlp=[32])),
        "din_softmax": DIN(schema, EMB, HEAD, DINConfig(attention_mlp=[16], softmax=True, mlp=[32])),
    }


def test_shapes_and_gradients(schema):
    torch.manual_seed(0)
    b = random_batch(schema, 8)
    b.surface = torch.arange(8) % 3
    for name, m in _models(schema).items():
        out = m(b)
        assert out.logits.shape == (8, 2) and out.trunk.shape == (8, 32), name
        masked_bce(out.logits, b.labels, torch.ones_like(b.label_mask)).backward()
        for pname, p in m.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all(), f"{name}: {pname}"
        assert m.embedding.ecs["d8"].embeddings["item"].weight.grad.abs().sum() > 0, name


def test_cross_layer_equation_by_hand():
    x0 = torch.tensor([[1.0, 2.0]])
    x = torch.tensor([[3.0, 4.0]])
    full = CrossLayer(2)
    with torch.no_grad():
        full.w.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 2.0]]))
        full.w.bias.copy_(torch.tensor([0.5, -1.0]))
    # W x + b = [3.5, 7]; x0 * that = [3.5, 14]; + x = [6.5, 18]
    assert torch.allclose(full(x0, x), torch.tensor([[6.5, 18.0]]))
    low = CrossLayer(2, rank=1)
    with torch.no_grad():
        low.v.weight.copy_(torch.tensor([[1.0, 1.0]]))
        low.u.weight.copy_(torch.tensor([[1.0], [2.0]]))
        low.u.bias.zero_()
    # U Vᵀ x = [7, 14]; x0 * that = [7, 28]; + x = [10, 32]
    assert torch.allclose(low(x0, x), torch.tensor([[10.0, 32.0]]))


def test_dlrm_interaction_equals_explicit_pairwise_dots(schema):
    torch.manual_seed(0)
    m = DLRM(schema, EMB, HEAD, DLRMConfig())
    m.top = torch.nn.Identity()
    b = random_batch(schema, 4)
    emb = m.embedding(b)
    got = m.interact(b, emb)
    bottom = m.bottom(b.dense)
    seq = emb.sequences["hist"]
    vecs = [bottom, *emb.tokens.unbind(1), seq.values.sum(1) / seq.lengths.clamp(min=1)[:, None]]
    n = len(vecs)
    assert n == m.num_vectors == 1 + 3 + 1  # bottom, 2 sparse tokens + surface token, 1 sequence
    dots = [(vecs[i] * vecs[j]).sum(1) for i in range(n) for j in range(i + 1, n)]
    ref = torch.cat([bottom, torch.stack(dots, 1)], dim=1)
    assert torch.allclose(got, ref, atol=1e-5)


@pytest.mark.parametrize("softmax", [False, True])
def test_din_attention_ignores_padding_garbage(softmax):
    torch.manual_seed(0)
    att = TargetAttention(8, [16], softmax=softmax)
    q = torch.randn(3, 8)
    keys = torch.randn(3, 5, 8)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], dtype=torch.bool)
    clean = att(q, torch.where(mask[..., None], keys, torch.zeros_like(keys)), mask)
    garbage = att(q, torch.where(mask[..., None], keys, torch.full_like(keys, 1e6)), mask)
    assert torch.allclose(clean, garbage)
    assert (clean[2] == 0).all()  # empty history -> zero interest
    if softmax:
        w = torch.softmax(
            att.mlp(
                torch.cat(
                    [
                        q[1:2, None].expand(1, 5, 8),
                        keys[1:2],
                        q[1:2, None] - keys[1:2],
                        q[1:2, None] * keys[1:2],
                    ],
                    -1,
                )
            ).squeeze(-1),
            1,
        )
        assert torch.allclose(clean[1], (w[..., None] * keys[1:2]).sum(1)[0], atol=1e-5)


def _append_events(b, group, row, n, schema, seed=5):
    """Same batch with ``n`` extra events at the end of ``row``'s history (other rows untouched)."""
    g = torch.Generator().manual_seed(seed)
    sb = b.sequences[group]
    end = int(sb.offsets[row + 1])
    grp = schema.sequence(group)
    ids = {
        f.name: torch.cat(
            [sb.ids[f.name][:end], torch.randint(0, f.vocab, (n,), generator=g), sb.ids[f.name][end:]]
        )
        for f in grp.id_fields
    }
    dense = {
        f.name: torch.cat([sb.dense[f.name][:end], torch.randn(n, generator=g), sb.dense[f.name][end:]])
        for f in grp.dense_fields
    }
    lengths = sb.lengths.clone()
    lengths[row] += n
    seqs = dict(b.sequences)
    seqs[group] = SequenceBatch(lengths=lengths, ids=ids, dense=dense)
    return type(b)(
        dense=b.dense,
        sparse=b.sparse,
        sequences=seqs,
        labels=b.labels,
        label_mask=b.label_mask,
        surface=b.surface,
        example_id=b.example_id,
        ts=b.ts,
    )


@pytest.mark.parametrize("name", ["din", "din_softmax", "dlrm", "dcnv2"])
def test_longer_padding_of_other_rows_does_not_change_output(schema, name):
    torch.manual_seed(0)
    m = _models(schema)[name].eval()
    b = random_batch(schema, 4, max_seq_len=6)
    b2 = _append_events(b, "hist", 0, 5, schema)
    assert b2.sequences["hist"].max_len == b.sequences["hist"].max_len + 5
    o1, o2 = m(b).logits, m(b2).logits
    assert torch.allclose(o1[1:], o2[1:], atol=1e-5)
    assert not torch.allclose(o1[0], o2[0])


def test_baselines_work_without_sequences():
    schema = FeatureSchema.from_dict(
        {
            "name": "flat",
            "surfaces": ["a", "b"],
            "task": [{"name": "click"}],
            "sparse": [{"name": "u", "vocab": 10, "dim": 4}, {"name": "v", "vocab": 10, "dim": 16}],
            "dense": [{"name": "x"}],
        }
    )
    b = random_batch(schema, 5)
    for m in (
        DLRM(schema, EMB, HEAD, DLRMConfig()),
        DCNv2(schema, EMB, HEAD, DCNv2Config()),
        DIN(schema, EMB, HEAD, DINConfig()),
    ):
        assert m(b).logits.shape == (5, 1)
        assert m.flops_per_example() > 0


def test_dlrm_without_dense_features():
    schema = FeatureSchema.from_dict(
        {
            "name": "nodense",
            "surfaces": ["a"],
            "task": [{"name": "click"}],
            "sparse": [{"name": "u", "vocab": 10, "dim": 16}, {"name": "v", "vocab": 10, "dim": 16}],
        }
    )
    sparse = KeyedJaggedTensor.from_lengths_sync(
        keys=["u", "v"], values=torch.tensor([1, 2, 3, 4]), lengths=torch.ones(4, dtype=torch.long)
    )
    b = random_batch(schema, 2)
    b.sparse = sparse
    m = DLRM(schema, EMB, HEAD, DLRMConfig())
    assert m.bottom is None and m(b).logits.shape == (2, 1)


@pytest.fixture
def one_thread():
    """Tiny matmuls on a shared 2-core machine are fastest (and least noisy) single-threaded."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("name", ["dlrm", "dcnv2", "din"])
def test_each_baseline_overfits_a_tiny_batch(schema, name, one_thread):
    torch.manual_seed(0)
    m = _models(schema)[name]
    b = random_batch(schema, 16, seed=2, label_rate=0.5)
    opt = torch.optim.Adam(m.parameters(), lr=2e-2)
    first = None
    for _ in range(40):
        loss = masked_bce(m(b).logits, b.labels, b.label_mask)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.1 * first, (first, loss.item())
