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

import pytest  # noqa: E402  (after TRITON_INTERPRET, on purpose)


@pytest.fixture(autouse=True)
def _own_cpu_linear_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test gets its own record of ``train.cpu_linear = auto``'s measurement (tests patch the probe),
    and nothing is written into the user's cache folder."""
    path = tmp_path_factory.mktemp("cpu_linear") / "cpu_linear.json"
    monkeypatch.setenv("OPENGEM_CPU_LINEAR_CACHE", str(path))
