import json
from pathlib import Path

from opengem.demo import main

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.toml"


def test_demo_tiny(tmp_path, capsys):
    assert main(["--config", str(TINY), "--out", str(tmp_path), "train.progress=false", "train.steps=6"]) == 0
    text = capsys.readouterr().out
    for name in ("gem", "dlrm"):
        ev = json.loads((tmp_path / name / "eval.json").read_text())
        assert ev["model"] == name
        assert "feed/click" in ev["metrics"] and "oracle" in ev
        assert Path(ev["data"]) == (tmp_path / "data").resolve()  # both runs on the same data
    assert (tmp_path / "data" / "summary.json").exists()
    assert "gem NE" in text and "dlrm NE" in text and "oracle NE" in text
