"""``opengem distill``: a vertical model from an existing FM run, every transfer method a config switch.

The FM runs are made by ``opengem train`` (batch, and ``--online`` with published versions) on a tiny
simulated dataset of 4 days; the VM recipe is configs/distill-example.toml with switches overridden. Each
switch is checked by what it changes in the trained run, not by an exit code.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from tests.cli_helpers import one_error_line, run_cli

from opengem.cli import main
from opengem.config import load_config, save_config
from opengem.data.dataset import Dataset
from opengem.data.sim_config import SimConfig
from opengem.data.simulate import simulate
from opengem.train.config import load_run_config
from opengem.train.evaluate import open_run
from opengem.transfer.distill_config import DistillConfig, load_distill_config
from opengem.transfer.generate import _load_version
from opengem.transfer.sharing import _plain_state, _suffix
from opengem.transfer.versions import list_versions

RECIPE = "configs/distill-example.toml"
# all switches off: the baseline VM; tests switch on what they check
OFF = ["distill.kd.weight=0.0", "distill.aux_head=false", "distill.student_adapter.enabled=false",
       "distill.fm_embeddings=[]", 'distill.param_sharing="none"']
FAST = ["train.steps=4", "train.progress=false", "train.log_every=2"]
KD = ["distill.kd.weight=1.0", "distill.kd.temperature=2.0"]


@pytest.fixture(scope="module")
def fm_batch(tmp_path_factory) -> tuple[Path, Path]:
    """An FM from `opengem train` on days 0-1 of a 4-day tiny stream: (run, dataset)."""
    root = tmp_path_factory.mktemp("fm")
    run = root / "fm"
    assert main(["train", "--config", "configs/tiny.toml", "--out", str(run), "data.sim.days=4",
                 'data.train="day=000,day=001"', 'data.eval="day=002"', "train.progress=false",
                 "train.final_eval=false"]) == 0
    return run, run / "data"


@pytest.fixture(scope="module")
def fm_online(fm_batch, tmp_path_factory) -> Path:
    """An FM from `opengem train --online` on the same data: versions v1..v3 after days 0..2."""
    run = tmp_path_factory.mktemp("fmo") / "fm"
    assert main(["train", "--online", "--config", "configs/tiny.toml", "--out", str(run),
                 f'data.path="{fm_batch[1]}"', "train.online_max_idle_s=0", 'train.online_until="day=002"',
                 "train.progress=false"]) == 0
    return run


def distill(fm: Path | str, data: Path, out: Path, *overrides: str, args: tuple[str, ...] = ()) -> dict:
    rc = main(["distill", "--fm", str(fm), "--vm-config", RECIPE, "--data", str(data), "--out", str(out),
               *args, *FAST, *overrides])
    assert rc == 0
    return json.loads((out / "distill_summary.json").read_text())


def weights(run: Path) -> dict[str, torch.Tensor]:
    with open_run(run) as r:
        return {k: v.clone() for k, v in _plain_state(r.model).items()}


def summary(run: Path) -> dict:
    return json.loads((run / "train_summary.json").read_text())


@pytest.fixture(scope="module")
def runs(fm_batch, tmp_path_factory) -> dict[str, Path]:
    """The baseline VM and one run per KD-side switch, on the same data, seed and steps."""
    fm, data = fm_batch
    root = tmp_path_factory.mktemp("vms")
    arms = {"baseline": [], "kd": KD, "aux": [*KD, "distill.aux_head=true"],
            "adapter": [*KD, "distill.student_adapter.enabled=true"]}
    for name, switches in arms.items():
        distill(fm, data, root / name, *OFF, *switches)
    return {name: root / name for name in arms}


# ----------------------------------------------------------------------------- an ordinary run
def test_a_distill_run_is_an_ordinary_run_that_evaluate_and_predict_read(fm_batch, tmp_path, capsys):
    fm, data = fm_batch
    out = tmp_path / "vm"
    res = distill(fm, data, out)  # the example recipe: every switch on
    cfg = load_run_config(out / "config.toml")  # the served VM only: evaluate/predict rebuild it from this
    assert cfg.model.name == "dlrm" and Path(cfg.data.path) == (out / "data").resolve()
    assert (out / "checkpoints" / "final").is_dir()
    kinds = [json.loads(line)["kind"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert "train" in kinds and "eval" in kinds
    assert res["aux_head_params"] > 0 and res["adapter_mean_abs_correction"] > 0
    assert res["shared_params"] and res["fm_embedding_features"]
    assert res["serving_flops_per_example"] <= load_distill_config(RECIPE).vm.flops_budget
    capsys.readouterr()
    assert main(["evaluate", "--run", str(out)]) == 0
    ev = json.loads((out / "eval.json").read_text())
    assert ev["rows"] > 0 and ev["metrics"]["feed/click"]["ne"] > 0
    assert main(["predict", "--run", str(out), "--out", str(tmp_path / "p.parquet")]) == 0
    pred = pq.read_table(tmp_path / "p.parquet")
    assert pred.num_rows == ev["rows"] and set(pred.column("surface").to_pylist()) == {"feed"}
    assert main(["report", str(out), "--out", str(tmp_path / "r.html")]) == 0
    assert (tmp_path / "r.html").stat().st_size > 0
    distill_cfg = load_config(DistillConfig, out / "distill.toml")  # the recipe, resolved, round-trips
    assert distill_cfg == load_distill_config(RECIPE, FAST)


def test_the_distill_recipe_round_trips(tmp_path):
    cfg = load_distill_config(RECIPE, ["distill.kd.weight=0.5", 'distill.fm_embeddings=["trunk"]'])
    save_config(cfg, tmp_path / "d.toml")
    assert load_distill_config(tmp_path / "d.toml") == cfg


# ----------------------------------------------------------------------------- each switch changes training
def test_kd_adds_its_loss_to_the_same_first_step(runs):
    base, kd = summary(runs["baseline"]), summary(runs["kd"])
    assert kd["first_loss"] > base["first_loss"] + 1e-3  # same init, batch and label loss, plus KD
    assert not torch.equal(_dense(runs["kd"]), _dense(runs["baseline"]))


def _dense(run: Path) -> torch.Tensor:
    """Every weight of a run but its embedding tables, as one vector."""
    w = weights(run)
    return torch.cat([v.flatten().float() for k, v in sorted(w.items())
                      if not str(_suffix(k)).startswith("table:")])


def test_the_aux_head_trains_outside_the_served_model_and_moves_the_trunk(runs):
    meta = json.loads((runs["aux"] / "checkpoints" / "final" / "meta.json").read_text())
    state = meta["extra"]["distill"]
    w = torch.tensor(state["aux_head"]["weight"]["__tensor__"])
    torch.manual_seed(1)  # the aux head's init: seed train.seed + 1
    init = torch.nn.Linear(w.shape[1], w.shape[0]).weight
    assert not torch.allclose(w, init)  # it received gradients and stepped
    assert state["aux_optim"]["state"]["0"]["step"]["__tensor__"] == 4
    names = weights(runs["aux"]).keys()
    assert not any("aux" in k for k in names)  # the served checkpoint holds the served model only
    # the KD term reaches the trunk through the aux head: not the baseline's, and not plain KD's weights
    assert not torch.equal(_dense(runs["aux"]), _dense(runs["baseline"]))
    assert not torch.equal(_dense(runs["aux"]), _dense(runs["kd"]))
    assert json.loads((runs["kd"] / "checkpoints" / "final" / "meta.json").read_text())[
        "extra"]["distill"]["aux_head"] is None


def test_the_student_adapter_changes_the_teacher(runs):
    res = json.loads((runs["adapter"] / "distill_summary.json").read_text())
    assert res["adapter_mean_abs_correction"] > 0.01
    plain_kd = json.loads((runs["kd"] / "distill_summary.json").read_text())
    assert plain_kd["adapter_mean_abs_correction"] is None
    # same init, batch and label loss as plain KD: only the (corrected) teacher differs
    assert abs(summary(runs["adapter"])["first_loss"] - summary(runs["kd"])["first_loss"]) > 1e-4


def test_fm_embeddings_become_dense_vm_features(fm_batch, tmp_path):
    fm, data = fm_batch
    out = tmp_path / "vm"
    res = distill(fm, data, out, *OFF, 'distill.fm_embeddings=["user"]')
    side = pq.read_table(next((out / "knowledge").glob("day=*.parquet")))
    width = len(side.column("fm_user")[0].as_py())
    assert res["fm_embedding_features"] == [f"fm_user_{i}" for i in range(width)] and width > 0
    rows = pq.read_table(next((out / "data" / "day=002").glob("*.parquet")))
    emb = np.stack([rows.column(f"fm_user_{i}").to_numpy() for i in range(width)], 1)
    assert emb.std(0).min() > 0  # real FM features (standardised per version), not zeros
    with open_run(out) as r:
        assert "fm_user_0" in r.ds.schema.dense_names


@pytest.mark.parametrize("mode", ["frozen", "init"])
def test_param_sharing_copies_fm_tables_frozen_or_trained(fm_batch, tmp_path, mode):
    fm, data = fm_batch
    out = tmp_path / mode
    res = distill(fm, data, out, *OFF, f'distill.param_sharing="{mode}"')
    assert res["shared_params"]
    fm_tables = {_suffix(k): v for k, v in weights(fm).items() if str(_suffix(k)).startswith("table:")}
    vm_tables = {_suffix(k): v for k, v in weights(out).items() if str(_suffix(k)).startswith("table:")}
    common = sorted(set(fm_tables) & set(vm_tables))
    assert common
    same = [torch.equal(vm_tables[t], fm_tables[t][: len(vm_tables[t])]) for t in common]
    assert all(same) if mode == "frozen" else not all(same)


def test_hierarchical_distils_from_the_domain_fm(fm_batch, fm_online, runs, tmp_path):
    fm, data = fm_batch
    out = tmp_path / "vm"
    distill(fm, data, out, *OFF, *KD, f'distill.hierarchical="{fm_online}"')
    side = pq.read_table(next((out / "knowledge_domain").glob("*.parquet")))
    assert set(side.column("fm_version").to_pylist()) == {2}  # the domain FM's version before day=002
    assert not (out / "knowledge").exists()  # the FM itself labels nothing here
    assert abs(summary(out)["first_loss"] - summary(runs["kd"])["first_loss"]) > 1e-4


# ----------------------------------------------------------------------------- resume, no leakage, knowledge
def test_resume_after_a_crash_gives_the_uninterrupted_result(fm_batch, tmp_path, monkeypatch, capsys):
    fm, data = fm_batch
    sw = [*OFF, *KD, "distill.aux_head=true", "train.steps=6", "train.checkpoint_every=2"]
    distill(fm, data, tmp_path / "a", *sw)
    argv = ["distill", "--fm", str(fm), "--vm-config", RECIPE, "--data", str(data), "--out",
            str(tmp_path / "b"), *FAST, *sw]
    monkeypatch.setenv("OPENGEM_INJECT_FAILURE", "0:5")
    assert main(argv) == 1  # died after step 5; the newest checkpoint is step 4
    monkeypatch.delenv("OPENGEM_INJECT_FAILURE")
    capsys.readouterr()
    assert main([*argv, "--resume"]) == 0
    assert summary(tmp_path / "b")["resumed"]["step"] == 4
    wa, wb = weights(tmp_path / "a"), weights(tmp_path / "b")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    aux = [json.loads((tmp_path / r / "checkpoints" / "final" / "meta.json").read_text())["extra"]["distill"]
           for r in ("a", "b")]
    assert aux[0]["aux_head"] == aux[1]["aux_head"] and aux[0]["aux_optim"] == aux[1]["aux_optim"]


def test_no_example_is_labelled_by_an_fm_that_trained_on_its_time(fm_batch, tmp_path, capsys):
    fm, data = fm_batch
    out = tmp_path / "vm"
    res = distill(fm, data, out, *OFF, *KD, 'data.train="day=001,day=002"')
    through = res["fm_versions"][0]["trained_through_ts"]
    side = pq.read_table(list((out / "knowledge").glob("*.parquet")))
    ts, ver = side.column("ts").to_numpy(), side.column("fm_version").to_numpy()
    logit = side.column("fm_logit_click").to_numpy()
    assert (ts <= through).any() and (ts > through).any()
    assert (ver[ts <= through] == -1).all() and np.isnan(logit[ts <= through]).all()
    assert (ver[ts > through] == 0).all()
    cov = res["teacher_on_training_rows"]
    assert 0 < cov["rows_with_teacher"] < cov["rows"]
    # KD with no training row newer than the FM: refused, not silently trained without a teacher
    rc, err = run_cli(capsys, ["distill", "--fm", str(fm), "--vm-config", RECIPE, "--data", str(data),
                               "--out", str(tmp_path / "x"), *FAST, *OFF, *KD,
                               'data.train="day=000,day=001"'])
    assert rc == 2 and "newer than the FM" in one_error_line(err, "distill")


def test_online_uses_only_versions_trained_strictly_before_each_row(fm_batch, fm_online, tmp_path, capsys):
    _, data = fm_batch
    out = tmp_path / "vm"
    argv = ["distill", "--online", "--fm", str(fm_online), "--vm-config", RECIPE, "--data", str(data),
            "--out", str(out), *FAST, *OFF, *KD, "distill.student_adapter.enabled=true",
            'distill.fm_embeddings=["user"]', "train.online_max_idle_s=0"]
    assert main(argv) == 0
    res = json.loads((out / "distill_online_summary.json").read_text())
    assert [w["window"] for w in res["windows"]] == ["day=000", "day=001", "day=002", "day=003"]
    tt = {v.version: v.trained_through_ts for v in list_versions(fm_online)}
    used = set()
    for part in ("day=000", "day=001", "day=002", "day=003"):
        side = pq.read_table(list((out / "knowledge" / part).glob("*.parquet")))
        ts, ver = side.column("ts").to_numpy(), side.column("fm_version").to_numpy()
        through = side.column("fm_trained_through").to_numpy()
        assert (through[ver >= 0] < ts[ver >= 0]).all()  # strictly older than the example
        newest = np.array([max([k for k, t in tt.items() if t < x], default=-1) for x in ts])
        assert (ver == newest).all()  # and the newest such version
        used |= set(ver[ver >= 0].tolist())
    assert used == {1, 2, 3} and res["windows"][0]["rows_with_teacher"] == 0
    # FM embeddings as features: zeros where no version may label the rows (day=000), the FM's after
    emb = {p: pq.read_table(list((out / "data" / p).glob("*.parquet")), columns=["fm_user_0"]).column(0)
           .to_numpy() for p in ("day=000", "day=001")}
    assert (emb["day=000"] == 0).all() and emb["day=001"].std() > 0
    assert main(["evaluate", "--run", str(out)]) == 0  # an ordinary run folder
    capsys.readouterr()
    assert main(argv) == 0  # a restart continues after the windows trained: nothing left to do
    again = json.loads((out / "distill_online_summary.json").read_text())
    assert again["windows"] == [] and again["windows_done"] == res["windows_done"]


def test_online_composes_every_switch(fm_batch, fm_online, tmp_path):
    _, data = fm_batch
    out = tmp_path / "vm"
    assert main(["distill", "--online", "--fm", str(fm_online), "--vm-config", RECIPE, "--data", str(data),
                 "--out", str(out), *FAST, 'distill.param_sharing="frozen"',
                 f'distill.hierarchical="{fm_online}"', 'train.online_first="day=001"',
                 "train.online_max_idle_s=0"]) == 0
    res = json.loads((out / "distill_online_summary.json").read_text())
    assert res["windows_done"] == ["day=001", "day=002", "day=003"]
    assert all((out / "knowledge_domain" / w).is_dir() for w in res["windows_done"])  # the domain teaches
    with open_run(out) as r:
        assert {"fm_user_0", "fm_ad_0"} <= set(r.ds.schema.dense_names)
        vm = {_suffix(k): v.clone() for k, v in _plain_state(r.model).items()}
        # frozen tables: those of v1, the newest version trained before the VM's first window (day=001)
        v1 = _load_version(list_versions(fm_online)[0], Dataset(data).schema, r.device,
                           torch.distributed.group.WORLD)
        fm = {_suffix(k): v for k, v in _plain_state(v1).items()}
    tables = [t for t in vm if str(t).startswith("table:") and t in fm]
    assert tables and all(torch.equal(vm[t], fm[t][: len(vm[t])]) for t in tables)


def test_distill_from_a_generated_side_table(fm_batch, fm_online, tmp_path, capsys):
    _, data = fm_batch
    side = tmp_path / "side"
    assert main(["generate", "--fm", str(fm_online), "--data", str(data), "--out", str(side),
                 "--partitions", "day=002", "--embeddings", ""]) == 0
    out = tmp_path / "vm"
    res = distill(fm_online, data, out, *OFF, *KD, args=("--knowledge", str(side)))
    assert res["knowledge"] == str(side.resolve()) and not (out / "knowledge").exists()
    assert res["teacher_on_training_rows"]["rows_with_teacher"] > 0
    rc, err = run_cli(capsys, ["distill", "--fm", str(fm_batch[0]), "--vm-config", RECIPE, "--data",
                               str(data), "--out", str(tmp_path / "x"), "--knowledge", str(side), *FAST,
                               *OFF, *KD])
    assert rc == 2 and "was generated from FM" in one_error_line(err, "distill")


# ----------------------------------------------------------------------------- bad input: one line
@pytest.fixture(scope="module")
def other_schema_data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("other") / "data"
    simulate(SimConfig.from_dict({"rows": 300, "days": 2, "surfaces": 3, "users": 50, "ads": 30,
                                  "advertisers": 5, "topics": 5, "seq_mean": 4.0, "seq_max": 8,
                                  "recent_k": 2, "emb_dim": 4}), out)
    return out


@pytest.mark.parametrize("case, code, needle", [
    ("fm_missing", 2, "no such FM run folder"),
    ("version_missing", 1, "no version 7"),
    ("not_a_vm", 2, "not a vertical-model config"),
    ("vm_feature_not_in_fm", 2, "vm.schema.sparse"),
    ("data_schema_differs", 2, "was trained on schema"),
    ("aux_without_kd", 2, "distill.aux_head"),
])
def test_bad_input_is_one_line(fm_batch, fm_online, other_schema_data, tmp_path, capsys, case, code, needle):
    fm, data = fm_batch
    recipe, extra = RECIPE, []
    if case == "fm_missing":
        fm = tmp_path / "nope"
    elif case == "version_missing":
        fm = f"{fm_online}@7"
    elif case == "not_a_vm":
        recipe = "configs/tiny.toml"
    elif case == "vm_feature_not_in_fm":
        extra = ['vm.schema.sparse=["not_a_feature"]']
    elif case == "data_schema_differs":
        data = other_schema_data
    else:
        extra = [*OFF, "distill.aux_head=true"]
    rc, err = run_cli(capsys, ["distill", "--fm", str(fm), "--vm-config", recipe, "--data", str(data),
                               "--out", str(tmp_path / "vm"), *FAST, *extra])
    assert rc == code and needle in one_error_line(err, "distill")
    assert not (tmp_path / "vm" / "checkpoints").exists()


@pytest.mark.parametrize("extra, needle", [
    ((), "holds an earlier run"),
    (("--resume", 'distill.fm_embeddings=["user"]'), "were built from them"),
    (("--resume", "distill.kd.weight=2.0"), "add --allow-config-change"),
])
def test_a_finished_run_is_not_overwritten_or_resumed_differently(fm_batch, runs, capsys, extra, needle):
    fm, data = fm_batch
    before = sorted(p.name for p in runs["kd"].iterdir())
    rc, err = run_cli(capsys, ["distill", "--fm", str(fm), "--vm-config", RECIPE, "--data", str(data),
                               "--out", str(runs["kd"]), *FAST, *OFF, *KD, *extra])
    assert rc == 2 and needle in one_error_line(err, "distill")
    assert sorted(p.name for p in runs["kd"].iterdir()) == before


# ----------------------------------------------------------------------------- inputs are never overwritten
def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("where", ["data_inside_out", "out_is_a_dataset"])
def test_an_out_holding_the_inputs_or_a_dataset_is_refused_before_writing(fm_batch, tmp_path, capsys, where):
    """distill writes OUT/data (schema.toml first) and OUT/knowledge: with --data at OUT/data the input's
    schema.toml was overwritten by the VM's (the dataset then failed validate and train); a dataset given as
    --out had data/, knowledge/ and distill.json written into it before it was refused."""
    import shutil

    fm, data = fm_batch
    copy = tmp_path / "proj" / "data" if where == "data_inside_out" else tmp_path / "dsc"
    shutil.copytree(data, copy)
    before = _tree(copy)
    inside = where == "data_inside_out"
    out = copy.parent if inside else copy
    rc, err = run_cli(capsys, ["distill", "--fm", str(fm), "--vm-config", RECIPE, "--data",
                               str(copy if inside else data), "--out", str(out), *FAST, *OFF])
    line = one_error_line(err, "distill")
    assert rc == 2 and ("lies inside --out" if inside else "this is a dataset folder") in line
    assert _tree(copy) == before


def test_a_side_table_of_other_rows_or_lag_is_refused(fm_batch, fm_online, tmp_path, capsys):
    """Rows are joined to the side table by example id: one made from another dataset gave every row
    another row's FM labels and embeddings, silently; one made with another --lag another teacher."""
    import shutil

    _, data = fm_batch
    side = tmp_path / "side"
    assert main(["generate", "--fm", str(fm_online), "--data", str(data), "--out", str(side),
                 "--partitions", "day=002", "--embeddings", "", "--lag", "1"]) == 0
    rc, err = run_cli(capsys, ["distill", "--fm", str(fm_online), "--vm-config", RECIPE, "--data", str(data),
                               "--out", str(tmp_path / "vm"), "--knowledge", str(side), *FAST, *OFF, *KD])
    assert rc == 2 and "distill.lag (it has --lag 1, the recipe 0)" in one_error_line(err, "distill")
    rewritten = tmp_path / "rewritten"  # the same schema and example ids, written anew: other rows
    shutil.copytree(data, rewritten)
    marker = json.loads((rewritten / "_COMPLETE").read_text())
    (rewritten / "_COMPLETE").write_text(json.dumps({**marker, "written_at": "2030-01-01T00:00:00Z"}))
    rc, err = run_cli(capsys, ["distill", "--fm", str(fm_online), "--vm-config", RECIPE, "--data",
                               str(rewritten), "--out", str(tmp_path / "vm2"), "--knowledge", str(side),
                               *FAST, *OFF, *KD, "distill.lag=1"])
    assert rc == 2 and "--data (it was made from" in one_error_line(err, "distill")


def test_a_failed_online_start_does_not_stick(fm_batch, fm_online, tmp_path, capsys):
    """An online distillation that failed before its first window (here: every FM version trained on the
    first window's rows, with param sharing) left RUN/data behind, and the fixed command was refused with
    the old reason as if it were a restart."""
    _, data = fm_batch
    out = tmp_path / "vmo"
    base = ["distill", "--online", "--fm", str(fm_online), "--vm-config", RECIPE, "--data", str(data),
            "--out", str(out), "train.online_max_idle_s=0", "train.progress=false", *OFF,
            'distill.param_sharing="frozen"']
    rc, err = run_cli(capsys, base)
    assert rc == 2 and "distill.param_sharing" in one_error_line(err, "distill")
    assert main([*base, 'train.online_first="day=002"']) == 0
    assert Dataset(out / "data").partitions()[0] == "day=002"


def test_generate_reads_a_batch_trained_fm_as_version_0(fm_batch, tmp_path, capsys):
    """The README's FM for distillation (opengem train) was refused by generate ('no versions/ folder'),
    although distill reads it as version 0 and --knowledge takes generate's side tables."""
    fm, data = fm_batch
    side = tmp_path / "side"
    assert main(["generate", "--fm", str(fm), "--data", str(data), "--out", str(side), "--partitions",
                 "day=002,day=003", "--embeddings", ""]) == 0
    res = distill(fm, data, tmp_path / "vm", *OFF, *KD, args=("--knowledge", str(side)))
    assert res["teacher_on_training_rows"]["fm_versions_used"] == [0]
    rc, err = run_cli(capsys, ["generate", "--fm", f"{fm}@3", "--data", str(data), "--out",
                               str(tmp_path / "x")])
    assert rc == 1 and "no version 3 of" in one_error_line(err, "generate")


def test_generate_folds_a_batch_fms_calibration_into_its_labels(fm_batch, tmp_path):
    """calibration.json is folded in by every reader of the run: generate (and so distill's teacher) used
    the uncalibrated logits, silently."""
    import shutil

    fm, data = fm_batch
    cal = tmp_path / "fm"
    shutil.copytree(fm, cal)
    assert main(["calibrate", "--run", str(cal), "--min-positives", "1"]) == 0
    assert main(["predict", "--run", str(cal), "--partitions", "day=003", "--out",
                 str(tmp_path / "p.parquet")]) == 0
    assert main(["generate", "--fm", str(cal), "--data", str(data), "--out", str(tmp_path / "side"),
                 "--partitions", "day=003", "--embeddings", ""]) == 0
    side = pq.read_table(next((tmp_path / "side").glob("*.parquet")))
    pred = pq.read_table(tmp_path / "p.parquet")
    order = np.argsort(side.column("example_id").to_numpy())
    want = pred.column("click").to_numpy()[np.argsort(pred.column("example_id").to_numpy())]
    got = 1 / (1 + np.exp(-side.column("fm_logit_click").to_numpy()[order]))
    assert np.allclose(got, want, atol=1e-5)
    assert json.loads((tmp_path / "side" / "generate.json").read_text())["calibration"]


def test_generate_removes_the_parts_a_killed_generate_left(fm_batch, tmp_path):
    fm, data = fm_batch
    side = tmp_path / "side"
    side.mkdir()
    dead = side / ".day=002.parquet.tmp-999999999"  # no such process
    dead.write_bytes(b"half a part")
    assert main(["generate", "--fm", str(fm), "--data", str(data), "--out", str(side), "--partitions",
                 "day=002", "--embeddings", ""]) == 0
    assert not dead.exists() and (side / "day=002.parquet").exists()
