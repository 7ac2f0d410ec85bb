"""Making a batch outside training prints nothing: torch.fx's one-off warning about its own API stays out."""

import subprocess
import sys
from pathlib import Path

TINY = Path(__file__).resolve().parents[1] / "configs" / "schemas" / "tiny.toml"


def test_a_predictor_process_making_batches_prints_no_torch_fx_warning():
    code = ("from opengem.data.random_batch import random_batch\n"
            "from opengem.data.schema import FeatureSchema\n"
            f"random_batch(FeatureSchema.load({str(TINY)!r}), 5, seed=0)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "is_fx_tracing" not in res.stderr
