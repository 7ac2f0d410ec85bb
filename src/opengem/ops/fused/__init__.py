"""Hand-fused PyTorch twins of the reference ops: fewer, contiguous kernels; each tested against pytorch/."""
