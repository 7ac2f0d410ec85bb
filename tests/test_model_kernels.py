"""Same model, same numbers: GEM's fused kernel path against the reference path, forward and backward.

The fused path (``model.gem.kernel = "fused"``, the default) changes how blocks compute, never what: RoPE
folded into the q/k projections, K and V from the halves of the kv weight, and the pyramid's chunked local
attention run on real chunks only (jagged). These tests flip one model's kernel (the same weights) and
compare, on random jagged batches with empty rows, batch 1 and a batch with no events at all, down to the
GEM-small recipe itself (configs/small.toml's model section); and two copies, one per kernel, trained side by
side for several optimizer steps (issue 13: trained GEMs differed, so equality must hold along training too).
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest
import torch

from opengem.config import ConfigError
from opengem.config import from_dict as config_from_dict
from opengem.data.batch import Batch, SequenceBatch
from opengem.data.random_batch import random_batch
from opengem.data.sim_config import SimConfig, sim_schema
from opengem.model.heads import masked_bce
from opengem.model.registry import ModelConfig, build_model
from opengem.model.sequence import MultiHeadAttention, SequenceEncoder, SequenceEncoderConfig, use_kernel

ROOT = Path(__file__).resolve().parents[1]
ATOL, RTOL = 2e-5, 1e-4


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny matmuls are ~20x faster on one thread than fighting over a loaded machine's cores."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(b, a, atol=ATOL, rtol=RTOL)


def _grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


def _both(module: torch.nn.Module, run) -> tuple:  # noqa: ANN001
    """(outputs, parameter grads, input grads) of ``run()`` under the reference and the fused kernel."""
    results = []
    for kernel in ("pytorch", "fused"):
        use_kernel(module, kernel)
        module.zero_grad()
        outs, inputs = run()
        loss = sum((o * torch.linspace(-1, 1, o.numel()).view(o.shape)).sum() for o in outs)
        loss.backward()
        results.append((outs, _grads(module), [x.grad for x in inputs]))
    return results


def _assert_same(results: tuple) -> None:
    (o_ref, g_ref, x_ref), (o_fused, g_fused, x_fused) = results
    for a, b in zip(o_ref, o_fused):
        _close(a.detach(), b.detach())
    assert set(g_ref) == set(g_fused)
    for name in g_ref:
        _close(g_ref[name], g_fused[name])
    for a, b in zip(x_ref, x_fused):
        _close(a, b)


def _jagged(lengths: list[int], L: int, d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.arange(L)[None, :] < torch.tensor(lengths, dtype=torch.long)[:, None]
    x = torch.randn(len(lengths), L, d, generator=g) * mask[..., None]
    return x.requires_grad_(True), mask


@pytest.mark.parametrize("use_rope", [True, False])
@pytest.mark.parametrize("heads", [1, 2])
@pytest.mark.parametrize("lengths", [[3, 0, 5, 1], [4], [0, 0]])
def test_attention_module_fused_equals_reference(use_rope, heads, lengths):
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, heads, use_rope=use_rope)
    keys, mask = _jagged(lengths, 5, 8, seed=1)
    query = torch.randn(len(lengths), 3, 8, requires_grad=True)
    _assert_same(_both(mha, lambda: ((mha(query, keys, mask),), [query, keys])))


def test_attention_module_fused_keeps_given_positions():
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2, use_rope=True)
    x, mask = _jagged([4, 2, 0], 4, 8, seed=2)
    q_pos = torch.tensor([[3, 4, 5, 6], [0, 1, 2, 3], [9, 9, 9, 9]])[:, None]  # per row, broadcast over heads
    k_pos = torch.arange(4) + 2
    _assert_same(_both(mha, lambda: ((mha(x, x, mask, q_pos=q_pos, k_pos=k_pos),), [x])))


@pytest.mark.parametrize("kind", ["pyramid", "full"])
@pytest.mark.parametrize("lengths", [[40, 0, 7, 16, 1, 33], [17], [0, 0, 0]])
def test_sequence_encoder_fused_equals_reference(kind, lengths):
    torch.manual_seed(0)
    cfg = SequenceEncoderConfig(kind=kind, levels=2, window=8, pool_tokens=4, chunk=8, num_heads=2,
                                ffn_mult=1)
    enc = SequenceEncoder(16, 40, cfg)
    x, mask = _jagged(lengths, max(lengths) or 1, 16, seed=3)
    target = torch.randn(len(lengths), 16, requires_grad=True)

    def run():
        values, out_mask = enc(x, mask, target)
        assert not torch.isnan(values).any()
        return (values,), [x, target]

    _assert_same(_both(enc, run))
    use_kernel(enc, "pytorch")
    ref_mask = enc(x, mask, target)[1]
    use_kernel(enc, "fused")
    assert torch.equal(enc(x, mask, target)[1], ref_mask)


def _small_recipe() -> tuple[ModelConfig, SimConfig]:
    recipe = tomllib.loads((ROOT / "configs" / "small.toml").read_text())
    # the recipe's model section as is; its data with small vocabularies (table sizes are data, not model,
    # and full-size tables only make the test slow)
    sim = {**recipe["data"]["sim"], "users": 300, "ads": 200, "advertisers": 40}
    return config_from_dict(ModelConfig, recipe["model"], "model"), SimConfig.from_dict(sim)


@pytest.fixture(scope="module")
def gem_small():
    """GEM from configs/small.toml's model section (fixed seed), and the schema of the recipe's data."""
    mcfg, sim = _small_recipe()
    assert mcfg.gem.kernel == "fused", "the fused kernels are the default"
    schema = sim_schema(sim)
    torch.manual_seed(0)
    model = build_model(schema, mcfg)
    mcfg.gem.kernel = "pytorch"
    torch.manual_seed(0)
    reference = build_model(schema, mcfg)
    return model, reference, schema


def test_gem_small_kernel_choice_keeps_parameters(gem_small):
    model, reference, _ = gem_small
    shapes = {n: t.shape for n, t in model.state_dict().items()}
    assert shapes == {n: t.shape for n, t in reference.state_dict().items()}, "checkpoints must load across"
    for a, b in zip(model.state_dict().values(), reference.state_dict().values()):
        assert torch.equal(a, b), "the kernel choice must not change initialisation"


def _without_events(batch: Batch) -> Batch:
    """The same rows with every history empty."""
    seqs = {g: SequenceBatch(lengths=torch.zeros_like(sb.lengths), ids={f: v[:0] for f, v in sb.ids.items()},
                             dense={f: v[:0] for f, v in sb.dense.items()})
            for g, sb in batch.sequences.items()}
    return dataclasses.replace(batch, sequences=seqs)


@pytest.mark.parametrize("batch_size,max_seq_len,no_events",
                         [(24, None, False), (24, 3, False), (1, None, False), (6, None, True)])
def test_gem_small_fused_equals_reference(gem_small, batch_size, max_seq_len, no_events):
    """Same weights, fused (default) vs reference kernels: logits, trunk, user vector, loss and every grad.

    Batches: long jagged histories, short ones with empty rows, batch 1, and no events at all.
    """
    model, _, schema = gem_small
    batch = random_batch(schema, batch_size, seed=5, max_seq_len=max_seq_len)
    if no_events:
        batch = _without_events(batch)
    lengths = batch.sequences["hist"].lengths
    if max_seq_len == 3:
        assert (lengths == 0).any() and (lengths > 0).any()

    def run():
        out = model(batch)
        loss = masked_bce(out.logits, batch.labels, batch.label_mask)
        return (out.logits, out.trunk, out.extras["user"], loss[None]), []

    _assert_same(_both(model, run))


def test_gem_kernel_is_checked_config():
    mcfg, sim = _small_recipe()
    mcfg.gem.kernel = "cuda"
    with pytest.raises(ConfigError, match=r"model\.gem\.kernel: 'cuda' is not one of pytorch, fused, triton"):
        build_model(sim_schema(sim), mcfg)


def test_fused_encoder_compiles_whole_graph_and_matches_reference():
    """Under torch.compile the fused encoder takes its static-shape form: fullgraph traces, numbers agree."""
    torch.manual_seed(0)
    cfg = SequenceEncoderConfig(kind="pyramid", levels=1, window=4, pool_tokens=2, chunk=4, num_heads=2)
    enc = SequenceEncoder(8, 16, cfg)
    x, mask = _jagged([16, 0, 5], 16, 8, seed=4)
    target = torch.randn(3, 8)
    ref = enc(x, mask, target)[0]
    use_kernel(enc, "fused")
    compiled = torch.compile(enc, backend="eager", fullgraph=True)
    _close(ref.detach(), compiled(x, mask, target)[0].detach())


def _train_batches(schema) -> list[Batch]:  # noqa: ANN001
    """What a training run feeds that one random batch does not: empty rows, a batch without events, a
    batch from one surface only (the other surfaces' head weights get no gradient) and a batch whose
    second task is never observed (its logits get none)."""
    one_surface = random_batch(schema, 16, seed=12)
    no_task = random_batch(schema, 16, seed=13)
    no_task.label_mask[:, -1] = False
    return [random_batch(schema, 16, seed=10), random_batch(schema, 16, seed=11, max_seq_len=3),
            dataclasses.replace(one_surface, surface=torch.full_like(one_surface.surface, 2)),
            no_task, _without_events(random_batch(schema, 8, seed=14)), random_batch(schema, 16, seed=15)]


def test_gem_small_fused_and_reference_train_alike(gem_small):
    """Several optimizer steps, not one backward: the two kernels must leave the same weights and running
    statistics after each step. SGD with momentum skips a parameter whose grad is None but moves one whose
    grad is zero, so a gradient one path leaves unset and the other zeroes shows here. (Not AdamW: it scales
    each gradient by its own magnitude, so on parameters whose true gradient is zero, e.g. the key bias of
    attention without RoPE, it turns fp32 rounding noise into full-size steps on either path.)"""
    _, _, schema = gem_small
    mcfg, _ = _small_recipe()
    models = []
    for kernel in ("pytorch", "fused"):
        mcfg.gem.kernel = kernel
        torch.manual_seed(0)
        models.append(build_model(schema, mcfg))
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in models]
    for step, batch in enumerate(_train_batches(schema)):
        for model, opt in zip(models, opts):
            model.train()
            opt.zero_grad(set_to_none=True)
            out = model(batch)
            masked_bce(out.logits, batch.labels, batch.label_mask).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        ref, fused = (dict(m.state_dict()) for m in models)
        for name, value in ref.items():
            if value.is_floating_point():
                torch.testing.assert_close(fused[name], value, atol=ATOL, rtol=RTOL,
                                           msg=lambda m, n=name, s=step: f"{n} after step {s}: {m}")
