"""Round 7, step 0 (docs/TRANSFER.md): are the streams rounds 5-6 used, copied with their FM versions, the
ones today's code simulates?

Usage: python stream_check_r7.py CHECK_DIR COPIES_DIR. Simulates seed 100 of transfer-prod-small afresh into
CHECK_DIR and prints the md5 of days 0, 13 and 15 next to both copies' (COPIES_DIR/pe2, COPIES_DIR/pe1);
seeds 101-102 are compared between the two copies. Exit status 1 when any differ (then the copies are not
used). Round 6's stream_check_r6.py unchanged but for this docstring.
"""

import hashlib
import sys
from pathlib import Path

from opengem.transfer.experiment_config import load_experiment_config
from opengem.transfer.windows import prepare_data

check, copies_dir = Path(sys.argv[1]), Path(sys.argv[2])
cfg = load_experiment_config("configs/transfer-prod-small.toml")
prepare_data(cfg, 100, check / "seed100")


def md5(p: Path) -> str:
    return hashlib.md5(p.read_bytes()).hexdigest()


differ = 0
for seed, copies in ((100, ["check", "pe2", "pe1"]), (101, ["pe2", "pe1"]), (102, ["pe2", "pe1"])):
    for day in ("day=000", "day=013", "day=015"):
        hs = []
        for c in copies:
            base = check if c == "check" else copies_dir / c
            files = sorted((base / f"seed{seed}" / "data" / day).glob("*.parquet"))
            hs.append(",".join(md5(f)[:12] for f in files) or "missing")
        differ += len(set(hs)) != 1
        print(seed, day, dict(zip(copies, hs)), "EQUAL" if len(set(hs)) == 1 else "DIFFER", flush=True)
sys.exit(1 if differ else 0)
