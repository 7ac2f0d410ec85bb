"""GEM's sequence path on length buckets (``model.gem.seq_buckets``) against the whole batch at once.

Bucketing must change how much padding runs, never a number: the same weights with K = 1 and K > 1 give
the same logits, loss and every parameter gradient on random jagged batches (empty rows, all lengths
equal, one row, no events at all, K above the batch size), for GEM-small (configs/small.toml's model) and
a tiny GEM with two sequence groups and running norms (batch statistics, computed before the split). A row
dropped or put back in the wrong place must fail these tests (pinned below by breaking the restore on
purpose). FLOPs follow what runs: the analytic count of a bucketed batch (sum over buckets of rows x the
sequence path at the bucket's width) equals FlopCounterMode's count of that very forward pass.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path

import pytest
import torch

import opengem.model.gem as gem_module
from opengem.cli import main
from opengem.config import ConfigError, from_dict, load_config, save_config
from opengem.data.batch import Batch, SequenceBatch
from opengem.data.random_batch import random_batch
from opengem.data.schema import FeatureSchema
from opengem.data.sim_config import SimConfig, sim_schema
from opengem.model.flops import (
    executed_flops_per_example,
    measured_flops,
    model_flops,
    padded_flops_per_example,
)
from opengem.model.heads import masked_bce
from opengem.model.registry import ModelConfig, build_model
from opengem.model.sequence import use_kernel
from opengem.ops.length_buckets import length_buckets, restore_rows, take_rows
from opengem.train.config import RunConfig

ROOT = Path(__file__).resolve().parents[1]
SMALL = ROOT / "configs" / "small.toml"
TINY_SCHEMA = ROOT / "configs" / "schemas" / "tiny.toml"
ATOL, RTOL = 1e-5, 1e-4


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# ------------------------------------------------------------------ the ops
LENGTHS = [
    [5, 0, 3, 3, 9, 1, 0, 7],  # jagged, empty rows
    [4, 4, 4, 4, 4],  # all equal
    [6],  # one row
    [0, 0, 0],  # no events at all
    [2, 8, 1],  # k above the batch size for k = 4, 8
    [],  # no rows
]


@pytest.mark.parametrize("lengths", LENGTHS)
@pytest.mark.parametrize("k", [1, 2, 3, 4, 8])
def test_length_buckets_cover_every_row_once_shortest_first(lengths, k):
    t = torch.tensor(lengths, dtype=torch.long)
    buckets = length_buckets(t, k)
    rows = torch.cat([r for r, _ in buckets]) if buckets else torch.zeros(0, dtype=torch.long)
    assert sorted(rows.tolist()) == list(range(len(lengths))), "every row in exactly one bucket"
    assert len(buckets) <= k and all(r.numel() > 0 for r, _ in buckets), "no empty bucket"
    longest = [w for _, w in buckets]
    assert longest == sorted(set(longest)), "shortest first; equal widths merged"
    for r, w in buckets:
        assert w == max(lengths[i] for i in r.tolist()), "width = the bucket's longest row"
    for (r1, _), (r2, _) in zip(buckets, buckets[1:]):
        assert max(lengths[i] for i in r1.tolist()) <= min(lengths[i] for i in r2.tolist()), "sorted split"


def test_length_buckets_split_equal_counts_and_refuse_a_bad_k():
    t = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    assert [r.numel() for r, _ in length_buckets(t, 4)] == [2, 3, 2, 3]
    assert [w for _, w in length_buckets(t, 4)] == [2, 5, 7, 10]
    assert len(length_buckets(torch.tensor([3, 3, 3, 3]), 4)) == 1, "same length: padding them apart saves 0"
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="k must be an int >= 1"):
            length_buckets(t, bad)


def test_take_rows_and_restore_rows_are_inverse_forward_and_backward():
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([5, 0, 3, 3, 9, 1, 0, 7])
    mask = torch.arange(9)[None, :] < lengths[:, None]
    x = (torch.randn(8, 9, 4, generator=g) * mask[..., None]).requires_grad_(True)
    parts, rows = [], []
    for r, w in length_buckets(lengths, 3):
        v, m = take_rows(x, mask, r, max(w, 1))
        assert v.shape[1] == max(w, 1) and torch.equal(m.sum(1), lengths[r]), "no real event cut"
        parts.append((v * m[..., None]).sum(1))  # a per-row output of its real events
        rows.append(r)
    out = restore_rows(parts, rows)
    torch.testing.assert_close(out, x.sum(1), atol=0, rtol=0)
    up = torch.randn(out.shape, generator=g)
    (out * up).sum().backward()
    torch.testing.assert_close(x.grad, up[:, None, :].expand_as(x) * mask[..., None], atol=0, rtol=0)
    with pytest.raises(ValueError, match="one row list per part"):
        restore_rows(parts, rows[:-1])


# ------------------------------------------------------------------ GEM, K = 1 vs K > 1
def _small_model_cfg() -> tuple[ModelConfig, FeatureSchema]:
    recipe = tomllib.loads(SMALL.read_text())
    sim = SimConfig.from_dict({**recipe["data"]["sim"], "users": 300, "ads": 200, "advertisers": 40})
    return from_dict(ModelConfig, recipe["model"], "model"), sim_schema(sim)


def _tiny_two_groups() -> tuple[ModelConfig, FeatureSchema]:
    d = tomllib.loads(TINY_SCHEMA.read_text())
    d["sequence"].append({"name": "clicks", "max_len": 6,
                          "fields": [{"name": "item", "vocab": 50, "dim": 8, "table": "item"}]})
    cfg = load_config(ModelConfig, None, [
        "embedding.d=8", "gem.wukong.n_fm=2", "gem.wukong.n_lin=2", "gem.wukong.k=2",
        "gem.wukong.mlp_dims=[16]", "gem.wukong.cross_layer_attention=true", "gem.interformer.num_layers=2",
        "gem.sequence.levels=2", "gem.sequence.window=3", "gem.sequence.pool_tokens=2",
        "gem.sequence.chunk=4", "gem.sequence.ffn_mult=1",
        "embedding.dense_norm=true"])  # running norms (batch statistics) in the embedding, before the split
    return cfg, FeatureSchema.from_dict(d)


@pytest.fixture(scope="module", params=["small", "tiny_two_groups"])
def gem(request):
    cfg, schema = _small_model_cfg() if request.param == "small" else _tiny_two_groups()
    torch.manual_seed(0)
    model = build_model(schema, cfg)
    assert model.cfg.seq_buckets >= 1
    return model, schema


def _without_events(batch: Batch) -> Batch:
    seqs = {g: SequenceBatch(lengths=torch.zeros_like(sb.lengths), ids={f: v[:0] for f, v in sb.ids.items()},
                             dense={f: v[:0] for f, v in sb.dense.items()})
            for g, sb in batch.sequences.items()}
    return dataclasses.replace(batch, sequences=seqs)


def _equal_lengths(batch: Batch, n: int) -> Batch:
    """Every row of every group with ``n`` events (ids drawn anew)."""
    g = torch.Generator().manual_seed(3)
    seqs = {}
    for name, sb in batch.sequences.items():
        total = batch.batch_size * n
        seqs[name] = SequenceBatch(
            lengths=torch.full_like(sb.lengths, n),
            ids={f: torch.randint(0, int(v.max()) + 1 if v.numel() else 1, (total,), generator=g)
                 for f, v in sb.ids.items()},
            dense={f: torch.randn(total, generator=g) for f in sb.dense})
    return dataclasses.replace(batch, sequences=seqs)


BATCHES = {
    "jagged": lambda s: random_batch(s, 24, seed=5),
    "short_with_empty_rows": lambda s: random_batch(s, 24, seed=6, max_seq_len=3),
    "equal_lengths": lambda s: _equal_lengths(random_batch(s, 12, seed=7), 4),
    "one_row": lambda s: random_batch(s, 1, seed=8),
    "no_events": lambda s: _without_events(random_batch(s, 6, seed=9)),
    "fewer_rows_than_k": lambda s: random_batch(s, 5, seed=10),
}


def _run(model: torch.nn.Module, batch: Batch, k: int) -> tuple[dict, dict]:
    """(outputs incl. loss, every parameter gradient) of one forward + backward with ``seq_buckets = k``."""
    model.cfg.seq_buckets = k
    model.zero_grad(set_to_none=True)
    out = model(batch)
    loss = masked_bce(out.logits, batch.labels, batch.label_mask)
    # the user vector (extras) and trunk feed the loss too, so their gradients are compared as well
    (loss + 0.1 * out.extras["user"].square().mean() + 0.1 * out.trunk.square().mean()).backward()
    outs = {"logits": out.logits.detach(), "loss": loss.detach(), "user": out.extras["user"].detach(),
            "trunk": out.trunk.detach()}
    return outs, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _rewinder(model: torch.nn.Module):  # noqa: ANN202
    """A function that puts the model's buffers back as they are now (training forwards move norms)."""
    buffers = {n: b.clone() for n, b in model.named_buffers()}

    def rewind() -> None:
        for n, b in model.named_buffers():
            b.copy_(buffers[n])

    return rewind


def _assert_same(model: torch.nn.Module, batch: Batch, k: int) -> None:
    """Both runs start from the same buffers: a training forward moves the embedding's running norms."""
    rewind = _rewinder(model)
    try:
        rewind()
        ref_out, ref_grad = _run(model, batch, 1)
        rewind()
        out, grad = _run(model, batch, k)
    finally:
        model.cfg.seq_buckets = 1
    for name in ref_out:
        torch.testing.assert_close(out[name], ref_out[name], atol=ATOL, rtol=RTOL,
                                   msg=lambda m, n=name: f"{n}: {m}")
    assert set(grad) == set(ref_grad), "the same parameters get gradients"
    for name in ref_grad:
        torch.testing.assert_close(grad[name], ref_grad[name], atol=ATOL, rtol=RTOL,
                                   msg=lambda m, n=name: f"grad {n}: {m}")


@pytest.mark.parametrize("batch_kind", list(BATCHES))
@pytest.mark.parametrize("k", [2, 4, 100])
def test_bucketed_gem_equals_whole_batch(gem, batch_kind, k):
    model, schema = gem
    batch = BATCHES[batch_kind](schema)
    _assert_same(model, batch, k)


def test_bucketing_really_splits_the_test_batches(gem, monkeypatch):
    """The equality above is not vacuous: the jagged batch does run as several buckets of other widths."""
    model, schema = gem
    seen = []
    real = gem_module.length_buckets

    def spy(lengths, k):  # noqa: ANN001, ANN202
        seen.append(real(lengths, k))
        return seen[-1]

    monkeypatch.setattr(gem_module, "length_buckets", spy)
    model.cfg.seq_buckets = 4
    try:
        model(BATCHES["jagged"](schema))
    finally:
        model.cfg.seq_buckets = 1
    assert len(seen) == 1 and len(seen[0]) == 4 and len({w for _, w in seen[0]}) == 4


@pytest.mark.parametrize("fault", ["misorder", "drop"])
def test_a_misordered_or_dropped_row_fails_the_equality(gem, monkeypatch, fault):
    model, schema = gem

    def broken(parts, rows):  # noqa: ANN001, ANN202
        out = restore_rows(parts, rows)
        if fault == "misorder":  # two rows swapped
            return out[torch.tensor([1, 0, *range(2, out.shape[0])])]
        return torch.cat([out[:3], torch.zeros_like(out[3:4]), out[4:]])  # row 3's output lost

    monkeypatch.setattr(gem_module, "restore_rows", broken)
    with pytest.raises(AssertionError):
        _assert_same(model, BATCHES["jagged"](schema), 4)


def test_static_shapes_run_the_whole_batch(gem, monkeypatch):
    """Under embedding.pad_to_max_len (what train.compile sets) bucketing would bring back varying shapes."""
    model, schema = gem
    batch = BATCHES["jagged"](schema)

    def refuse(*a, **k):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("length_buckets called under pad_to_max_len")

    model.embedding.cfg.pad_to_max_len = True
    use_kernel(model, "pytorch")
    model.cfg.seq_buckets = 4
    rewind = _rewinder(model)
    try:
        with monkeypatch.context() as m:
            m.setattr(gem_module, "length_buckets", refuse)
            bucketed = model(batch).logits
            flops = model.batch_flops(batch)
            # the count follows: every row at max_len, as FlopCounterMode sees it
            assert flops == pytest.approx(measured_flops(model, batch) * batch.batch_size, rel=1e-9)
        model.cfg.seq_buckets = 1
        rewind()
        torch.testing.assert_close(bucketed, model(batch).logits, atol=0, rtol=0)
        assert model.batch_flops(batch) == flops
    finally:
        model.embedding.cfg.pad_to_max_len = False
        model.cfg.seq_buckets = 1
        use_kernel(model, model.cfg.kernel)


# ------------------------------------------------------------------ FLOPs follow the executed widths
@pytest.mark.parametrize("k", [1, 3, 4])
def test_batch_flops_equal_the_flop_counter_of_the_bucketed_pass(gem, k):
    """The reference kernels run every slot they are given (the fused chunk path skips empty chunks), so
    FlopCounterMode counts exactly the padded work, bucket by bucket."""
    model, schema = gem
    batch = BATCHES["jagged"](schema)
    use_kernel(model, "pytorch")
    model.cfg.seq_buckets = k
    try:
        counted = measured_flops(model, batch) * batch.batch_size
        assert model.batch_flops(batch) == pytest.approx(counted, rel=1e-9)
    finally:
        model.cfg.seq_buckets = 1
        use_kernel(model, model.cfg.kernel)


def test_padded_flops_are_rows_times_flops_at_each_bucket_width():
    cfg, schema = _small_model_cfg()
    torch.manual_seed(0)
    model = build_model(schema, cfg)
    batches = [BATCHES["jagged"](schema), BATCHES["short_with_empty_rows"](schema)]
    per_k = {}
    for k in (1, 4):
        model.cfg.seq_buckets = k
        expected = 0
        for b in batches:
            lengths = b.sequences["hist"].lengths
            # per row: embedding (its real events) + head; per bucket: rows x sequence path at the width
            expected += sum(model_flops(model, n) - model.sequence_path_flops(n) for n in lengths.tolist())
            expected += sum(r.numel() * model.sequence_path_flops(max(w, 1))
                            for r, w in length_buckets(lengths, k))
        per_k[k] = padded_flops_per_example(model, batches)
        assert per_k[k] == pytest.approx(expected / 48)
        assert per_k[k] >= executed_flops_per_example(model, batches), "padding is never negative work"
    model.cfg.seq_buckets = 1
    assert per_k[4] < per_k[1], "buckets cut padded work on jagged batches"
    dcn = build_model(schema, ModelConfig(name="dcnv2"))
    assert padded_flops_per_example(dcn, batches) == executed_flops_per_example(dcn, batches)


# ------------------------------------------------------------------ config
def test_seq_buckets_is_a_config_key_that_round_trips(tmp_path: Path):
    cfg = load_config(RunConfig, SMALL, ["model.gem.seq_buckets=3"])
    assert cfg.model.gem.seq_buckets == 3
    save_config(cfg, tmp_path / "c.toml")
    assert load_config(RunConfig, tmp_path / "c.toml") == cfg
    assert "seq_buckets = 3" in (tmp_path / "c.toml").read_text()
    with pytest.raises(ConfigError, match="model.gem.seq_buckets: expected an integer"):
        load_config(RunConfig, SMALL, ["model.gem.seq_buckets=2.5"])


@pytest.mark.parametrize("bad", [0, -2])
def test_a_bad_bucket_count_is_a_config_error_naming_the_key(bad):
    cfg, schema = _small_model_cfg()
    cfg.gem.seq_buckets = bad
    with pytest.raises(ConfigError, match=rf"^model\.gem\.seq_buckets: must be >= 1 \(got {bad}\)"):
        build_model(schema, cfg)


def test_a_bad_bucket_count_from_the_command_line_is_one_line(capsys, tmp_path: Path):
    data = tmp_path / "D"
    assert main(["simulate", "--out", str(data), "--rows", "400", "--days", "2", "--surfaces", "2",
                 "--users", "50", "--ads", "40", "--advertisers", "10", "--topics", "5", "--seq-mean", "3",
                 "--seq-max", "6", "--recent-k", "2", "--emb-dim", "4", "--chunk-rows", "200",
                 "--quiet"]) == 0
    capsys.readouterr()
    rc = main(["train", "--config", str(ROOT / "configs" / "tiny.toml"), "--data", str(data),
               "--out", str(tmp_path / "r"), "train.steps=1", "train.progress=false",
               "model.gem.seq_buckets=0"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 2
    assert len(err) == 1 and err[0].startswith("opengem train: error: "), err
    assert "model.gem.seq_buckets: must be >= 1 (got 0)" in err[0]


def test_bench_train_reports_padded_flops_beside_real_and_full(tmp_path: Path, capsys):
    """``opengem bench train``: the headline stays on real lengths; the padded count (what a bucketed
    model runs) sits between that and the full-length one, with its own MFU columns."""
    rc = main(["bench", "train", "--config", str(ROOT / "configs" / "tiny.toml"), "--json",
               "--out", str(tmp_path), "--steps", "1", "--warmup", "0", "--windows", "1", "--pool", "3",
               "--peak-n", "256", "data.batch_size=64", "model.gem.seq_buckets=2", "train.threads=1"])
    assert rc == 0
    r = json.loads(capsys.readouterr().out)
    real, padded, full = (r[k] for k in ("executed_fwd_flops_per_example", "padded_fwd_flops_per_example",
                                          "fwd_flops_per_example"))
    assert real < padded < full
    assert r["flops_per_example"] == pytest.approx(3 * real), "the headline counts no padding"
    assert r["mfu_padded"] == pytest.approx(r["examples_per_s"] * 3 * padded / r["peak_flops"])
    assert r["mfu_cpu_padded"] == pytest.approx(r["examples_per_cpu_s"] * 3 * padded / r["peak_flops_cpu"])
    assert r["mfu"] < r["mfu_padded"] < r["mfu_full"]
    assert "padded_flops_per_example" in r["conventions"]


# ------------------------------------------------------------------ only the most recent events
@pytest.mark.parametrize("k", [1, 3])
def test_seq_recent_is_gem_on_the_cut_batch_and_counts_what_runs(gem, k):
    """``embedding.seq_recent = r``: the same logits as the same weights fed each history's last r events,
    bucketed or not, and batch_flops equal to FlopCounterMode's count of that pass."""
    model, schema = gem
    batch = BATCHES["jagged"](schema)
    r = 4
    cut = dataclasses.replace(batch, sequences={g: sb.recent(r) for g, sb in batch.sequences.items()})
    assert any(int(sb.lengths.max()) > r for sb in batch.sequences.values())
    use_kernel(model, "pytorch")
    model.cfg.seq_buckets = k
    rewind = _rewinder(model)
    try:
        rewind()
        ref = model(cut).logits.detach()
        model.embedding.cfg.seq_recent = r
        rewind()
        torch.testing.assert_close(model(batch).logits.detach(), ref, atol=ATOL, rtol=RTOL)
        counted = measured_flops(model, batch) * batch.batch_size
        assert model.batch_flops(batch) == pytest.approx(counted, rel=1e-9)
        assert model.batch_flops(batch) == model.batch_flops(cut)
    finally:
        rewind()
        model.embedding.cfg.seq_recent = 0
        model.cfg.seq_buckets = 1
        use_kernel(model, model.cfg.kernel)


@pytest.mark.parametrize("recent, levels", [(0, 1), (32, 1), (8, 0)])
def test_pyramid_is_planned_on_the_events_gem_reads(recent, levels):
    """With ``embedding.seq_recent`` the pyramid is planned on the cut length: a level that would not shrink
    it is dropped, as on any short sequence (planned on the schema's 64, a level made 8 events 13+ tokens)."""
    cfg = load_config(RunConfig, ROOT / "configs" / "small-d32.toml",
                      ["model.embedding.d=8", f"model.embedding.seq_recent={recent}"])
    model = build_model(sim_schema(from_dict(SimConfig, cfg.data.sim)), cfg.model)
    width = sum(model.embedding.seq_len(g) for g in model.groups)
    assert width == (recent or 64)
    assert len(model.encoder.levels) == levels
    assert model.encoder.out_len(width) <= width
