"""Guards for the CPU install: a CUDA build pulled in by accident is a multi-GB mistake that still imports."""

import importlib.metadata as md

import pytest
import torch


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU machine legitimately has CUDA packages")
def test_no_cuda_packages_on_a_cpu_install():
    names = {d.metadata["Name"].lower() for d in md.distributions()}
    assert "fbgemm-gpu" not in names, "the CUDA fbgemm-gpu was installed (torchrec pulled with deps?)"
    assert not [n for n in names if n.startswith("nvidia-")], "nvidia-* CUDA wheels are installed"
    assert torch.version.cuda is None


def test_torch_and_fbgemm_are_the_locked_pair():
    import fbgemm_gpu  # noqa: F401  (import fails when the ABI pair is mixed)
    import torchrec  # noqa: F401

    assert torch.__version__.startswith("2.13.")
    assert md.version("fbgemm-gpu-cpu" if not torch.cuda.is_available() else "fbgemm-gpu").startswith("1.8")
