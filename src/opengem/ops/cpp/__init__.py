"""C++ CPU kernels, each beside its plain-PyTorch reference in ``ops/pytorch/`` and compiled on first use
with ``torch.utils.cpp_extension`` (``OPENGEM_CPP_KERNELS=0``: never built, never used)."""
