"""Before reusing FM versions: is the stream they were trained on the one today's code simulates?

Usage: python stream_check.py CHECK_DIR. Simulates seed 100 of transfer-prod-small afresh into CHECK_DIR and
prints the md5 of days 0, 13 and 15 next to both copies' (/work/s6/h15/cal/pe2, pe1); seeds 101-102 are
compared between the two copies.
"""
import hashlib
import sys
from pathlib import Path

from opengem.transfer.experiment_config import load_experiment_config
from opengem.transfer.windows import prepare_data

root = Path(sys.argv[1])
cfg = load_experiment_config("configs/transfer-prod-small.toml")
prepare_data(cfg, 100, root / "seed100")


def md5(p: Path) -> str:
    return hashlib.md5(p.read_bytes()).hexdigest()


for seed, copies in ((100, ["check", "pe2", "pe1"]), (101, ["pe2", "pe1"]), (102, ["pe2", "pe1"])):
    for day in ("day=000", "day=013", "day=015"):
        hs = []
        for c in copies:
            base = root if c == "check" else Path("/work/s6/h15/cal") / c
            files = sorted((base / f"seed{seed}" / "data" / day).glob("*.parquet"))
            hs.append(",".join(md5(f)[:12] for f in files))
        print(seed, day, dict(zip(copies, hs)), "EQUAL" if len(set(hs)) == 1 else "DIFFER", flush=True)
