"""No-leakage version selection, history aggregation without the current example, VM schemas."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from opengem.data.schema import FeatureSchema
from opengem.transfer.knowledge import KnowledgeTable
from opengem.transfer.representation import embedding_lookup, history_mean
from opengem.transfer.versions import VersionError, list_versions, parse_fm_spec, select_versions
from opengem.transfer.vertical import VMSchemaConfig, derive_vm_schema


def test_select_versions_never_uses_a_version_trained_on_or_after_the_example():
    tt = np.array([100, 200, 300])
    ts = np.array([50, 100, 101, 200, 250, 300, 301, 10_000])
    idx = select_versions(tt, ts)
    assert idx.tolist() == [-1, -1, 0, 0, 1, 1, 2, 2]
    ok = idx >= 0
    assert np.all(tt[idx[ok]] < ts[ok])  # strictly older: the rule itself


def test_select_versions_lag_steps_back():
    tt = np.array([100, 200, 300])
    ts = np.array([150, 250, 350])
    assert select_versions(tt, ts, lag=1).tolist() == [-1, 0, 1]
    assert select_versions(tt, ts, lag=2).tolist() == [-1, -1, 0]
    with pytest.raises(VersionError):
        select_versions(tt, ts, lag=-1)
    with pytest.raises(VersionError, match="sorted"):
        select_versions(np.array([3, 1]), ts)


def test_list_versions_reads_manifests(tmp_path):
    for v, tt in ((2, 500), (1, 100)):
        d = tmp_path / "versions" / f"v{v:04d}"
        d.mkdir(parents=True)
        (d / "manifest.json").write_text(json.dumps({"version": v, "trained_through": tt}))
    (tmp_path / "versions" / "v0003").mkdir()  # being written: no manifest yet
    vs = list_versions(tmp_path)
    assert [v.version for v in vs] == [1, 2] and vs[1].trained_through_ts == 500
    assert parse_fm_spec(f"{tmp_path}@v0002")[1] == 2
    with pytest.raises(VersionError, match="no versions"):
        list_versions(tmp_path / "nope")


def test_history_mean_excludes_the_current_example():
    user = np.array([1, 1, 2, 1, 2])
    ts = np.array([10, 20, 15, 20, 30])
    eid = np.array([0, 1, 2, 3, 4])
    emb = np.array([[1.0], [3.0], [5.0], [100.0], [7.0]])
    got = history_mean(user, ts, eid, emb)[:, 0]
    # user 1: rows 0 (ts 10), 1 (ts 20, id 1), 3 (ts 20, id 3); user 2: rows 2, 4
    assert got.tolist() == [0.0, 1.0, 0.0, 2.0, 5.0]


def test_embeddings_standardised_per_version():
    side = pa.table(
        {
            "example_id": [3, 1, 2, 0],
            "fm_version": pa.array([1, 1, 2, -1], pa.int32()),
            "fm_user": [[10.0, 0.0], [20.0, 2.0], [5.0, 5.0], []],
        }
    )
    lut = embedding_lookup(side, ["user"])
    assert lut["example_id"].tolist() == [0, 1, 2, 3]
    m = lut["user"]
    assert m[0].tolist() == [0.0, 0.0]  # no version -> zeros
    assert m[1, 0] == pytest.approx(1.0, abs=1e-4) and m[3, 0] == pytest.approx(-1.0, abs=1e-4)


def test_knowledge_table_bias_and_lookup():
    side = pa.table(
        {
            "example_id": [5, 7],
            "ts": [100, 200],
            "surface": pa.array([0, 1], pa.int32()),
            "fm_trained_through": [50, -1],
            "fm_logit_click": pa.array([0.5, float("nan")], pa.float32()),
        }
    )
    k = KnowledgeTable.from_side_table(side, ["click"], surface_bias=[1.0, 2.0], age_unit=50)
    lg, ok = k.lookup(np.array([7, 5, 9]), np.array([1, 0, 0]))
    assert ok.tolist() == [[False], [True], [False]]
    assert lg[1, 0] == pytest.approx(1.5)
    assert k.age.tolist() == [1.0, 0.0]


def test_derive_vm_schema_narrows_the_fm_schema():
    fm = FeatureSchema.load("configs/schemas/tiny.toml")
    cfg = VMSchemaConfig(
        sparse=fm.sparse_names[:2], dense=fm.dense_names[:1], max_len=2, vocab_cap=5, tasks=fm.task_names[:1]
    )
    vm = derive_vm_schema(fm, cfg, {"user": 3})
    assert vm.sparse_names == fm.sparse_names[:2]
    assert all(f.vocab <= 5 and f.on_oov == "hash" for f in vm.sparse)
    assert all(g.max_len <= 2 and g.on_overflow == "truncate" for g in vm.sequences)
    assert vm.dense_names == [fm.dense_names[0], "fm_user_0", "fm_user_1", "fm_user_2"]
    assert vm.task_names == fm.task_names[:1] and vm.surfaces == fm.surfaces
    with pytest.raises(ValueError, match="vm.schema.sparse"):
        derive_vm_schema(fm, VMSchemaConfig(sparse=["nope"]))
