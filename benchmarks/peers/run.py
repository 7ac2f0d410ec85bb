"""Peer comparison: DCNv2 in TorchRec (DMP + fused row-wise Adagrad, and plain modules), FuxiCTR,
torch-rechub and DeepCTR-Torch vs opengem's DCNv2 and GEM.

One dataset for all: the opengem simulator (default 200k rows over 5 days), sequences and multi-valued
features dropped, single task (click), the last day held out as the test set. The peers read it as
Parquet (sparse ids, dense floats, label) in their own venvs (benchmarks/peers/setup.sh); TorchRec's rows
run in opengem's venv (peer_torchrec.py); opengem trains on the same rows as a canonical dataset through
`opengem train`. Same embedding dim, cross layers, MLP widths, batch size, one epoch. ``--repeats N``
runs every row N times, interleaved (round r trains each library once), and the table gives the median
examples/s with the range, and the load average around each round; a peer that is not installed or fails
is a row saying why.

    .venv/bin/python benchmarks/peers/run.py [--rows 200000] [--repeats 6] [--work /tmp/opengem-peers]
    .venv/bin/python benchmarks/peers/run.py --rows 20000 --batch-size 512 --repeats 1   # a quick check
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PEERS = ("torchrec-dmp", "torchrec", "fuxictr", "torch-rechub", "deepctr-torch")
IN_OUR_VENV = ("torchrec-dmp", "torchrec")  # TorchRec is already in opengem's venv: peer_torchrec.py
LABEL = "click"  # the click task's label column in canonical Parquet


def simulate_data(work: Path, rows: int, days: int, emb_dim: int) -> Path:
    from opengem.data.sim_config import SimConfig
    from opengem.data.simulate import simulate

    cfg = SimConfig.from_dict({"rows": rows, "days": days, "emb_dim": emb_dim})
    out = work / "sim"
    marker = out / "summary.json"
    if marker.exists() and json.loads(marker.read_text()).get("config") == json.loads(
            json.dumps(cfg.to_dict())):
        return out
    simulate(cfg, out, force=True)
    return out


def flat_dataset(sim: Path, work: Path) -> tuple[Path, dict]:
    """The simulated dataset without sequences, multi-valued features and conversions: what the peers see."""
    from opengem.data.commit import mark_complete
    from opengem.data.dataset import Dataset
    from opengem.data.schema import FeatureSchema

    ds = Dataset(sim)
    d = ds.schema.to_dict()
    d["sequence"] = []
    d["sparse"] = [f for f in d["sparse"] if not f["multi_valued"]]
    d["task"] = [t for t in d["task"] if t["name"] == "click"]
    schema = FeatureSchema.from_dict(d, "peers-flat")
    if schema.tasks[0].label_column != LABEL:
        raise ValueError(f"{sim}: the click label column is {schema.tasks[0].label_column!r}, not {LABEL!r}")
    out = work / "flat"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    schema.save(out / "schema.toml")
    cols = schema.required_columns()
    for part in ds.partitions():
        (out / part).mkdir()
        for f in sorted((sim / part).glob("*.parquet")):
            pq.write_table(pq.read_table(f, columns=cols), out / part / f.name)
    mark_complete(out, "benchmarks/peers flat copy")
    return out, schema.to_dict()


def peer_files(flat: Path, schema: dict, work: Path, args: argparse.Namespace) -> Path:
    """train.parquet / test.parquet / spec.json for the peers: the same partitions opengem trains on."""
    from opengem.data.dataset import Dataset

    ds = Dataset(flat)
    out = work / "peer"
    out.mkdir(parents=True, exist_ok=True)
    sparse = [f["name"] for f in schema["sparse"]] + [schema["surface_column"]]
    vocab = {f["name"]: f["vocab"] for f in schema["sparse"]}
    vocab[schema["surface_column"]] = len(schema["surfaces"])
    dense = [f["name"] for f in schema["dense"]]
    rows = {}
    for split, spec in (("train", "@all_but_last"), ("test", "@last")):
        t = pa.concat_tables([pq.read_table(f, columns=[*sparse, *dense, LABEL]) for f in ds.files(spec)])
        if t[LABEL].null_count:
            raise ValueError(f"{flat}: {LABEL} has nulls in {split}")
        pq.write_table(t, out / f"{split}.parquet")
        rows[split] = t.num_rows
    spec = {"sparse": sparse, "dense": dense, "label": LABEL, "vocab": vocab, "emb_dim": args.emb_dim,
            "cross_layers": args.cross_layers, "mlp": args.mlp, "batch_size": args.batch_size, "lr": args.lr,
            "threads": args.threads, "seed": 0, "rows": rows}
    (out / "spec.json").write_text(json.dumps(spec, indent=2))
    return out


def run_peer(lib: str, data: Path, work: Path, timeout: int) -> dict:
    out = work / f"result-{lib}.json"
    if lib in IN_OUR_VENV:
        cmd = [sys.executable, str(HERE / "peer_torchrec.py"), "--lib", lib, "--data", str(data), "--out",
               str(out)]
    else:
        venv = REPO / ".peers" / lib
        py = venv / "bin" / "python"
        if (venv / "SKIPPED").exists():
            return {"lib": lib, "skipped": "install failed: " + (venv / "SKIPPED").read_text().strip()[-300:]}
        if not (venv / "READY").exists() or not py.exists():
            return {"lib": lib, "skipped": f"not installed (run bash benchmarks/peers/setup.sh {lib})"}
        cmd = [str(py), str(HERE / "peer_dcnv2.py"), "--lib", lib, "--data", str(data), "--out", str(out)]
    out.unlink(missing_ok=True)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"lib": lib, "skipped": f"timed out after {timeout}s"}
    if p.returncode != 0 or not out.exists():
        return {"lib": lib, "skipped": f"failed (exit {p.returncode}): {p.stderr.strip()[-400:]}"}
    return json.loads(out.read_text())


OPENGEM_RUNNER = """
import json, resource, sys, warnings
warnings.filterwarnings("ignore")
from opengem.train.config import load_run_config
from opengem.train.trainer import train
cfg_path, out, data, *ov = sys.argv[1:]
s = train(load_run_config(cfg_path or None, ov), out, data, force=True)
s["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(s))
"""


def run_opengem(spec: str, flat: Path, work: Path, args: argparse.Namespace) -> dict:
    """opengem's own trainer on the flat dataset: DMP + fused row-wise Adagrad for tables, AdamW dense.
    ``spec`` is a model name with optional ``@`` modifiers: ``@bf16`` for ``train.precision = "bf16"``
    (autocast, fp32 master weights), ``@blas`` for ``train.cpu_linear = "pytorch"`` (fp32 dense layers on
    PyTorch's BLAS instead of the default ``auto``, which takes oneDNN where it is faster)."""
    model, *mods = spec.split("@")
    unknown = set(mods) - {"bf16", "blas"}
    if unknown:
        raise SystemExit(f"--opengem {spec}: unknown modifier(s) {', '.join(sorted(unknown))} (bf16, blas)")
    precision = "bf16" if "bf16" in mods else "fp32"
    mlp = "[" + ",".join(map(str, args.mlp)) + "]"
    ov = [f"model.name={model}", f"model.embedding.d={args.emb_dim}", f"data.batch_size={args.batch_size}",
          "data.eval_batch_size=8192", "train.steps=0", "train.epochs=1", f"train.lr={args.lr}",
          "train.warmup_steps=0", f"train.threads={args.threads}", "train.progress=false",
          "train.log_every=50", "model.head.hidden=[]", "model.head.adapter_dim=0",
          f"train.precision={precision}", f"train.cpu_linear={'pytorch' if 'blas' in mods else 'auto'}"]
    cfg = ""
    if model == "dcnv2":
        ov += [f"model.dcnv2.num_cross_layers={args.cross_layers}", f"model.dcnv2.deep_mlp={mlp}",
               "model.dcnv2.structure='parallel'", "model.dcnv2.low_rank=0"]
    else:  # GEM: the tiny recipe's interaction sizes at this embedding width
        cfg = str(REPO / "configs" / "tiny.toml")
        ov += [f"model.gem.wukong.mlp_dims={mlp}"]
    run_dir = work / f"opengem-{spec}"
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [sys.executable, "-c", OPENGEM_RUNNER, cfg, str(run_dir), str(flat), *ov]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, cwd=REPO)
    except subprocess.TimeoutExpired:
        return {"lib": f"opengem {spec}", "skipped": f"timed out after {args.timeout}s"}
    if p.returncode != 0:
        return {"lib": f"opengem {spec}", "skipped": f"failed (exit {p.returncode}): {p.stderr[-400:]}"}
    s = json.loads(p.stdout.strip().splitlines()[-1])
    ev = (s.get("final_eval") or {}).get("all/click", {})
    return {"lib": f"opengem {spec}", "model": f"opengem {model} (run folder {run_dir})",
            "train_rows": s["examples"], "train_seconds": s["train_seconds"],
            "examples_per_s": s["examples_per_s"], "test_auc": ev.get("auc"),
            "test_logloss": ev.get("log_loss"), "peak_rss_mib": s["peak_rss_mib"],
            "test_rows": ev.get("rows")}


def summarize(lib: str, runs: list[dict]) -> dict:
    """One row per library from its repeats: median examples/s (and range), the median run's other numbers."""
    ok = [r for r in runs if "skipped" not in r]
    if not ok:
        return runs[-1] if runs else {"lib": lib, "skipped": "not run"}
    ok.sort(key=lambda r: r["examples_per_s"])
    rates = [r["examples_per_s"] for r in ok]
    return {**ok[(len(ok) - 1) // 2], "examples_per_s": statistics.median(rates),
            "min_examples_per_s": rates[0], "max_examples_per_s": rates[-1], "repeats": len(ok),
            "failed_repeats": len(runs) - len(ok)}


def table(results: list[dict]) -> str:
    head = (f"{'library':<16}{'examples/s':>12}{'x best peer':>12}{'range':>16}{'n':>3}{'peak RSS MiB':>14}"
            f"{'test AUC':>10}{'logloss':>9}{'train s':>9}")
    lines = [head, "-" * len(head)]
    peers = [r["examples_per_s"] for r in results
             if "skipped" not in r and not r["lib"].startswith("opengem")]
    best = max(peers, default=None)
    for r in results:
        if "skipped" in r:
            lines.append(f"{r['lib']:<16}skipped: {r['skipped'].splitlines()[-1] if r['skipped'] else ''}")
            continue
        lo = r.get("min_examples_per_s", r["examples_per_s"])
        hi = r.get("max_examples_per_s", r["examples_per_s"])
        ratio = f"{r['examples_per_s'] / best:>12.2f}" if best else f"{'-':>12}"
        lines.append(f"{r['lib']:<16}{r['examples_per_s']:>12,.0f}{ratio}{f'{lo:,.0f}-{hi:,.0f}':>16}"
                     f"{r.get('repeats', 1):>3}{r['peak_rss_mib']:>14,.0f}{r['test_auc']:>10.4f}"
                     f"{r['test_logloss']:>9.4f}{r['train_seconds']:>9.1f}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--days", type=int, default=5, help="the last day is the test set")
    ap.add_argument("--emb-dim", type=int, default=16)
    ap.add_argument("--cross-layers", type=int, default=3)
    ap.add_argument("--mlp", type=lambda s: [int(x) for x in s.split(",")], default=[400, 400, 400])
    ap.add_argument("--batch-size", type=int, default=4096)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--peers", default=",".join(PEERS), help="comma-separated subset (or '' for none)")
    ap.add_argument("--opengem", default="dcnv2,gem",
                    help="opengem models to train, NAME[@bf16][@blas] ('' for none)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/opengem-peers"))
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per training")
    ap.add_argument("--repeats", type=int, default=1, help="interleaved rounds; the table gives the median")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1 (got {args.repeats})")
    args.work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    sim = simulate_data(args.work, args.rows, args.days, args.emb_dim)
    flat, schema = flat_dataset(sim, args.work)
    data = peer_files(flat, schema, args.work, args)
    spec = json.loads((data / "spec.json").read_text())
    print(f"data: {spec['rows']} rows ({len(spec['sparse'])} sparse incl. surface, "
          f"{len(spec['dense'])} dense, label {LABEL}) in {time.perf_counter() - t0:.0f}s -> {data}",
          flush=True)
    libs = [p for p in args.peers.split(",") if p]
    models = [m for m in args.opengem.split(",") if m]
    runs: dict[str, list[dict]] = {name: [] for name in [*libs, *(f"opengem {m}" for m in models)]}
    loads = []
    for rnd in range(args.repeats):
        loads.append({"round": rnd, "before": os.getloadavg()})
        for lib in libs:
            if runs[lib] and "skipped" in runs[lib][-1] and "not installed" in runs[lib][-1]["skipped"]:
                continue
            print(f"round {rnd + 1}/{args.repeats}: training {lib} ...", flush=True)
            runs[lib].append({**run_peer(lib, data, args.work, args.timeout), "loadavg": os.getloadavg()})
        for model in models:
            print(f"round {rnd + 1}/{args.repeats}: training opengem {model} ...", flush=True)
            runs[f"opengem {model}"].append({**run_opengem(model, flat, args.work, args),
                                             "loadavg": os.getloadavg()})
        loads[-1]["after"] = os.getloadavg()
    results = [summarize(name, rs) for name, rs in runs.items()]
    load = os.getloadavg()
    report = {"spec": spec, "results": results, "runs": runs, "loadavg_rounds": loads, "loadavg": load,
              "cpus": os.cpu_count()}
    (args.work / "peers.json").write_text(json.dumps(report, indent=2))
    print()
    print(table(results))
    print("x best peer: median examples/s over the fastest non-opengem row's median; load average (1 min) "
          "before each round: " + ", ".join(f"{x['before'][0]:.2f}" for x in loads))
    print(f"\nload average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs "
          f"(shared machine); details: {args.work / 'peers.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
