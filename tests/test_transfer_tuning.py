"""Per-arm training length and per-surface tuning in `opengem transfer` (issue 15, calibration round 5's
two proposals): each arm trains its own epochs per window; KD's point and every arm's epochs can be chosen
per VM surface on that surface's validation rows; no choice ever reads the evaluation windows."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from opengem.config import ConfigError, load_config, save_config
from opengem.data.dataset import Dataset
from opengem.data.sim_config import SimConfig
from opengem.data.simulate import simulate
from opengem.errors import TrainError
from opengem.transfer.arms import arm_configs
from opengem.transfer.experiment_config import ExperimentConfig, load_experiment_config
from opengem.transfer.knowledge import KnowledgeTable
from opengem.transfer.tuning import choose, tune_on_validation
from opengem.transfer.vertical import VMSchemaConfig, build_vm_dataset, derive_vm_schema
from opengem.transfer.vm_train import ArmConfig, ProgressiveStudent

TINY = "configs/transfer-tiny.toml"
TWO_ARMS = 'arms=["baseline", "kd"]'


# --- config: the new keys -------------------------------------------------------------------------------

def test_per_arm_epochs_and_tuning_keys_load_from_toml_and_overrides_and_round_trip(tmp_path):
    toml = tmp_path / "t.toml"
    toml.write_text(Path(TINY).read_text().replace("epochs_per_window = 4", "epochs_per_window = 1\n"
                                                   "validation_windows = 1\narm_epochs = { kd = 3 }"))
    cfg = load_experiment_config(toml, [TWO_ARMS, "arm_epochs.baseline=2"])
    assert cfg.arm_epochs == {"kd": 3, "baseline": 2} and cfg.epochs_per_window == 1
    assert (cfg.epochs_for("kd"), cfg.epochs_for("baseline")) == (3, 2)
    save_config(cfg, tmp_path / "saved.toml")
    assert load_config(ExperimentConfig, tmp_path / "saved.toml") == cfg

    tuned = load_experiment_config(TINY, [TWO_ARMS, "validation_windows=1", "tune_epochs=[1, 2, 4]",
                                          "tune_per_surface=true"])
    assert tuned.tune_epochs == [1, 2, 4] and tuned.tune_per_surface and tuned.arm_epochs == {}
    save_config(tuned, tmp_path / "tuned.toml")
    assert load_config(ExperimentConfig, tmp_path / "tuned.toml") == tuned
    assert ExperimentConfig().tune_epochs == [] and not ExperimentConfig().tune_per_surface  # old default


@pytest.mark.parametrize("bad, match", [
    (["arm_epochs.kd=0"], "arm_epochs.kd: an integer >= 1"),
    (["arm_epochs.aux_head=2"], "arm_epochs.aux_head: not one of this experiment's arms"),
    (["epochs_per_window=0"], "epochs_per_window: an integer >= 1"),
    (["validation_windows=1", "tune_epochs=[1, 1]"], "tune_epochs: distinct integers"),
    (["validation_windows=1", "tune_epochs=[0, 2]"], "tune_epochs: distinct integers"),
    (["validation_windows=1", "tune_epochs=[1, 2]", "arm_epochs.kd=2"], "arm_epochs would be ignored"),
    (["tune_epochs=[1, 2]"], "tune_epochs: chooses on the validation windows"),
    (["tune_per_surface=true"], "tune_per_surface: chooses on the validation windows"),
])
def test_bad_epoch_and_tuning_keys_are_config_errors_naming_the_key(bad, match):
    with pytest.raises(ConfigError, match=match):
        load_experiment_config(TINY, [TWO_ARMS, *bad])


def test_arm_configs_carry_each_arms_own_epochs():
    cfg = load_experiment_config(TINY, ["epochs_per_window=1", "arm_epochs.kd=3", "arm_epochs.aux_head=2"])
    arms = arm_configs(cfg, [1.0, 1.0])
    assert {a: arms[a].epochs_per_window for a in arms} == {
        "baseline": 1, "kd": 3, "aux_head": 2, "student_adapter": 1, "fm_embeddings": 1, "param_sharing": 1,
        "hierarchical": 1}
    tuned = arm_configs(cfg, [1.0, 1.0], {"baseline": 4, "kd": 2})  # tuned values win over the config's
    assert tuned["baseline"].epochs_per_window == 4 and tuned["kd"].epochs_per_window == 2
    assert tuned["aux_head"].epochs_per_window == 2


# --- a VM trains its arm's epochs: count the optimizer steps ----------------------------------------------

@pytest.fixture(scope="module")
def vm_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("vm_epochs")
    simulate(SimConfig.from_dict({"rows": 700, "days": 2, "surfaces": 2, "users": 100, "ads": 80,
                                  "advertisers": 10, "topics": 8, "seq_mean": 4.0, "seq_max": 6,
                                  "recent_k": 2, "emb_dim": 8}), root / "sim")
    schema = derive_vm_schema(Dataset(root / "sim").schema, VMSchemaConfig(max_len=4), name="vm_epochs")
    return schema, build_vm_dataset(root / "sim", [0], root / "vm", None, None, schema)


def test_each_arm_trains_its_own_epochs_per_window(vm_data):
    schema, data = vm_data
    cfg = load_experiment_config(TINY, [TWO_ARMS, "epochs_per_window=1", "arm_epochs.kd=3"])
    arms = arm_configs(cfg, [1.0, 1.0])
    window = Dataset(data).partitions()[0]
    steps = {}
    for name in ("baseline", "kd"):
        st = ProgressiveStudent(schema, cfg.vm, arms[name], cfg.train, str(data), torch.device("cpu"), None,
                                batch_size=64, epochs_per_window=cfg.epochs_per_window)
        try:
            ids = np.concatenate([b.example_id.numpy() for b in st.loader(window, train=False)])
            teacher = KnowledgeTable(ids, np.zeros((len(ids), len(schema.tasks)), np.float32))
            st.train_window(window, teacher if arms[name].distils else None)
        finally:
            st.close()
        batches = math.ceil(len(ids) / 64)
        steps[name] = st.steps
        assert st.steps == cfg.epochs_for(name) * batches, (name, st.steps, batches)
    assert steps["kd"] == 3 * steps["baseline"] > 0
    # an arm without its own length trains the caller's
    st = ProgressiveStudent(schema, cfg.vm, ArmConfig(), cfg.train, str(data), torch.device("cpu"), None,
                            batch_size=64, epochs_per_window=2)
    try:
        st.train_window(window)
    finally:
        st.close()
    assert st.steps == 2 * steps["baseline"]


# --- tuning: per surface, and never on the evaluation rows -----------------------------------------------

GRID = [[1.0, 1.0], [2.0, 1.0]]
VAL, EVAL = np.arange(0, 3000), np.arange(3000, 12000)  # three times more evaluation rows than validation
# sharpness of a candidate's logits on the validation rows (higher = lower NE), per surface; keys are
# ("kd", weight, epochs) and (arm, epochs). Feed's own best KD point is (w 1, E 2), stories' (w 2, E 1),
# and the mean over both surfaces prefers (w 2, E 2), second on each surface.
SHARP = {
    "feed": {("kd", 1.0, 1): 0.5, ("kd", 1.0, 2): 2.0, ("kd", 2.0, 1): 1.0, ("kd", 2.0, 2): 1.9,
             ("baseline", 1): 1.0, ("baseline", 2): 0.6},
    "stories": {("kd", 1.0, 1): 0.5, ("kd", 1.0, 2): 0.8, ("kd", 2.0, 1): 1.8, ("kd", 2.0, 2): 1.7,
                ("baseline", 1): 0.7, ("baseline", 2): 1.1},
}


class FakeRun:
    """SeedRun's interface with predictions made up from SHARP: the evaluation rows get the reversed
    sharpness (``eval_sharp``), so any choice that read them would flip."""

    def __init__(self, cfg: ExperimentConfig, eval_sharp=lambda c: 3.2 - c) -> None:
        self.cfg, self.surfaces, self.eval_sharp = cfg, ["feed", "stories"], eval_sharp
        self.calls: list[dict] = []

    def preds(self, sname: str, key: tuple) -> dict:
        rng = np.random.default_rng(self.surfaces.index(sname))
        ids = np.concatenate([VAL, EVAL])
        y = (rng.random(len(ids)) < 0.3).astype(np.float32)
        noise = np.random.default_rng(7).standard_normal(len(ids))
        c = np.where(np.isin(ids, VAL), SHARP[sname][key], self.eval_sharp(SHARP[sname][key]))
        return {"example_id": ids, "surface": np.zeros(len(ids), np.int32),
                "logits": (c * (2 * y - 1) + noise)[:, None], "labels": y[:, None],
                "mask": np.ones((len(ids), 1), bool)}

    def run_lag(self, lag, arms, arm_cfgs, kd_results=None, kd_grid_epochs=None, surface_arm_cfgs=None):
        self.calls.append({"arms": list(arms), "kd_grid_epochs": kd_grid_epochs,
                           "cfgs": surface_arm_cfgs})
        out = {}
        for s in self.surfaces:
            res = {"surface": 0, "tasks": ["click"]}
            if kd_results is None:
                res["kd_grid"] = {tuple(g): self.preds(s, ("kd", g[0], kd_grid_epochs))
                                  for g in self.cfg.kd.grid}
            for a in arms:
                res[a] = self.preds(s, (a, (surface_arm_cfgs or {s: arm_cfgs})[s][a].epochs_per_window))
            out[s] = res
        return out


def tuning_cfg(*extra: str) -> ExperimentConfig:
    cfg = load_experiment_config(TINY, [TWO_ARMS, "validation_windows=1", "tune_epochs=[1, 2]", *extra])
    cfg.kd.grid = [list(g) for g in GRID]
    return cfg


def test_per_surface_tuning_picks_each_surfaces_own_kd_point_and_epochs():
    tuned = tune_on_validation([FakeRun(tuning_cfg("tune_per_surface=true"))], [VAL], ["baseline", "kd"],
                               log=lambda *a: None)
    assert tuned.kd_point == {"feed": [1.0, 1.0], "stories": [2.0, 1.0]}
    assert tuned.epochs == {"kd": {"feed": 2, "stories": 1}, "baseline": {"feed": 1, "stories": 2}}
    cfgs = tuned.arm_cfgs(tuning_cfg())
    assert cfgs["feed"]["kd"].kd_weight == 1.0 and cfgs["feed"]["kd"].epochs_per_window == 2
    assert cfgs["stories"]["kd"].kd_weight == 2.0 and cfgs["stories"]["kd"].epochs_per_window == 1
    assert cfgs["stories"]["baseline"].epochs_per_window == 2 and cfgs["feed"]["baseline"].kd_weight == 0
    rec = tuned.record()
    assert rec["weight"] is None and rec["surfaces"]["stories"] == {"weight": 2.0, "temperature": 1.0,
                                                                     "epochs": 1, "point": [2.0, 1.0]}
    assert [(c["epochs"], c["point"]) for c in rec["grid_ne"]] == [(e, g) for e in (1, 2) for g in GRID]
    assert all(set(c["ne_per_surface"]) == {"feed", "stories"} for c in rec["grid_ne"])


def test_shared_tuning_picks_one_point_for_every_surface_on_the_mean():
    run = FakeRun(tuning_cfg())
    tuned = tune_on_validation([run], [VAL], ["baseline", "kd"], log=lambda *a: None)
    assert tuned.kd_point == {"feed": [2.0, 1.0], "stories": [2.0, 1.0]}
    assert tuned.epochs["kd"] == {"feed": 2, "stories": 2}
    rec = tuned.record()
    assert (rec["weight"], rec["temperature"], rec["epochs"]) == (2.0, 1.0, 2)
    # the same budget for every arm: the KD grid and the other arms each at every candidate length
    assert [c["kd_grid_epochs"] for c in run.calls if c["arms"] == []] == [1, 2]
    assert [c["arms"] for c in run.calls if c["arms"]] == [["baseline"], ["baseline"]]
    assert [e["epochs"] for e in tuned.epoch_scores["baseline"]] == [1, 2]


@pytest.mark.parametrize("per_surface", [False, True])
def test_no_choice_reads_the_evaluation_rows(per_surface):
    extra = ["tune_per_surface=true"] if per_surface else []
    base = tune_on_validation([FakeRun(tuning_cfg(*extra))], [VAL], ["baseline", "kd"], log=lambda *a: None)
    garbage = tune_on_validation([FakeRun(tuning_cfg(*extra), eval_sharp=lambda c: -5.0 * c)], [VAL],
                                 ["baseline", "kd"], log=lambda *a: None)
    assert garbage.kd_point == base.kd_point and garbage.epochs == base.epochs
    assert garbage.kd_scores == base.kd_scores and garbage.epoch_scores == base.epoch_scores
    # the same rule on the evaluation rows chooses otherwise (so the check above can fail)
    on_eval = tune_on_validation([FakeRun(tuning_cfg(*extra))], [EVAL], ["baseline", "kd"],
                                 log=lambda *a: None)
    assert on_eval.kd_point != base.kd_point or on_eval.epochs != base.epochs


def test_ties_go_to_fewer_epochs_and_unscorable_candidates_are_refused():
    cands = [{"epochs": 2, "ne": 0.9, "ne_per_surface": {"feed": 0.9}},
             {"epochs": 1, "ne": 0.9, "ne_per_surface": {"feed": 0.9}}]
    assert choose(cands, ["feed"], False, "x")["feed"]["epochs"] == 1
    nan = [{"epochs": 1, "ne": float("nan"), "ne_per_surface": {"feed": float("nan")}}]
    with pytest.raises(TrainError, match="kd.grid: no candidate"):
        choose(nan, ["feed"], True, "kd.grid")


# --- end to end through `opengem transfer` ----------------------------------------------------------------

SMALL = ["data.sim.rows=2000", "data.sim.days=4", "validation_windows=1", 'surfaces=["feed", "stories"]',
         "fm.train.epochs=1", TWO_ARMS, "bootstrap=20"]


@pytest.mark.slow
def test_transfer_cli_trains_per_arm_epochs_and_records_per_surface_choices(tmp_path):
    """Through the CLI (15-35 s on the shared 2 cores): a config with per-arm epochs trains each arm that
    many epochs (steps counted), and per-surface tuning records its choices per surface and trains the
    chosen lengths."""
    from opengem import cli

    assert cli.main(["transfer", "--config", TINY, "--out", str(tmp_path), *SMALL, "epochs_per_window=1",
                     "arm_epochs.kd=3"]) == 0
    res = json.loads((tmp_path / "transfer.json").read_text())
    ep = res["epochs_per_window"]
    assert ep["chosen"] == {"kd": {"feed": 3, "stories": 3}, "baseline": {"feed": 1, "stories": 1}}
    for s in ("feed", "stories"):
        assert ep["steps"]["kd"][s] == 3 * ep["steps"]["baseline"][s] > 0
    assert res["config"]["arm_epochs"] == {"kd": 3}

    assert cli.main(["transfer", "--config", TINY, "--out", str(tmp_path), *SMALL, "tune_epochs=[1, 2]",
                     "tune_per_surface=true"]) == 0
    res = json.loads((tmp_path / "transfer.json").read_text())
    ep, kd = res["epochs_per_window"], res["kd_tuned"]
    assert ep["tuned_over"] == [1, 2] and ep["per_surface"] and kd["per_surface"]
    assert len(kd["grid_ne"]) == 2 * len(res["config"]["kd"]["grid"])
    for s in ("feed", "stories"):
        e_base, e_kd = ep["chosen"]["baseline"][s], ep["chosen"]["kd"][s]
        assert kd["surfaces"][s]["epochs"] == e_kd and {e_base, e_kd} <= {1, 2}
        assert ep["steps"]["kd"][s] * e_base == ep["steps"]["baseline"][s] * e_kd
        best = min((c for c in kd["grid_ne"]), key=lambda c: (c["ne_per_surface"][s], c["epochs"]))
        assert kd["surfaces"][s]["point"] == best["point"] and e_kd == best["epochs"]
        nes = {c["epochs"]: c["ne_per_surface"][s] for c in ep["validation_ne"]["baseline"]}
        assert e_base == min(nes, key=lambda e: (nes[e], e))
