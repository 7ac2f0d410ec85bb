"""The README's "Your own data" commands, run exactly as written on a small generated CSV."""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Your own data", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line.strip()]


def write_clicks(path: Path, rows: int = 3000) -> None:
    rng = np.random.default_rng(0)
    user, ad = rng.integers(0, 200, rows), rng.integers(0, 60, rows)
    site, price = rng.choice(["news", "games", "shop"], rows), rng.gamma(2.0, 1.0, rows)
    logit = -1.5 + 0.9 * (user % 7 == 0) + 0.7 * (ad % 5 == 0) + 0.4 * (site == "games") - 0.2 * price
    click = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(int)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["ts", "user", "ad", "site", "price", "click"])
        for i in range(rows):
            row = [1_700_000_000 + 60 * i, f"u{user[i]}", f"ad{ad[i]}", site[i], round(float(price[i]), 3)]
            w.writerow([*row, click[i]])


def test_readme_own_data_example_runs_end_to_end(tmp_path):
    commands = readme_commands()
    assert len(commands) <= 5 and commands[0].startswith("opengem convert table")
    write_clicks(tmp_path / "clicks.csv")
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "own.toml").write_text((ROOT / "configs" / "own.toml").read_text())
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    last = None
    for line in commands:
        argv = shlex.split(line)
        assert argv[0] == "opengem"
        last = subprocess.run([sys.executable, "-m", "opengem.cli", *argv[1:]], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)
        assert last.returncode == 0, f"{line}\n{last.stderr[-2000:]}"
    table = last.stdout
    for name in ("mine-gem", "mine-dcnv2", "mine-dlrm"):
        assert f"{name} NE" in table
        result = json.loads((tmp_path / "runs" / name / "eval-test.json").read_text())
        assert result["partitions"] == ["test"] and result["metrics"]["all/click"]["auc"] is not None
    assert (tmp_path / "data" / "mine.import.toml").exists()
