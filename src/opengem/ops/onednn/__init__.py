"""oneDNN twins of the ops (``kernel="onednn"``): CPU fp32 matrix products through oneDNN's own JIT kernels.

Why a twin and not PyTorch's default: on CPU PyTorch sends fp32 matmuls to MKL's sgemm, and MKL picks its
kernels by CPU vendor. Measured on an AMD EPYC (Zen 5, AVX-512) host, one thread: MKL sgemm 80-93 GFLOP/s
at n = 512-1024 (its AVX2 path), oneDNN's fp32 matmul on the same tensors 180-200 GFLOP/s. On Intel hosts
the two are close, which is why the training step chooses by measuring (``opengem.train.cpu_linear``).
"""
