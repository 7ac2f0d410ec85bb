"""Loader throughput: examples/s from canonical Parquet into Batch, per worker count.

    .venv/bin/python benchmarks/bench_loader.py --data DIR [--batch-size 1024] [--workers 0,1,2] [--rows N]

The timed loop only iterates Batches (no model), so it measures reading, checking and batching.
"""

from __future__ import annotations

import argparse
import resource
import time

from opengem.data.dataset import Dataset
from opengem.data.loader import ParquetLoader


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--workers", default="1,2")
    p.add_argument("--rows", type=int, default=0, help="stop after this many rows (0 = all)")
    args = p.parse_args()
    ds = Dataset(args.data)
    files = ds.files()
    print(f"{args.data}: {len(files)} files, schema {ds.schema.name!r}, batch_size {args.batch_size}")
    print(f"{'workers':>7} {'rows':>10} {'seconds':>8} {'examples/s':>11} {'events/row':>10} "
          f"{'maxrss MB':>9}")
    for w in [int(x) for x in args.workers.split(",")]:
        loader = ParquetLoader(files, ds.schema, args.batch_size, num_workers=w)
        rows = events = 0
        t0 = time.perf_counter()
        for b in loader:
            rows += len(b)
            events += sum(int(s.lengths.sum()) for s in b.sequences.values())
            if args.rows and rows >= args.rows:
                break
        dt = time.perf_counter() - t0
        rss = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024
        print(f"{w:>7} {rows:>10} {dt:>8.1f} {rows / dt:>11,.0f} {events / max(rows, 1):>10.1f} {rss:>9.0f}")


if __name__ == "__main__":
    main()
