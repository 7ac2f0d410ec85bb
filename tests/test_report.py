"""opengem report: sections, embedded PNGs, missing pieces, comparisons, sweeps, and a real browser."""

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from opengem.bench.report import SECTIONS, build_report, write_report
from opengem.bench.report_data import ReportError, reliability
from opengem.bench.report_html import PNG_SIGNATURE

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.toml"
IMG_RE = re.compile(r'<img [^>]*src="data:image/png;base64,([A-Za-z0-9+/=]+)"')
RUN_SECTIONS = [s for s in SECTIONS if s != "scaling"]


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """A real tiny training run + evaluation (in-process, a few seconds)."""
    from opengem.train.config import load_run_config
    from opengem.train.evaluate import evaluate_run
    from opengem.train.trainer import train

    out = tmp_path_factory.mktemp("run")
    cfg = load_run_config(TINY, ["train.progress=false", "train.steps=8", "train.log_every=2",
                                 "train.eval_every=4", "train.eval_max_batches=2", "data.sim.rows=1500"])
    train(cfg, out)
    evaluate_run(out)
    return out


def section_ids(page: str) -> list[str]:
    return re.findall(r'<section id="([^"]+)"', page)


def pngs(page: str) -> list[bytes]:
    return [base64.b64decode(b, validate=True) for b in IMG_RE.findall(page)]


def fake_run(path: Path, *, eval_json: bool = True, model: str = "dcnv2", ne: float = 0.9) -> Path:
    """A run folder written by hand, in the trainer's formats, for the cases a real run cannot show fast."""
    path.mkdir(parents=True)
    (path / "config.toml").write_text(f'[model]\nname = "{model}"\n\n[train]\nsteps = 4\nlr = 0.001\n')
    metrics = {"feed/click": {"ne": ne, "auc": 0.7, "calibration": 1.1, "rows": 100, "base_rate": 0.05},
               "all/click": {"ne": ne + 0.01, "auc": 0.69, "calibration": 1.05, "rows": 150,
                             "base_rate": 0.04}}
    recs = [{"kind": "setup", "model": model, "flops_per_example": 1000, "world_size": 1}]
    recs += [{"kind": "train", "step": s, "loss": 0.5 / s, "examples_per_s": 1000.0 + s}
             for s in (1, 2, 3, 4)]
    recs += [{"kind": "eval", "step": s, "loss": 0.3,
              "metrics": {k: {"ne": v["ne"] + 0.1 / s, "auc": 0.7} for k, v in metrics.items()}}
             for s in (2, 4)]
    (path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    (path / "train_summary.json").write_text(json.dumps(
        {"model": model, "steps": 4, "examples": 400, "train_seconds": 0.4, "examples_per_s": 1000.0,
         "flops_per_example": 1000, "device": "cpu", "final_eval": None, "peak_rss_mb": 321.0,
         "memory": {"precision": "bf16", "activation_checkpointing": False},
         "startup": {"first_step_s": 1.5}}))
    if eval_json:
        (path / "eval.json").write_text(json.dumps({"model": model, "metrics": metrics,
                                                    "oracle": {"feed/click": 0.8}, "ne_base_rate": "NE = x"}))
    return path


def test_real_run_report_has_every_section_and_valid_pngs(real_run, tmp_path):
    out = write_report([real_run], tmp_path / "r.html")
    page = out.read_text()
    assert section_ids(page) == RUN_SECTIONS
    images = pngs(page)
    assert len(images) == page.count("<img ")  # every <img> carries an inline base64 PNG
    assert len(images) >= 4  # loss, NE, calibration, throughput
    for png in images:
        assert png.startswith(PNG_SIGNATURE) and b"IEND" in png[-16:]
    # the per surface x task table shows the evaluated keys and the oracle column
    ev = json.loads((real_run / "eval.json").read_text())
    for key in ev["metrics"]:
        assert f'<td class="l">{key}</td>' in page
    assert "oracle NE" in page
    assert "no eval.json" not in page
    # nothing external: no http(s) references, no scripts
    assert "http://" not in page and "https://" not in page and "<script" not in page


def test_default_out_is_inside_the_run(tmp_path):
    run = fake_run(tmp_path / "a")
    out = write_report([run])
    assert out == run / "report.html" and out.exists()


def test_out_replaces_an_earlier_report_but_no_other_file(tmp_path):
    from opengem.bench.report import ReportError

    run = fake_run(tmp_path / "a")
    log = (run / "metrics.jsonl").read_text()
    with pytest.raises(ReportError, match="metrics.jsonl: exists and is not an opengem report"):
        write_report([run], run / "metrics.jsonl")
    assert (run / "metrics.jsonl").read_text() == log
    out = write_report([run])
    assert write_report([run]) == out  # an earlier report is replaced


def test_run_without_eval_json_still_renders(tmp_path):
    run = fake_run(tmp_path / "noeval", eval_json=False)
    (run / "metrics.jsonl").open("a").write('{"kind": "train", "step": 5, "loss"')  # cut by a crash
    page = build_report([run])
    assert section_ids(page) == RUN_SECTIONS
    assert "no eval.json" in page and "opengem evaluate --run" in page
    assert "metrics.jsonl line 8: not JSON" in page
    assert len(pngs(page)) >= 2  # loss and throughput curves still drawn


def test_empty_run_folder_renders_with_notes(tmp_path):
    run = tmp_path / "bare"
    run.mkdir()
    (run / "config.toml").write_text("[model]\nname = 'gem'\n")
    page = build_report([run])
    assert "no metrics.jsonl" in page and "no train_summary.json" in page
    assert "no training loss recorded" in page


def test_comparison_page(tmp_path):
    a = fake_run(tmp_path / "a", model="dcnv2", ne=0.9)
    b = fake_run(tmp_path / "b", model="gem", ne=0.8)
    page = build_report([a, b])
    assert "opengem comparison: a vs b" in page
    assert section_ids(page) == RUN_SECTIONS
    # side-by-side NE table: one column per run, the values of each
    assert "<th>a</th><th>b</th>" in page
    assert "0.9000" in page and "0.8000" in page
    # config differences name the differing key with both values
    assert '<td class="l">model.name</td><td class="l">&quot;dcnv2&quot;</td>' in page
    assert "<th>peak_rss_mb</th>" in page  # numeric memory fields of train_summary.json are columns
    assert "<th>memory.activation_checkpointing</th>" not in page  # a setting, not a measurement
    assert '<td class="l">memory.precision</td><td>bf16</td>' in page and "startup.first_step_s" in page
    assert len(pngs(page)) >= 4


def test_same_folder_names_are_made_unique(tmp_path):
    a = fake_run(tmp_path / "x" / "run")
    b = fake_run(tmp_path / "y" / "run")
    page = build_report([a, b])
    assert "run vs run (2)" in page


def test_sweep_folder(tmp_path, real_run):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "scaling.csv").write_text("model,gflop_per_example,ne\ngem,0.5,0.91\ngem,1.0,0.88\n")
    (sweep / "fits.json").write_text(json.dumps({"gem": {"a": 1.5, "b": -0.07}, "efficiency": [{"r": 2.5}]}))
    (sweep / "sweep.toml").write_text('name = "tiny-sweep"\n')
    fake_run(sweep / "runs" / "gem-0")
    png = pngs(build_report([fake_run(tmp_path / "r")]))[0]
    (sweep / "scaling.png").write_bytes(png)
    page = build_report([sweep])
    assert section_ids(page) == ["overview", "scaling"]
    assert "gflop_per_example" in page and "0.8800" in page and "gem.b" in page
    assert pngs(page) == [png]
    assert "tiny-sweep" in page and "runs/gem-0" in page
    assert '<td class="l">efficiency</td>' not in page and "&quot;r&quot;: 2.5" in page  # lists: raw JSON
    both = build_report([real_run, sweep])
    assert section_ids(both) == [*RUN_SECTIONS, "scaling"]


def test_broken_sweep_png_is_skipped_not_shipped(tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "scaling.png").write_bytes(b"not a png")
    page = build_report([sweep])
    assert "not a PNG file" in page and "<img" not in page
    assert "no scaling.csv" in page


def test_predictions_give_reliability_curves(tmp_path):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    run = fake_run(tmp_path / "p")
    rng = np.random.default_rng(0)
    p = rng.uniform(0.01, 0.3, 400)
    y = (rng.uniform(size=400) < p).astype(float)
    pq.write_table(pa.table({"surface": ["feed"] * 400, "task": ["click"] * 400, "p": p, "y": y}),
                   run / "predictions.parquet")
    page = build_report([run])
    assert 'alt="reliability curve p"' in page
    assert "No predictions.parquet" not in page


def test_reliability_bins():
    import numpy as np

    p = np.array([0.1, 0.1, 0.9, 0.9])
    y = np.array([0.0, 1.0, 1.0, 1.0])
    pred, obs = reliability(p, y, bins=2)
    assert pred == pytest.approx([0.1, 0.9]) and obs == pytest.approx([0.5, 1.0])


def test_bad_paths_fail_clearly(tmp_path):
    with pytest.raises(ReportError, match="no such folder"):
        build_report([tmp_path / "missing"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReportError, match="neither a run folder"):
        build_report([tmp_path / "empty"])


def test_cli(tmp_path, capsys):
    from opengem.cli import main

    run = fake_run(tmp_path / "c")
    assert main(["report", str(run), "--out", str(tmp_path / "o.html")]) == 0
    assert (tmp_path / "o.html").exists() and "wrote" in capsys.readouterr().out
    assert main(["report", str(tmp_path / "nope")]) == 2


# --------------------------------------------------------------------------- a real browser
CHECK_SCRIPT = """<script>
window.addEventListener('load', () => {
  const res = Array.from(document.images).map(i => ({alt: i.alt, ok: i.complete && i.naturalWidth > 0,
                                                     w: i.naturalWidth, h: i.naturalHeight}));
  const pre = document.createElement('pre');
  pre.id = 'img-check';
  pre.textContent = JSON.stringify(res);
  document.body.appendChild(pre);
});
</script></body>"""


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def test_chromium_loads_every_image(real_run, tmp_path):
    exe = chromium()
    if exe is None:
        pytest.skip("chromium not installed (`make chromium` installs Debian's package as root)")
    page = build_report([real_run])
    n_img = page.count("<img ")
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("</body>", CHECK_SCRIPT))
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=3000",
           "--dump-dom", probe.as_uri()]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]
    m = re.search(r'<pre id="img-check">(.*?)</pre>', res.stdout, re.S)
    assert m, "the in-page check did not run: " + res.stdout[-500:]
    import html

    images = json.loads(html.unescape(m.group(1)))
    assert len(images) == n_img >= 4
    broken = [i for i in images if not i["ok"]]
    assert not broken, broken
    # the rendered DOM still holds every section
    for sid in RUN_SECTIONS:
        assert f'<section id="{sid}">' in res.stdout


def test_a_sweep_leaves_out_cut_rows_and_runs_moved_aside(tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "scaling.csv").write_text("model,gflop_per_example,ne\ngem,0.5,0.91\ngem,1.0,0.88\ndcnv2,0.\n")
    fake_run(sweep / "runs" / "gem-00")
    fake_run(sweep / "runs" / "gem-00.old-20261207T120000Z")  # a re-run with another config moved it aside
    page = build_report([sweep])
    assert "scaling.csv line 4: 2 fields, the header has 3 (cut short?); 1 such row(s) left out" in page
    assert "runs/gem-00" in page and "gem-00.old-" not in page


def test_an_online_run_reports_its_windows(tmp_path):
    """An online run has no train_summary.json: its windows (online_train) and progressive evaluations
    (online_eval) are its curves; the page said 'training did not finish?' and 'no training loss'."""
    run = tmp_path / "online"
    run.mkdir()
    (run / "config.toml").write_text("[model]\nname = 'gem'\n")
    metrics = {"all/click": {"ne": 0.95, "auc": 0.7}, "feed/click": {"ne": 0.94, "auc": 0.71}}
    recs = []
    for i, day in enumerate(("day=000", "day=001")):
        recs.append({"kind": "online_eval", "window": day, "version_evaluated": i, "rows": 100, "loss": 0.2,
                     "metrics": metrics})
        recs.append({"kind": "online_train", "window": day, "version": i + 1, "steps": 6, "rows": 100,
                     "loss": 0.19 - i / 100, "examples_per_s": 2000.0})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (run / "online_summary.json").write_text(json.dumps({"windows": 2, "versions": 2, "steps": 12,
                                                         "stopped": "idle 0s without a new partition"}))
    page = build_report([run])
    assert "training did not finish" not in page and "no training loss recorded" not in page
    assert "an online run: 2 window(s) trained, 2 version(s) published (idle 0s" in page
    assert "progressive evaluation of the last window" in page and len(pngs(page)) >= 2


def test_an_isoflop_study_folder_is_reported(tmp_path, real_run):
    """`opengem report` of an iso-FLOP study's folder was refused as neither a run nor a sweep."""
    study = tmp_path / "iso"
    study.mkdir()
    (study / "isoflop_runs.csv").write_text("run,family,budget,valid_ne\ngem-s0-b0,gem,0,0.91\n")
    (study / "isoflop.json").write_text(json.dumps({"reference": "gem", "budgets": [3.8e8, 1.2e9]}))
    (study / "isoflop.toml").write_text('base = "small.toml"\n')
    png = pngs(build_report([fake_run(tmp_path / "r")]))[0]
    (study / "isoflop.png").write_bytes(png)
    page = build_report([study])
    assert section_ids(page) == ["overview", "scaling"]
    assert "<h3>isoflop.json</h3>" in page and "gem-s0-b0" in page and "isoflop.toml" in page
    assert pngs(page) == [png] and "no scaling.csv" not in page
