"""The dense AdamW runs PyTorch's fused kernel where it can, with the same steps as the default one."""

import torch
from torch import nn

from opengem.train.config import TrainConfig
from opengem.train.optim import build_dense_optimizer, can_fuse_adamw


def params(seed: int) -> dict[str, nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return {"w1": nn.Parameter(torch.randn(64, 32, generator=g)),
            "b1": nn.Parameter(torch.randn(64, generator=g)),
            "w2": nn.Parameter(torch.randn(8, 64, generator=g)),
            "ln": nn.Parameter(torch.ones(8))}


def test_dense_adamw_is_fused_on_cpu_and_steps_like_the_default():
    cfg = TrainConfig(lr=1e-2, weight_decay=0.01)
    fused_p, ref_p = params(0), params(0)
    fused = build_dense_optimizer(fused_p, cfg)
    assert all(g["fused"] for g in fused.param_groups)
    ref = torch.optim.AdamW([{"params": [ref_p["w1"], ref_p["w2"]], "weight_decay": 0.01},
                             {"params": [ref_p["b1"], ref_p["ln"]], "weight_decay": 0.0}], lr=1e-2)
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        grads = {k: torch.randn(p.shape, generator=g) for k, p in fused_p.items()}
        for ps, opt in ((fused_p, fused), (ref_p, ref)):
            for k, p in ps.items():
                p.grad = grads[k].clone()
            opt.step()
    for k in fused_p:
        torch.testing.assert_close(fused_p[k], ref_p[k], rtol=1e-5, atol=1e-6, msg=k)
    # a checkpoint of one loads into the other (resume across the change)
    ref.load_state_dict(fused.state_dict())
    fused.load_state_dict(ref.state_dict())


def test_fused_adamw_only_where_the_kernel_applies():
    assert can_fuse_adamw([nn.Parameter(torch.zeros(3))]) is True
    assert can_fuse_adamw([]) is None
    assert can_fuse_adamw([nn.Parameter(torch.zeros(3, dtype=torch.int32), requires_grad=False)]) is None
    assert can_fuse_adamw([nn.Parameter(torch.zeros(3, device="meta"))]) is None
