import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from opengem.config import ConfigError
from opengem.data.dataset import Dataset
from opengem.demo import equal_flops_steps, gap_closed, load_demo_config, main
from opengem.train.config import load_run_config

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.toml"


def test_demo_tiny(tmp_path, capsys):
    # max_epochs=0: no one-pass cap, so the tiny DLRM spends GEM's FLOPs in full (the cap: below)
    assert main(["--config", str(TINY), "--out", str(tmp_path), "train.progress=false", "train.steps=6",
                 "--set", 'overrides.dlrm=["model.embedding.d=6"]', "--set", "max_epochs=0"]) == 0
    text = capsys.readouterr().out
    demo = load_demo_config(None, [])
    summaries = {}
    for name in ("gem", "dlrm", "dcnv2"):
        ev = json.loads((tmp_path / name / "eval.json").read_text())
        assert ev["model"] == name
        assert "feed/click" in ev["metrics"] and "oracle" in ev
        assert ev["metrics"]["all/click"]["calibration"] is not None
        assert Path(ev["data"]) == (tmp_path / "data").resolve()  # every run on the same data
        summaries[name] = json.loads((tmp_path / name / "train_summary.json").read_text())
        cfg_text = (tmp_path / name / "config.toml").read_text()
        assert f"lr = {demo.lr[name]}" in cfg_text or f"lr = {demo.lr[name]:g}" in cfg_text  # its own rate
        widths = [line for line in cfg_text.splitlines() if line.startswith("d = ")]
        assert widths == (["d = 6"] if name == "dlrm" else ["d = 16"]), (name, widths)  # its own only
    assert (tmp_path / "data" / "summary.json").exists()
    # equal training FLOPs: each baseline's 3 x FLOPs/example x rows is GEM's to within half a batch
    gem = summaries["gem"]
    c_gem = 3 * gem["flops_per_example"] * gem["examples"]
    assert summaries["dlrm"]["examples"] > 5 * gem["examples"]  # tiny DLRM: ~1/8 of GEM's FLOPs/example
    for name in ("dlrm", "dcnv2"):
        s = summaries[name]
        assert abs(3 * s["flops_per_example"] * s["examples"] - c_gem) <= 3 * s["flops_per_example"] * 64
    for col in ("gem NE", "dlrm NE", "dcnv2 NE", "gem cal", "dcnv2 cal", "oracle NE", "gap closed"):
        assert col in text, col


def test_equal_flops_steps_and_gap_share():
    assert equal_flops_steps(1000, 300, 100, 100) == 30  # a third of the FLOPs/example: 3x the rows
    assert equal_flops_steps(10, 1, 1000, 64) == 1  # at least one step
    # a cheaper baseline would read rows again to spend GEM's FLOPs: the one-pass cap stops it first
    assert equal_flops_steps(1000, 300, 100, 100, max_steps=12) == 12
    assert equal_flops_steps(1000, 300, 100, 100, max_steps=40) == 30  # under the cap: GEM's FLOPs exactly
    res = {"dlrm": {"metrics": {"all/click": {"ne": 0.9}}}, "gem": {"metrics": {"all/click": {"ne": 0.85}}},
           "bad": {"metrics": {"all/click": {"ne": 0.95}}}}
    g = gap_closed(res, {"all/click": 0.8})
    assert g["gem"]["all/click"] == pytest.approx(0.5) and g["bad"]["all/click"] == pytest.approx(-0.5)
    assert g["dlrm"]["all/click"] == 0.0
    assert gap_closed(res, {"all/click": 0.95})["gem"]["all/click"] is None  # oracle above DLRM: undefined


def test_demo_config_refuses_bad_values():
    with pytest.raises(ConfigError, match="unknown model"):
        load_demo_config(None, ['baselines=["nope"]'])
    with pytest.raises(ConfigError, match="> 0"):
        load_demo_config(None, ["lr.gem=0"])
    with pytest.raises(ConfigError, match="same data"):
        load_demo_config(None, ['overrides.dlrm=["data.sim.rows=10"]'])
    with pytest.raises(ConfigError, match="unknown model"):
        load_demo_config(None, ['overrides.nope=["model.embedding.d=8"]'])
    with pytest.raises(ConfigError, match="max_epochs"):
        load_demo_config(None, ["max_epochs=-1"])


NOT_MET = ("issue 14's demo promise is not met since session 39: with the history counts every family "
           "reads (data.sim.match_recent = 8), DCNv2's pooled click NE is below GEM's on seeds 0-4 (by "
           "0.0021 on the mean with session 42's cross rank 64 and window 8; GEM leads conversion on four; "
           "benchmarks/results/2026-12-06-s42/demo/); strict, so a recipe that meets it again fails here "
           "until this mark goes")


@pytest.mark.slow
@pytest.mark.xfail(strict=True, raises=AssertionError, reason=NOT_MET)
def test_demo_gem_has_the_best_pooled_ne_on_seed_0(tmp_path):
    """Issue 14's promise as a newcomer sees it: `make demo` (its own recipe, equal training FLOPs, every
    family at its own tuned rate), seed 0 -- GEM's pooled NE is the best of the three on both tasks."""
    assert main(["--out", str(tmp_path), "train.progress=false"]) == 0
    ne = {m: json.loads((tmp_path / m / "eval.json").read_text())["metrics"]
          for m in ("gem", "dlrm", "dcnv2")}
    for task in ("all/click", "all/conversion"):
        others = {m: ne[m][task]["ne"] for m in ("dlrm", "dcnv2")}
        assert ne["gem"][task]["ne"] < min(others.values()), (task, ne["gem"][task]["ne"], others)


def test_demo_baselines_stop_after_one_pass(tmp_path):
    """The default cap (max_epochs = 1): a baseline cheaper than GEM reads each training row at most once
    instead of reading rows again to spend GEM's FLOPs (a second pass over click logs overfits)."""
    assert main(["--config", str(TINY), "--out", str(tmp_path), "train.progress=false", "train.steps=6",
                 "--set", 'overrides.dlrm=["model.embedding.d=6"]', "--set", 'baselines=["dlrm"]']) == 0
    ds = Dataset(tmp_path / "data")
    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in ds.files(load_run_config(TINY).data.train))
    gem, dlrm = (json.loads((tmp_path / m / "train_summary.json").read_text()) for m in ("gem", "dlrm"))
    assert dlrm["examples"] <= rows < 5 * gem["examples"]  # uncapped it would read > 5x GEM's rows
    assert 3 * dlrm["flops_per_example"] * dlrm["examples"] < 3 * gem["flops_per_example"] * gem["examples"]
