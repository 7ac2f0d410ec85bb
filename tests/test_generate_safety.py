"""``opengem generate`` never mixes side-table parts made with different settings, and an interrupted run
leaves a side table the reader refuses (issue 10, §2 and §3).

One tiny FM (two versions over a 3-day simulated dataset) is trained once for the module; each test
works on its own copy of the side-table folder.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from opengem import cli
from opengem.data.commit import MARKER, OutputExistsError
from opengem.data.sim_config import SimConfig
from opengem.data.simulate import simulate
from opengem.errors import DatasetError, UsageError
from opengem.train.config import load_run_config
from opengem.transfer import generate as gen_mod
from opengem.transfer.generate import SETTINGS, generate, read_side_table
from opengem.transfer.knowledge import KnowledgeTable
from opengem.transfer.versions import train_fm_versions, version_dir, write_manifest

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.toml"
PARTS = ["day=000", "day=001", "day=002"]


@pytest.fixture(scope="module")
def fm(tmp_path_factory):
    root = tmp_path_factory.mktemp("gen")
    cfg = load_run_config(TINY, ["train.progress=false", "data.sim.rows=600", "train.steps=2",
                                 "train.warmup_steps=1"])
    simulate(SimConfig.from_dict(dict(cfg.data.sim)), root / "data")
    train_fm_versions(cfg, root / "data", root / "fm")
    generate(root / "fm", root / "data", root / "side", batch_size=256)
    return root


@pytest.fixture
def side(fm, tmp_path) -> Path:
    out = tmp_path / "side"
    shutil.copytree(fm / "side", out)
    return out


def part_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.parquet")) if p.is_file()} | {
        p.name: p.read_bytes() for p in out.glob(SETTINGS)}


def test_rerun_with_another_lag_is_refused_naming_the_difference(fm, side, capsys):
    before = part_bytes(side)
    args = ["generate", "--fm", str(fm / "fm"), "--data", str(fm / "data"), "--out", str(side), "--lag", "1"]
    assert cli.main(args) == 2  # before: exit 0, old lag-0 parts kept under a manifest saying lag 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--lag 0 -> 1" in err and str(side) in err
    assert part_bytes(side) == before
    assert json.loads((side / "manifest.json").read_text())["lag"] == 0


def test_rerun_with_another_fm_or_embeddings_is_refused(fm, side, tmp_path):
    other = tmp_path / "fm2"
    shutil.copytree(fm / "fm", other)
    with pytest.raises(OutputExistsError, match=r"--fm .*fm -> .*fm2"):
        generate(other, fm / "data", side)
    with pytest.raises(OutputExistsError, match=r"pinned version \(--fm RUN@N\) \(none\) -> 1"):
        generate(f"{fm / 'fm'}@1", fm / "data", side)
    with pytest.raises(OutputExistsError, match=r"--embeddings user,ad,trunk -> user"):
        generate(fm / "fm", fm / "data", side, embeddings=("user",))


def test_same_settings_resume_and_a_later_version_is_accepted(fm, side, tmp_path):
    again = generate(fm / "fm", fm / "data", side)
    assert again["skipped_parts"] == 3 and again["rows"] == 0
    assert len(read_side_table(side)) == 600
    # a version published since, trained through a time after every generated row, changes no row
    run = tmp_path / "fm_more"
    shutil.copytree(fm / "fm", run)
    side2 = tmp_path / "side2"
    shutil.copytree(fm / "side", side2)
    settings = json.loads((side2 / SETTINGS).read_text())
    settings["fm"] = str(run.resolve())
    settings["versions"] = [{**v, "path": str(run.resolve() / "versions" / Path(v["path"]).name)}
                            for v in settings["versions"]]
    (side2 / SETTINGS).write_text(json.dumps(settings))
    late = version_dir(run, 3)
    late.mkdir()
    write_manifest(late, 3, 2**40)
    assert generate(run, fm / "data", side2)["skipped_parts"] == 3
    early = version_dir(run, 4)
    early.mkdir()
    write_manifest(early, 4, 0)  # older than every generated row: rows already written would change
    with pytest.raises(OutputExistsError, match="FM version 4 .* applies to rows already generated"):
        generate(run, fm / "data", side2)


def test_an_interrupted_generate_is_refused_by_the_reader_and_resumes(fm, tmp_path, monkeypatch):
    out = tmp_path / "side"
    real = gen_mod._load_version

    class StopOnSecondBatch(torch.nn.Module):  # Ctrl-C in the middle of a part, after its first batch
        def __init__(self, model):
            super().__init__()
            self.model, self.calls = model, 0

        def forward(self, batch):
            self.calls += 1
            if self.calls == 2:
                raise KeyboardInterrupt
            return self.model(batch)

    monkeypatch.setattr(gen_mod, "_load_version", lambda *a: StopOnSecondBatch(real(*a)))
    with pytest.raises(KeyboardInterrupt):
        generate(fm / "fm", fm / "data", out, batch_size=64)  # day=000 has no version older than it
    assert sorted(p.name for p in out.iterdir()) == ["day=000.parquet", SETTINGS]  # no temp part left
    with pytest.raises(DatasetError, match=f"no {MARKER} marker.*did not finish"):
        read_side_table(out)  # before: read the one finished part as if it were the whole table
    monkeypatch.setattr(gen_mod, "_load_version", real)
    m = generate(fm / "fm", fm / "data", out, batch_size=64)
    assert m["skipped_parts"] == 1 and m["rows"] == 400
    got, want = read_side_table(out), read_side_table(fm / "side")
    for col in ("example_id", "fm_version"):
        assert got[col].to_pylist() == want[col].to_pylist()
    np.testing.assert_allclose(got["fm_logit_click"].to_numpy(), want["fm_logit_click"].to_numpy(), rtol=1e-4,
                               atol=1e-5)
    with pytest.raises(DatasetError, match=r"no part for \['day=009'\]"):
        read_side_table(out, ["day=009"])


def test_parts_of_unknown_origin_are_refused(fm, tmp_path):
    out = tmp_path / "side"
    out.mkdir()
    shutil.copy(fm / "side" / "day=000.parquet", out)
    with pytest.raises(OutputExistsError, match=f"no {SETTINGS}"):
        generate(fm / "fm", fm / "data", out)
    assert sorted(p.name for p in out.iterdir()) == ["day=000.parquet"]


def test_user_mistakes_are_named_errors_not_crashes(fm, tmp_path):
    with pytest.raises(UsageError, match=r"--embeddings nope: the FM's outputs have no \['nope'\]"):
        generate(fm / "fm", fm / "data", tmp_path / "side", embeddings=("nope",))
    with pytest.raises(DatasetError, match=r"side table lacks \['fm_logit_like'\]"):
        KnowledgeTable.from_side_table(read_side_table(fm / "side"), ["like"])
