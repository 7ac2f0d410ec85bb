"""Test-session setup that must happen before anything imports torch.

Triton's interpreter (``TRITON_INTERPRET=1``) runs the ``ops/triton`` kernels on CPU tensors. Triton reads
the variable when it is imported, and importing torch imports Triton, so it is set here, before any test
module loads: setting it later leaves Triton's own library functions (``tl.sum``, ``tl.max``) compiled-mode
and every interpreted kernel fails. Kernels on CUDA tensors are refused under the interpreter, and the GPU
check (``benchmarks/gpu_check.sh``) runs outside pytest.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
