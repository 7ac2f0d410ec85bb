"""Own data at its edges (issue 15's promise, found by a session-54 bug hunt): a compressed source cut
short in its header is one line naming the file; new rows encoded with ``convert table --encoders`` (a test
split and an empty valid one) are evaluated with ``--partitions @test``."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from cli_helpers import one_error_line, run_cli
from test_readme_own_data import write_clicks

ROOT = Path(__file__).resolve().parents[1]


def test_a_gzip_cut_short_in_its_header_is_one_line(tmp_path: Path, capsys) -> None:  # type: ignore
    rows = "ts,user,click\n" + "".join(f"{i},u{i % 7},{i % 2}\n" for i in range(2000))
    full = gzip.compress(rows.encode())
    (tmp_path / "cut.csv.gz").write_bytes(full[:2000])  # the first 64 KiB read for the header ends early
    rc, err = run_cli(capsys, ["convert", "table", "--src", str(tmp_path / "cut.csv.gz"), "--label", "click",
                               "--infer-schema", "--split", "random", "--out", str(tmp_path / "d")])
    line = one_error_line(err, "convert")
    assert rc == 1 and "cut.csv.gz" in line and "cut short or corrupt" in line, line


def test_new_rows_through_the_encoders_are_evaluated_on_their_test_split(tmp_path: Path, capsys) -> None:  # type: ignore
    write_clicks(tmp_path / "clicks.csv", rows=1200)
    write_clicks(tmp_path / "day8.csv", rows=300)
    data, new, run = tmp_path / "mine", tmp_path / "mine-day8", tmp_path / "run"
    assert run_cli(capsys, ["convert", "table", "--src", str(tmp_path / "clicks.csv"), "--label", "click",
                            "--infer-schema", "--time", "ts", "--split", "time", "--out", str(data)])[0] == 0
    assert run_cli(capsys, ["train", "--config", str(ROOT / "configs" / "own.toml"), "--data", str(data),
                            "--out", str(run), "model.name=dlrm", "train.steps=4", "train.threads=1",
                            "train.progress=false"])[0] == 0
    assert run_cli(capsys, ["convert", "table", "--src", str(tmp_path / "day8.csv"), "--encoders", str(data),
                            "--out", str(new)])[0] == 0
    before = (run / "eval.json").read_text() if (run / "eval.json").exists() else None
    rc, err = run_cli(capsys, ["evaluate", "--run", str(run), "--data", str(new), "--partitions", "@test"])
    assert rc == 0, err
    out = json.loads((run / "eval-test.json").read_text())
    assert out["rows"] == 300 and out["partitions"] == ["test"]
    after = (run / "eval.json").read_text() if (run / "eval.json").exists() else None
    assert after == before  # the run's own default evaluation is not overwritten by other data's test split
