"""One InterFormer Sequence Arch of GEM-small (d 32, 2 heads, 32 tokens, batch 512, fused kernels): eager
vs ``torch.compile(fullgraph=True, dynamic=False)``, fwd + bwd, six interleaved rounds of 5 calls, process
CPU ms.

    .venv/bin/python sequence_arch_compile_probe.py
"""
import copy
import os
import time

import torch

from opengem.model.interformer import InterFormerConfig, SequenceArch
from opengem.model.sequence import use_kernel

torch.set_num_threads(1)
torch.manual_seed(0)
B, L, d = 512, 32, 32
eager = use_kernel(SequenceArch(d, InterFormerConfig(num_layers=2, num_heads=2)), "fused")
compiled = torch.compile(copy.deepcopy(eager), fullgraph=True, dynamic=False)
x_sum = torch.randn(B, 4, d, requires_grad=True)
s = torch.randn(B, L, d, requires_grad=True)
mask = torch.arange(L)[None] < torch.randint(4, L + 1, (B,))[:, None]


def step(mod: torch.nn.Module) -> None:
    mod(x_sum, s, mask).sum().backward()


t = time.time()
step(compiled)
diff = (eager(x_sum, s, mask) - compiled(x_sum, s, mask)).abs().max()
print(f"compile {time.time() - t:.1f} s; max |diff| {diff:.2e}")
ms: dict[str, list[float]] = {"eager": [], "compiled": []}
for _ in range(6):
    for name, mod in (("eager", eager), ("compiled", compiled)):
        c = time.process_time()
        for _ in range(5):
            step(mod)
        ms[name].append((time.process_time() - c) / 5 * 1e3)
for name, v in ms.items():
    print(f"{name:8s} median {sorted(v)[3]:.1f} ms fwd + bwd  {[round(x, 1) for x in v]}")
print("load", os.getloadavg())
