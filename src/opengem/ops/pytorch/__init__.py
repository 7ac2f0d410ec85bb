"""Reference implementations of the ops (PyTorch + FBGEMM jagged ops); faster kernels test against them."""
