"""Export (issue 16 part A): plain lookups equal TorchRec's, torch.export and AOTI equal eager within 1e-5
for any batch size, the artifact's digest and weights-only reading, and ``opengem export`` on a run."""

from __future__ import annotations

import json
import shutil
import tomllib
import warnings
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
import torch.utils._pytree as pytree

from opengem.cli import main
from opengem.config import from_dict
from opengem.data.commit import OutputExistsError
from opengem.data.dataset import Dataset
from opengem.data.loader import ParquetLoader
from opengem.data.random_batch import random_batch
from opengem.data.sim_config import SimConfig, sim_schema
from opengem.data.simulate import simulate
from opengem.model.registry import MODEL_NAMES, ModelConfig, build_model
from opengem.serve.artifact import MANIFEST, WEIGHTS, read_artifact, sha256_file
from opengem.serve.errors import ArtifactError
from opengem.serve.export import (
    export_model,
    export_program,
    flat_inputs,
    flat_tensor_chunks,
    model_from_artifact,
    serving_module,
)
from opengem.serve.predictor import Predictor
from opengem.train.config import load_run_config
from opengem.train.trainer import train
from opengem.transfer.vertical import VerticalModel, VMSchemaConfig, derive_vm_schema

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.toml"
TOL = 1e-5

warnings.filterwarnings("ignore", category=FutureWarning)


def tiny_schema():
    return sim_schema(SimConfig.from_dict(tomllib.loads(TINY.read_text())["data"]["sim"]))


def tiny_model(name: str):
    cfg = load_run_config(TINY, [f"model.name={name}"]).model
    schema = tiny_schema()
    torch.manual_seed(0)
    return build_model(schema, cfg).eval(), schema, cfg


def transfer_toml() -> dict:
    return tomllib.loads((ROOT / "configs" / "transfer.toml").read_text())


def transfer_vm():
    """The vertical model of configs/transfer.toml (DLRM on the derived VM schema) with its aux head."""
    t = transfer_toml()
    fm = sim_schema(SimConfig.from_dict(t["data"]["sim"]))
    schema = derive_vm_schema(fm, from_dict(VMSchemaConfig, t["vm"]["schema"]), name="vm")
    cfg = from_dict(ModelConfig, t["vm"]["model"])
    torch.manual_seed(0)
    return VerticalModel(schema, cfg, aux_head=True).eval(), schema, cfg


@pytest.fixture(scope="module")
def transfer_rows(tmp_path_factory):
    """A real batch of the transfer VM: configs/transfer.toml's simulator (fewer rows) read by the loader
    with the VM schema (ids hashed into the capped tables, histories cut to 4)."""
    sim = {**transfer_toml()["data"]["sim"], "rows": 1500, "days": 2, "chunk_rows": 1500}
    out = tmp_path_factory.mktemp("tsim") / "data"
    simulate(SimConfig.from_dict(sim), out)
    _, schema, _ = transfer_vm()
    batch = next(iter(ParquetLoader(Dataset(out).files("@all"), schema, 96, drop_last=False)))
    assert batch.sequences["hist"].lengths.max() == 4  # cut to the VM's max_len, as in training
    return batch


def with_empty_rows(schema, n: int, seed: int):
    """A random batch whose rows 1 and 2 (when there) have empty histories."""
    b = random_batch(schema, n, seed=seed)
    for g in schema.sequences:
        sb = b.sequences[g.name]
        if n > 2:
            keep = torch.ones(int(sb.lengths.sum()), dtype=torch.bool)
            off = sb.offsets
            for r in (1, 2):
                keep[int(off[r]):int(off[r + 1])] = False
            sb.ids = {k: v[keep] for k, v in sb.ids.items()}
            sb.dense = {k: v[keep] for k, v in sb.dense.items()}
            sb.lengths = sb.lengths.clone()
            sb.lengths[1:3] = 0
    return b


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_plain_lookups_equal_torchrec_for_every_model(name):
    model, schema, _ = tiny_model(name)
    serving = serving_module(model)
    b = with_empty_rows(schema, 9, seed=3)
    with torch.no_grad():
        want = model(b).logits
        got = serving(*flat_inputs(b, schema))
    assert got.shape == want.shape
    assert (got - want).abs().max().item() <= TOL


@pytest.fixture(scope="module")
def vm_program():
    vm, schema, cfg = transfer_vm()
    return vm, schema, cfg, export_program(vm.base, schema)


@pytest.mark.parametrize("batch_size", [1, 7, 64])
def test_exported_vm_equals_eager_for_any_batch_size(vm_program, batch_size):
    vm, schema, _, program = vm_program
    b = with_empty_rows(schema, batch_size, seed=batch_size)
    with torch.no_grad():
        want = vm(b).logits
    got = program.module()(*flat_inputs(b, schema))
    assert (got - want).abs().max().item() <= TOL


def test_exported_vm_equals_eager_on_real_rows(vm_program, transfer_rows):
    vm, schema, _, program = vm_program
    with torch.no_grad():
        want = vm(transfer_rows).logits
    assert (program.module()(*flat_inputs(transfer_rows, schema)) - want).abs().max().item() <= TOL


@pytest.fixture(scope="module")
def aoti_artifact(tmp_path_factory):
    """The fast suite's one AOTI compile: the transfer VM, cached for the module."""
    vm, schema, cfg = transfer_vm()
    out = tmp_path_factory.mktemp("aoti") / "art"
    res = export_model(vm, schema, cfg, out, backend="aoti", version="v0007", trained_through_ts=123)
    return vm, schema, out, res


def test_aoti_package_equals_eager_and_loads_as_predictor(aoti_artifact, transfer_rows):
    vm, schema, out, res = aoti_artifact
    assert res["backends"] == ["eager", "export", "aoti"]
    p = Predictor.load(out)  # auto: the fastest backend the artifact has
    assert p.backend == "aoti" and p.version == "v0007" and p.trained_through_ts == 123
    for n in (1, 7, 64):
        b = with_empty_rows(schema, n, seed=10 + n)
        with torch.no_grad():
            want = vm(b).logits
        assert (p.logits(b) - want).abs().max().item() <= TOL
    with torch.no_grad():
        want = vm(transfer_rows).logits
    assert (p.logits(transfer_rows) - want).abs().max().item() <= TOL
    # a merged batch larger than the AOTI slice size runs in slices: the same scores, in the same order
    sliced = Predictor.load(out, aoti_chunk_rows=3)
    for n in (7, 64):
        b = with_empty_rows(schema, n, seed=20 + n)
        assert (sliced.logits(b) - p.logits(b)).abs().max().item() <= TOL


def test_the_program_for_inductor_takes_the_fused_interaction_with_the_same_values(vm_program, transfer_rows):
    """The AOTI package is compiled from a program traced for Inductor (the VM's dot interaction as one
    fusable loop, ops/fused/fused_dot_interaction.py); program.pt2, run as it is, keeps bmm."""
    vm, schema, _, program = vm_program
    for_inductor = export_program(vm, schema, for_inductor=True)

    def products(p):  # the interaction's bmm (the reference) and the head's
        return sum("bmm" in str(node.target) for node in p.graph.nodes)

    assert products(program) == products(for_inductor) + 1
    want = program.module()(*flat_inputs(transfer_rows, schema))
    assert (for_inductor.module()(*flat_inputs(transfer_rows, schema)) - want).abs().max().item() <= TOL


def test_row_chunks_are_the_batches_those_rows_make_alone(transfer_rows):
    """``flat_tensor_chunks`` slices every jagged feature by its rows' offsets: each slice scored alone
    equals those rows of the whole batch (rows with no events and a last short slice included)."""
    vm, schema, _ = transfer_vm()
    program = export_program(vm, schema).module()
    spec = pytree.tree_structure(flat_inputs(transfer_rows, schema))
    for b in (with_empty_rows(schema, 11, seed=3), transfer_rows):
        n = b.surface.shape[0]
        with torch.no_grad():
            whole = program(*flat_inputs(b, schema))
            for rows in (1, 4, n - 1, n, n + 5, 0):
                chunks = flat_tensor_chunks(b, schema, rows)
                assert len(chunks) == (-(-n // rows) if 0 < rows < n else 1)
                got = torch.cat([program(*pytree.tree_unflatten(c, spec)) for c in chunks])
                assert got.shape == whole.shape
                assert (got - whole).abs().max().item() <= TOL


@pytest.mark.slow
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_every_model_exports_with_dynamic_batch(name):
    model, schema, _ = tiny_model(name)
    program = export_program(model, schema)
    for n in (1, 7, 64):
        b = with_empty_rows(schema, n, seed=n)
        with torch.no_grad():
            want = model(b).logits
        assert (program.module()(*flat_inputs(b, schema)) - want).abs().max().item() <= TOL


@pytest.mark.slow
def test_gem_aoti_equals_eager(tmp_path):
    model, schema, cfg = tiny_model("gem")
    export_model(model, schema, cfg, tmp_path / "gem", backend="aoti")
    p = Predictor.load(tmp_path / "gem", backend="aoti")
    for n in (1, 7, 64):
        b = with_empty_rows(schema, n, seed=n)
        with torch.no_grad():
            want = model(b).logits
        assert (p.logits(b) - want).abs().max().item() <= TOL


# --------------------------------------------------------------------------- the artifact
@pytest.fixture
def eager_artifact(tmp_path):
    vm, schema, cfg = transfer_vm()
    out = tmp_path / "art"
    export_model(vm, schema, cfg, out, backend="eager", version="v0001", trained_through_ts=5)
    return vm, out


def test_artifact_round_trips_weights_config_and_schema(eager_artifact):
    vm, out = eager_artifact
    art = read_artifact(out)
    manifest = json.loads((out / MANIFEST).read_text())
    assert set(manifest["files"]) == {"model.toml", "schema.toml", "encoding.json", "weights.pt"}
    assert all(manifest["files"][f] == sha256_file(out / f) for f in manifest["files"])
    model, schema, cfg = model_from_artifact(art)
    assert cfg.name == "dlrm" and schema.name == "vm"
    assert not any(k.startswith("aux_head") for k in art.weights)  # the aux head is not served
    for k, v in vm.base.state_dict().items():
        assert torch.equal(model.state_dict()[k], v)


def test_a_changed_file_is_refused(eager_artifact):
    _, out = eager_artifact
    data = bytearray((out / WEIGHTS).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (out / WEIGHTS).write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="sha256 differs"):
        Predictor.load(out)


def test_weights_that_are_not_plain_tensors_are_never_unpickled(eager_artifact):
    """Even with a matching digest (the manifest rewritten too), a pickled object is refused."""
    _, out = eager_artifact

    class Boom:
        def __reduce__(self):
            return (exec, ("raise SystemExit('unpickled!')",))

    torch.save({"x": Boom()}, out / WEIGHTS)
    m = json.loads((out / MANIFEST).read_text())
    m["files"][WEIGHTS] = sha256_file(out / WEIGHTS)
    (out / MANIFEST).write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match="not a plain dict of tensors"):
        Predictor.load(out)


@pytest.mark.parametrize("manifest", [b"{\xff not json", b"[1, 2]", b'{"format": "something-else"}'])
def test_a_damaged_manifest_is_named_not_taken_for_a_run_folder(eager_artifact, manifest):
    """An export folder whose manifest.json is damaged used to fall through to the run-folder path and
    say "no config.toml (is it a training run folder?)"."""
    _, out = eager_artifact
    (out / MANIFEST).write_bytes(manifest)
    with pytest.raises(ArtifactError, match="manifest.json"):
        Predictor.load(out)
    from opengem.serve.serve_cli import PredictorLoader

    with pytest.raises(ArtifactError, match="manifest.json"):  # not compiled as if it were a run
        PredictorLoader(64)(out, "aoti")


def test_a_manifest_naming_a_foreign_file_is_refused(eager_artifact):
    _, out = eager_artifact
    m = json.loads((out / MANIFEST).read_text())
    m["files"]["evil.so"] = "0" * 64
    (out / MANIFEST).write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match="never holds"):
        read_artifact(out)


def test_export_refuses_to_overwrite_and_a_non_artifact_is_not_replaced(eager_artifact, tmp_path):
    vm, out = eager_artifact
    with pytest.raises(OutputExistsError, match="exists") as e:
        export_model(vm, vm.schema, ModelConfig(name="dlrm"), out, backend="eager")
    assert e.value.exit_code == 2  # a usage error, as every command's existing --out
    other = tmp_path / "notmine"
    other.mkdir()
    (other / "precious.txt").write_text("keep")
    with pytest.raises(OutputExistsError, match="not an export artifact"):
        export_model(vm, vm.schema, ModelConfig(name="dlrm"), other, backend="eager", force=True)
    assert (other / "precious.txt").exists()


# --------------------------------------------------------------------------- opengem export on a run
@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("exprun")
    train(load_run_config(TINY, ["train.progress=false", "train.steps=4"]), out)
    return out


def test_cli_exports_a_run_with_its_version_and_contract(run_dir, tmp_path, capsys):
    out = tmp_path / "gem"
    assert main(["export", str(run_dir), "--out", str(out), "--backend", "eager"]) == 0
    assert "exported" in capsys.readouterr().out
    m = json.loads((out / MANIFEST).read_text())
    assert m["source"]["step"] == 4 and m["version"].endswith("@step4") and m["backends"] == ["eager"]
    ds = Dataset(run_dir / "data")
    ts = [t for f in ds.files("@train") for t in pq.read_table(f, columns=["ts"]).column(0).to_pylist()]
    assert m["trained_through_ts"] == max(ts)
    art = read_artifact(out)
    assert tomllib.loads(art.schema) == tomllib.loads(ds.schema.to_toml())
    # the artifact's model is the run's: it scores real rows exactly as evaluate's model does
    batch = next(iter(ParquetLoader(ds.files("@valid"), ds.schema, 64, drop_last=False)))
    direct = Predictor.load(run_dir)  # a run folder, exported in memory
    assert torch.equal(Predictor.load(out).logits(batch), direct.logits(batch))
    # --run names the run as evaluate, calibrate and predict take it
    assert main(["export", "--run", str(run_dir), "--out", str(tmp_path / "flag"), "--backend", "eager"]) == 0
    assert json.loads((tmp_path / "flag" / MANIFEST).read_text())["version"] == m["version"]


@pytest.mark.slow
def test_exported_gem_run_equals_eager_on_real_rows(run_dir, tmp_path):
    out = tmp_path / "gem"
    assert main(["export", str(run_dir), "--out", str(out), "--backend", "export"]) == 0
    ds = Dataset(run_dir / "data")
    batch = next(iter(ParquetLoader(ds.files("@valid"), ds.schema, 64, drop_last=False)))
    eager, exported = Predictor.load(out, backend="eager"), Predictor.load(out, backend="export")
    assert (exported.logits(batch) - eager.logits(batch)).abs().max().item() <= TOL
    on_the_fly = Predictor.load(run_dir, backend="export")  # a run exported into a private temp folder
    assert on_the_fly.backend == "export"
    assert (on_the_fly.logits(batch) - eager.logits(batch)).abs().max().item() <= TOL


def test_cli_errors_are_one_line(run_dir, tmp_path, capsys):
    assert main(["export", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("opengem export: error:")
    assert main(["export", f"{run_dir}@3", "--out", str(tmp_path / "o")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "versions" in err[0]
    for both_or_none in ([str(run_dir), "--run", str(run_dir)], []):
        assert main(["export", *both_or_none, "--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err.strip()
        assert err == "opengem export: error: give the run once, as RUN or --run RUN"


def test_a_published_version_loads_and_exports_with_its_manifest(run_dir, tmp_path):
    """The online trainer's layout: RUN/versions/vNNNN is the checkpoint, RUN/config.toml two levels up."""
    online = tmp_path / "online"
    v = online / "versions" / "v0003"
    shutil.copytree(run_dir / "checkpoints" / "final", v)
    shutil.copy(run_dir / "config.toml", online / "config.toml")
    (v / "manifest.json").write_text(json.dumps({"version": 3, "trained_through_ts": 77}))
    p = Predictor.load(v)  # what part B's hot swap calls on each new version folder
    assert (p.version, p.trained_through_ts, p.backend) == ("v0003", 77, "eager")
    assert main(["export", f"{online}@v0003", "--out", str(tmp_path / "a"), "--backend", "eager"]) == 0
    art = read_artifact(tmp_path / "a")
    assert (art.version, art.trained_through_ts) == ("v0003", 77)


def test_a_corrupt_manifest_of_another_version_does_not_block_this_one(run_dir, tmp_path):
    """Hot swap loads one version at a time: v0002's damaged manifest refuses v0002 alone (naming its
    manifest), and v0003 still loads and exports."""
    online = tmp_path / "online"
    for n in (2, 3):
        shutil.copytree(run_dir / "checkpoints" / "final", online / "versions" / f"v{n:04d}")
    shutil.copy(run_dir / "config.toml", online / "config.toml")
    bad = online / "versions" / "v0002" / "manifest.json"
    bad.write_text("{not json")
    (online / "versions" / "v0003" / "manifest.json").write_text(
        json.dumps({"version": 3, "trained_through_ts": 77}))
    p = Predictor.load(online / "versions" / "v0003")
    assert (p.version, p.trained_through_ts) == ("v0003", 77)
    with pytest.raises(ArtifactError, match="unreadable manifest") as e:
        Predictor.load(online / "versions" / "v0002")
    assert str(bad) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("name", ["dcnv2", "gem"])
def test_a_head_with_a_context_term_exports_equal_to_eager(name):
    """model.head.context reads the batch's clock columns inside forward: the exported program takes them
    from its dense input like any other dense feature."""
    cfg = load_run_config(TINY, [f"model.name={name}", "model.head.context=time"]).model
    schema = tiny_schema()
    torch.manual_seed(0)
    model = build_model(schema, cfg).eval()
    head = next(m for m in model.modules() if hasattr(m, "context_weight"))
    assert head.context_dim == len(schema.time_feature_names) > 0
    with torch.no_grad():
        head.context_weight.normal_()
    program = export_program(model, schema)
    b = with_empty_rows(schema, 7, seed=3)
    with torch.no_grad():
        want = model(b).logits
    assert (program.module()(*flat_inputs(b, schema)) - want).abs().max().item() <= TOL


@pytest.mark.parametrize("name", ["dcnv2", "gem"])
def test_a_model_reading_only_recent_events_exports_equal_to_eager(name):
    """model.embedding.seq_recent cuts the jagged batch in eager forward; the exported program pads to the
    schema's max_len (static shapes) and cuts after padding: the same scores."""
    cfg = load_run_config(TINY, [f"model.name={name}", "model.embedding.seq_recent=3"]).model
    schema = tiny_schema()
    torch.manual_seed(0)
    model = build_model(schema, cfg).eval()
    program = export_program(model, schema)
    b = with_empty_rows(schema, 9, seed=4)
    assert int(b.sequences["hist"].lengths.max()) > 3
    with torch.no_grad():
        want = model(b).logits
    assert (program.module()(*flat_inputs(b, schema)) - want).abs().max().item() <= TOL
