"""Streaming conversion of a generated Criteo-layout log: rows/s and peak RSS of ``opengem convert table``.

    .venv/bin/python benchmarks/convert_bench.py [--rows 2000000] [--dir /tmp/convert_bench] [--keep]
        [--generate-only]

A multi-GB run (about 256 bytes a row: ``--rows 9000000`` writes 2.3 GB) is what issue 11 asks of the
importer: peak RSS under 2 GB whatever the file size. Check ``df -h`` on ``--dir`` first; the source
and the output are deleted afterwards unless ``--keep`` (``--generate-only`` writes the source and
stops, so that it can be generated while something else runs, then converted by a second call).

The source is Criteo's layout (tab-separated, no header: label, I1..I13 integers with ~20 % empty,
C1..C26 8-hex-digit categoricals with Zipf-distributed values and cardinalities from 10 to 2M, so
some features get vocabularies and some are hashed). The conversion runs as a separate process (the
real command line, progress bar off) so that its peak RSS is its own: ``ru_maxrss`` of the child.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv

INTS = [f"I{i}" for i in range(1, 14)]
CATS = [f"C{i}" for i in range(1, 27)]
CARDINALITY = [10, 100, 1_000, 10_000, 100_000, 2_000_000] * 5  # per C column, cycled
CHUNK = 250_000


def generate(path: Path, rows: int, seed: int = 0) -> float:
    """Write the source TSV in chunks; returns seconds."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    opts = pcsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")
    with pcsv.CSVWriter(path, pa.schema([(c, pa.int64()) for c in ["label", *INTS]]
                                        + [(c, pa.string()) for c in CATS]), write_options=opts) as w:
        for start in range(0, rows, CHUNK):
            n = min(CHUNK, rows - start)
            cols: dict[str, pa.Array] = {"label": pa.array((rng.random(n) < 0.25).astype(np.int64))}
            for c in INTS:
                x = rng.geometric(0.05, n).astype(np.int64)
                cols[c] = pa.array(x, mask=rng.random(n) < 0.2)
            for j, c in enumerate(CATS):
                ids = (rng.zipf(1.2, n) % CARDINALITY[j]).astype(np.uint64)
                hexes = np.char.mod("%08x", (ids * np.uint64(2654435761)) % np.uint64(1 << 32))
                cols[c] = pa.array(hexes.astype(object), pa.string(), mask=rng.random(n) < 0.05)
            w.write_table(pa.table(cols))
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--dir", default="/tmp/convert_bench")
    p.add_argument("--keep", action="store_true", help="keep the source and the output")
    p.add_argument("--generate-only", action="store_true", help="write the source (kept) and stop")
    args = p.parse_args()
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    src, out = root / f"criteo_layout_{args.rows}.tsv", root / "out"
    if not src.exists():
        print(f"generating {args.rows} rows ... {generate(src, args.rows):.1f} s", flush=True)
    if args.generate_only:
        print(f"{src}: {src.stat().st_size / 1e9:.2f} GB")
        return
    shutil.rmtree(out, ignore_errors=True)
    out.with_name("out.import.toml").unlink(missing_ok=True)  # a spec left by an earlier run
    cmd = [str(Path(sys.executable).parent / "opengem"), "convert", "table", "--src", str(src),
           "--format", "tsv", "--columns", ",".join(["label", *INTS, *CATS]), "--label", "label",
           "--infer-schema", "--out", str(out)]
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    load_after = os.getloadavg()
    if proc.returncode:
        sys.exit(f"convert failed ({proc.returncode}): {proc.stderr[-2000:]}")
    rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    summary = json.loads((out / "summary.json").read_text())
    size_mb = src.stat().st_size / 2**20
    print("| rows | source MB | seconds | rows/s | MB/s | peak RSS MB | hashed features | "
          "train/valid/test |")
    print("|---|---|---|---|---|---|---|---|")
    splits = "/".join(str(summary["splits"][s]["rows"]) for s in ("train", "valid", "test"))
    print(f"| {summary['rows']:,} | {size_mb:,.0f} | {dt:.1f} | {summary['rows'] / dt:,.0f} | "
          f"{size_mb / dt:.1f} | {rss_mb:,.0f} | {len(summary['hashed'])} of 39 | {splits} |")
    print(f"source {src.stat().st_size / 1e9:.2f} GB; load average (1/5/15 min) before "
          f"{'/'.join(f'{x:.2f}' for x in load_before)}, after {'/'.join(f'{x:.2f}' for x in load_after)}")
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
