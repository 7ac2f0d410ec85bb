import pytest
import torch
import torch.nn.functional as F

from opengem.model.heads import HeadConfig, MultiSurfaceHead, masked_bce


def test_masked_bce_ignores_unobserved_loss_and_gradient():
    logits = torch.tensor([[0.3, float("inf")], [-1.2, 2.0], [5.0, -0.7]], requires_grad=True)
    labels = torch.tensor([[1.0, float("nan")], [0.0, 1.0], [0.0, 0.0]])
    mask = torch.tensor([[True, False], [True, True], [False, True]])
    loss = masked_bce(logits, labels, mask)
    obs = [(0, 0), (1, 0), (1, 1), (2, 1)]
    ref = sum(F.binary_cross_entropy_with_logits(logits[i, j], labels[i, j]) for i, j in obs) / len(obs)
    assert torch.isfinite(loss) and torch.allclose(loss, ref)
    loss.backward()
    assert logits.grad[0, 1] == 0 and logits.grad[2, 0] == 0
    assert (logits.grad[mask] != 0).all()


def test_masked_bce_task_weights_and_empty_mask():
    logits = torch.randn(4, 2, requires_grad=True)
    labels = (torch.rand(4, 2) > 0.5).float()
    mask = torch.ones(4, 2, dtype=torch.bool)
    w = torch.tensor([1.0, 0.0])
    loss = masked_bce(logits, labels, mask, w)
    ref = F.binary_cross_entropy_with_logits(logits[:, 0], labels[:, 0], reduction="sum") / 8
    assert torch.allclose(loss, ref)
    loss.backward()
    assert (logits.grad[:, 1] == 0).all()
    none = masked_bce(logits, labels, torch.zeros(4, 2, dtype=torch.bool))
    assert none.item() == 0.0
    with pytest.raises(ValueError, match="task_weights"):
        masked_bce(logits, labels, mask, torch.ones(3))


def test_head_shapes_and_gather_own_surface():
    torch.manual_seed(0)
    head = MultiSurfaceHead(10, 3, 2, HeadConfig(hidden=[16, 8], adapter_dim=4))
    x = torch.randn(6, 10)
    surface = torch.tensor([0, 1, 2, 2, 1, 0])
    logits, trunk = head(x, surface)
    assert logits.shape == (6, 2) and trunk.shape == (6, 8)
    # each row equals the computation with its own surface's parameters
    for i, s in enumerate(surface.tolist()):
        h = trunk[i]
        h = h + F.relu(h @ head.adapter_down[s] + head.adapter_down_bias[s]) @ head.adapter_up[s]
        assert torch.allclose(logits[i], h @ head.out_weight[s] + head.out_bias[s], atol=1e-6)


def test_surfaces_do_not_share_adapter_parameters():
    torch.manual_seed(0)
    head = MultiSurfaceHead(10, 3, 2, HeadConfig(hidden=[16], adapter_dim=4))
    x = torch.randn(5, 10)
    surface = torch.zeros(5, dtype=torch.long)
    logits, _ = head(x, surface)
    logits.sum().backward()
    for p in (head.adapter_down, head.adapter_down_bias, head.adapter_up, head.out_weight, head.out_bias):
        assert p.grad[0].abs().sum() > 0
        assert (p.grad[1:] == 0).all()
    # changing surface 1's adapter leaves surface-0 predictions unchanged
    with torch.no_grad():
        head.adapter_up[1].add_(1.0)
        head.adapter_down[1].add_(1.0)
    assert torch.allclose(head(x, surface)[0], logits)


def test_head_without_adapter_or_trunk_and_bad_surface():
    head = MultiSurfaceHead(6, 2, 3, HeadConfig(hidden=[], adapter_dim=0))
    logits, trunk = head(torch.randn(4, 6), torch.tensor([0, 1, 1, 0]))
    assert logits.shape == (4, 3) and trunk.shape == (4, 6)
    with pytest.raises(ValueError, match="surface"):
        head(torch.randn(2, 6), torch.tensor([0, 2]))


def test_parameter_names_and_shapes_are_the_checkpoint_format():
    """The grouped head op reads the same stacked [S, ...] parameters the per-example head had: old
    checkpoints load unchanged."""
    head = MultiSurfaceHead(10, 3, 2, HeadConfig(hidden=[16, 8], adapter_dim=4))
    shapes = {k: tuple(v.shape) for k, v in head.state_dict().items()}
    assert shapes == {"trunk.0.weight": (16, 10), "trunk.0.bias": (16,), "trunk.2.weight": (8, 16),
                      "trunk.2.bias": (8,), "adapter_down": (3, 8, 4), "adapter_down_bias": (3, 4),
                      "adapter_up": (3, 4, 8), "out_weight": (3, 8, 2), "out_bias": (3, 2)}
    x, surface = torch.randn(7, 10), torch.tensor([0, 1, 2, 2, 1, 0, 0])
    other = MultiSurfaceHead(10, 3, 2, HeadConfig(hidden=[16, 8], adapter_dim=4))
    other.load_state_dict(head.state_dict(), strict=True)
    assert torch.equal(other(x, surface)[0], head(x, surface)[0])
