"""Simulate the default iso-FLOP study's stream once into OUT (as `opengem scale --design isoflop` does)."""
import sys
from pathlib import Path

from opengem.bench.isoflop import load_isoflop_config, prepare_study

cfg = load_isoflop_config("configs/isoflop.toml")
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
st = prepare_study(cfg, out, None, [], print)
print("data:", st.data)
