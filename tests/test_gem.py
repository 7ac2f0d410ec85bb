"""GEM assembly: shapes with and without sequences, several groups, FLOPs vs FlopCounterMode, overfitting."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import torch

from opengem.config import ConfigError
from opengem.data.batch import Batch, SequenceBatch
from opengem.data.random_batch import random_batch
from opengem.data.schema import FeatureSchema
from opengem.model.embedding import EmbeddingConfig
from opengem.model.flops import measured_flops
from opengem.model.gem import GEM, GEMConfig, merge_sequences
from opengem.model.heads import HeadConfig, masked_bce
from opengem.model.interformer import InterFormerConfig
from opengem.model.sequence import SequenceEncoderConfig
from opengem.model.wukong import WukongConfig

TINY = Path(__file__).resolve().parents[1] / "configs" / "schemas" / "tiny.toml"


def _schema(extra_group: bool = False, no_sequences: bool = False) -> FeatureSchema:
    d = tomllib.loads(TINY.read_text())
    if no_sequences:
        d.pop("sequence")
    if extra_group:
        d["sequence"].append({"name": "clicks", "max_len": 6,
                              "fields": [{"name": "item", "vocab": 50, "dim": 8, "table": "item"}]})
    return FeatureSchema.from_dict(d)


def _full_length(schema: FeatureSchema, batch: Batch, seed: int = 1) -> Batch:
    """Same batch with every sequence row at its group's max_len (the FLOPs convention)."""
    g = torch.Generator().manual_seed(seed)
    seqs = {}
    for grp in schema.sequences:
        B = batch.batch_size
        n = B * grp.max_len
        seqs[grp.name] = SequenceBatch(
            lengths=torch.full((B,), grp.max_len, dtype=torch.long),
            ids={f.name: torch.randint(0, f.vocab, (n,), generator=g) for f in grp.id_fields},
            dense={f.name: torch.randn(n, generator=g) for f in grp.dense_fields},
        )
    return Batch(batch.dense, batch.sparse, seqs, batch.labels, batch.label_mask, batch.surface,
                 batch.example_id, batch.ts)


def _small(**over) -> GEMConfig:
    return GEMConfig(
        wukong=WukongConfig(n_fm=4, n_lin=4, k=2, mlp_dims=[32], cross_layer_attention=True),
        interformer=InterFormerConfig(num_layers=2),
        **over,
    )


@pytest.mark.parametrize("schema_kind", ["tiny", "two_groups", "no_sequences"])
def test_forward_shapes_and_gradients(schema_kind):
    schema = _schema(extra_group=schema_kind == "two_groups", no_sequences=schema_kind == "no_sequences")
    model = GEM(schema, EmbeddingConfig(d=16), HeadConfig(hidden=[32]), _small())
    batch = random_batch(schema, 6)
    out = model(batch)
    assert out.logits.shape == (6, 2) and out.trunk.shape == (6, 32)
    assert set(out.extras) == {"user", "ad", "trunk"}
    masked_bce(out.logits, batch.labels, batch.label_mask).backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, f"parameters without gradient: {missing}"


def test_merge_sequences_concatenates_groups_per_row():
    a = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]]).unsqueeze(-1)
    ma = a[..., 0] != 0
    b = torch.tensor([[4.0, 0.0], [5.0, 6.0]]).unsqueeze(-1)
    mb = b[..., 0] != 0
    values, mask = merge_sequences([(a, ma), (b, mb)], torch.tensor([[0.0], [100.0]]))
    assert values[..., 0].tolist() == [[1.0, 2.0, 104.0, 0.0, 0.0], [3.0, 105.0, 106.0, 0.0, 0.0]]
    assert mask.sum(1).tolist() == [3, 3]


def test_merge_sequences_one_group_is_typed_and_zero_padded():
    a = torch.tensor([[1.0, 2.0, 7.0], [3.0, 9.0, 9.0]]).unsqueeze(-1)  # 9s: padding with stale values
    ma = torch.tensor([[True, True, True], [True, False, False]])
    values, mask = merge_sequences([(a, ma)], torch.tensor([[10.0]]))
    assert values[..., 0].tolist() == [[11.0, 12.0, 17.0], [13.0, 0.0, 0.0]]
    assert mask is ma


@pytest.mark.parametrize(
    "name,cfg,extra_group",
    [
        ("gem default", GEMConfig(), False),
        ("pyramid active", _small(sequence=SequenceEncoderConfig(window=2, pool_tokens=2, chunk=4)), False),
        ("full attention, two groups", _small(sequence=SequenceEncoderConfig(kind="full")), True),
        ("wukong", GEMConfig(wukong=WukongConfig(), use_sequences=False), False),
        ("cross branch, full rank", _small(cross_layers=2), False),
        ("cross branch, low rank, no sequences", GEMConfig(use_sequences=False, cross_layers=1, cross_rank=4),
         False),
    ],
)
def test_flops_match_counter(name, cfg, extra_group):
    schema = _schema(extra_group=extra_group)
    model = GEM(schema, EmbeddingConfig(d=16), HeadConfig(), cfg)
    if name == "pyramid active":
        assert len(model.encoder.levels) == 2
    batch = _full_length(schema, random_batch(schema, 4))
    measured = measured_flops(model, batch)
    analytic = model.flops_per_example()
    assert abs(analytic - measured) / measured < 0.10, f"{name}: analytic {analytic} vs measured {measured}"


@pytest.mark.parametrize("no_sequences", [False, True])
def test_cross_branch_feeds_the_head(no_sequences):
    """gem.cross_layers: DCNv2 cross layers on the flattened feature tokens, beside the trunk's output in the
    head's input; every parameter trains, and the head's input grows by the tokens' width."""
    schema = _schema(no_sequences=no_sequences)
    plain = GEM(schema, EmbeddingConfig(d=16), HeadConfig(hidden=[32]), _small())
    model = GEM(schema, EmbeddingConfig(d=16), HeadConfig(hidden=[32]), _small(cross_layers=2, cross_rank=3))
    n = model.embedding.num_tokens * 16
    assert len(model.cross) == 2 and model.cross[0].dim == n and model.cross[0].rank == 3
    assert model.head.in_dim == plain.head.in_dim + n
    batch = random_batch(schema, 5)
    out = model(batch)
    masked_bce(out.logits, batch.labels, batch.label_mask).backward()
    assert all(p.grad is not None for p in model.cross.parameters())
    with torch.no_grad():  # the branch is live: scaling its parameters changes the logits
        before = model(batch).logits
        for p in model.cross.parameters():
            p.mul_(3.0)
        assert not torch.allclose(before, model(batch).logits)
    with pytest.raises(ConfigError, match="gem.cross_layers"):
        GEM(schema, EmbeddingConfig(d=16), HeadConfig(), _small(cross_layers=-1))
    with pytest.raises(ConfigError, match="gem.cross_rank"):
        GEM(schema, EmbeddingConfig(d=16), HeadConfig(), _small(cross_layers=1, cross_rank=-2))


@pytest.mark.parametrize("history", ["mean", "summary"])
def test_cross_branch_reads_the_history_when_asked(history):
    """gem.cross_sequence: the cross layers' input is the flattened tokens, then each group's mean event
    ("mean", as DCNv2's cross reads it) or the InterFormer's summary of the history ("summary", GEM's user
    vector); the extra width is all it costs, and the exported program computes the same."""
    from opengem.model.embedding import masked_mean
    from opengem.serve.export import export_program, flat_inputs

    schema = _schema(extra_group=True)
    torch.manual_seed(0)
    model = GEM(schema, EmbeddingConfig(d=16), HeadConfig(hidden=[32]),
                _small(cross_layers=2, cross_rank=3, cross_sequence=history)).eval()
    plain = GEM(schema, EmbeddingConfig(d=16), HeadConfig(hidden=[32]), _small(cross_layers=2, cross_rank=3))
    n = model.embedding.num_tokens * 16
    extra = 16 * len(schema.sequences) if history == "mean" else 16
    assert len(schema.sequences) == 2 and model.cross[0].dim == n + extra
    seen = {}

    def keep_input(module, args, output):  # returns None: the layer's output stays as it is
        seen["x0"] = args[0]

    hook = model.cross[0].register_forward_hook(keep_input)
    batch = random_batch(schema, 6, seed=3)
    with torch.no_grad():
        out = model(batch)
        hook.remove()
        e = model.embedding(batch)
        want = (torch.cat([masked_mean(e.sequences[g.name]) for g in schema.sequences], dim=1)
                if history == "mean" else out.extras["user"])
        assert torch.equal(seen["x0"][:, :n], e.tokens.flatten(1))
        assert torch.allclose(seen["x0"][:, n:], want) and want.abs().sum() > 0
        assert model.flops_per_example() > plain.flops_per_example()
        program = export_program(model, schema)
        assert (program.module()(*flat_inputs(batch, schema)) - out.logits).abs().max().item() <= 1e-5
    with pytest.raises(ConfigError, match="gem.cross_sequence: 'last' is not one of none, mean, summary"):
        GEM(schema, EmbeddingConfig(d=16), HeadConfig(), _small(cross_layers=1, cross_sequence="last"))


@pytest.fixture
def one_thread():
    """Tiny matmuls are ~20x faster on one thread than fighting over a loaded machine's cores."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_tiny_gem_overfits_a_tiny_batch(one_thread):
    torch.manual_seed(0)
    schema = _schema()
    model = GEM(schema, EmbeddingConfig(d=16), HeadConfig(hidden=[32]), _small())
    batch = random_batch(schema, 32, seed=3, label_rate=0.5)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(100):
        loss = masked_bce(model(batch).logits, batch.labels, batch.label_mask)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < 0.3 * losses[0], f"loss {losses[0]:.3f} -> {losses[-1]:.3f}"


def test_gem_without_norms_trains_and_its_norm_key_is_checked():
    """The iso-FLOP study's 4-wide rungs run GEM with no Wukong or Sequence-Arch LayerNorm and no summary gate
    (``wukong.norm = "none"``, ``interformer.seq_norm = "none"``, ``interformer.gate = "none"``)."""
    schema = _schema()
    cfg = GEMConfig(wukong=WukongConfig(n_fm=2, n_lin=2, k=2, mlp_dims=[16], cross_layer_attention=False,
                                        norm="none"),
                    interformer=InterFormerConfig(num_layers=1, seq_norm="none", gate="none"),
                    cross_layers=2, cross_rank=2)
    model = GEM(schema, EmbeddingConfig(d=4), HeadConfig(hidden=[16]), cfg)
    names = [n for n, _ in model.named_parameters()]
    assert not any(n.endswith((".interaction.ln.weight", ".ln1.weight", ".ln2.weight")) for n in names)
    assert any(n.endswith(".interaction.fm_ln.weight") for n in names)  # the FMB's own norm stays
    batch = random_batch(schema, 6)
    out = model(batch)
    masked_bce(out.logits, batch.labels, batch.label_mask).backward()
    assert torch.isfinite(out.logits).all()
    cfg.wukong.norm = "rms"
    with pytest.raises(ConfigError, match=r"gem\.wukong\.norm: 'rms' is not one of layer, none"):
        GEM(schema, EmbeddingConfig(d=4), HeadConfig(hidden=[16]), cfg)
