"""Bisect the fused kernels (issue 13): train with every block fused except the named families, which run
the reference, through the project's own Trainer (``Trainer.fit``), the recipe of repro.sh.

Families are the block classes that carry a ``kernel`` attribute (``opengem.model.sequence.use_kernel``):
MultiHeadAttention (also PooledAttention), PyramidLevel, WukongLayer, CrossLayerAttention, CrossArch,
MultiSurfaceHead. The run folder's config.toml says ``model.gem.kernel = "fused"``; the families switched
to the reference are recorded in OUT/family_bisect.json.

Usage: python family_bisect.py OUT_DIR FAMILY[,FAMILY...] [section.key=value ...]
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

from opengem.ops.kernel import Kernel
from opengem.train.config import load_run_config
from opengem.train.trainer import Trainer

REPO = Path(__file__).resolve().parents[4]
DATA = "/work/s5/sim875/data"
RECIPE = ["data.train='day=00[0-4]'", "data.eval='day=005'", "train.steps=300", "train.threads=1",
          "train.progress=false", "train.eval_every=0", "model.gem.kernel='fused'"]


def main(out: str, families: list[str], overrides: list[str]) -> None:
    warnings.filterwarnings("ignore", category=FutureWarning)
    cfg = load_run_config(REPO / "configs" / "small.toml", RECIPE + overrides)
    with Trainer(cfg, out, DATA, force=True) as trainer:
        switched = [n for n, m in trainer.model.named_modules()
                    if hasattr(m, "kernel") and {c.__name__ for c in type(m).__mro__} & set(families)]
        if not switched:
            raise SystemExit(f"no block of {families} has a kernel")
        for name, m in trainer.model.named_modules():
            if name in switched:  # the block's own flag only: a family's children keep theirs
                m.kernel = Kernel.PYTORCH
        summary = trainer.fit()
    record = {"reference": families, "modules": switched}
    (Path(out) / "family_bisect.json").write_text(json.dumps(record, indent=1))
    ne = {k: round(v["ne"], 5) for k, v in summary["final_eval"].items() if k.startswith("all/")}
    print(f"{out}: reference {families} ({len(switched)} modules): {ne}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2].split(","), sys.argv[3:])
