"""Compile of the dense part: the right modules, the same numbers as eager, and a persistent cache that a
second process hits (checked with Inductor's cache counters, never with timings)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from opengem.data.random_batch import random_batch
from opengem.data.schema import FeatureSchema
from opengem.model.registry import build_model
from opengem.train.compile import compile_targets, configure_compile_cache, default_cache_dir
from opengem.train.config import load_run_config
from opengem.train.optim import embedding_modules

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.toml"
SCHEMA = FeatureSchema.load(ROOT / "configs" / "schemas" / "tiny.toml")


def _model(name="gem"):
    cfg = load_run_config(TINY, [f'model.name="{name}"', "model.embedding.pad_to_max_len=true"])
    torch.manual_seed(0)
    return build_model(SCHEMA, cfg.model)


@pytest.mark.parametrize("name", ["gem", "wukong", "dlrm", "dcnv2"])
def test_targets_are_dense_blocks_not_embeddings(name):
    m = _model(name)
    targets = compile_targets(m)
    assert targets, name
    for tname, mod in targets:
        assert not embedding_modules(mod), tname
    assert "embedding" not in [n for n, _ in targets]
    covered = {id(p) for _, mod in targets for p in mod.parameters()}
    if name == "gem":
        assert {"interformer", "head"} <= {n for n, _ in targets}
        assert all(id(p) in covered for p in m.interformer.parameters())


def test_cache_dir_configured(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "opengem" / "inductor"
    path = configure_compile_cache(tmp_path / "cc")
    assert path.is_dir() and os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(path)
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    assert cache_dir() == str(path)


def test_compiled_eager_backend_matches_and_keeps_state_names():
    m = _model()
    names_before = list(m.state_dict())
    batch = random_batch(SCHEMA, 16, seed=3)
    ref = m(batch).logits
    from opengem.train.compile import apply_compile

    assert set(apply_compile(m, backend="eager")) >= {"interformer", "head"}
    assert list(m.state_dict()) == names_before  # checkpoints interchangeable with eager
    torch.testing.assert_close(m(batch).logits, ref)


_CHILD = r"""
import json, sys, torch
from opengem.train.compile import configure_compile_cache, apply_compile, compile_counters
configure_compile_cache(sys.argv[1])
torch.set_num_threads(1)
from opengem.data.random_batch import random_batch
from opengem.data.schema import FeatureSchema
from opengem.model.registry import build_model
from opengem.train.config import load_run_config
cfg = load_run_config(sys.argv[2], ["model.embedding.pad_to_max_len=true"])
schema = FeatureSchema.load(sys.argv[3])
torch.manual_seed(0)
m = build_model(schema, cfg.model)
b = random_batch(schema, 16, seed=1)
ref = m(b).logits
apply_compile(m)
out = m(b).logits
out.sum().backward()
print(json.dumps({"maxdiff": (out - ref).abs().max().item(), **compile_counters()}))
"""


@pytest.mark.slow
def test_compile_matches_eager_and_second_process_hits_cache(tmp_path):
    """Cold compile (minutes on a loaded 2-core CPU), then the same in a new process with the same folder."""
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    args = [sys.executable, str(script), str(tmp_path / "cache"), str(TINY),
            str(ROOT / "configs" / "schemas" / "tiny.toml")]

    def run():
        r = subprocess.run(args, capture_output=True, text=True, timeout=1200)
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(r.stdout.strip().splitlines()[-1])

    cold = run()
    assert cold["maxdiff"] < 1e-4
    assert cold["fxgraph_cache_miss"] > 0 and cold["fxgraph_cache_hit"] == 0
    assert any((tmp_path / "cache").rglob("*.py"))  # generated kernels were written to our folder
    warm = run()
    assert warm["maxdiff"] < 1e-4
    assert warm["fxgraph_cache_hit"] >= cold["fxgraph_cache_miss"] and warm["fxgraph_cache_miss"] == 0
