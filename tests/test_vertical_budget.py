"""vm.flops_budget: one check for every arm (it was written out twice, one copy never called)."""

import pytest

from opengem.config import ConfigError
from opengem.transfer.vertical import check_budget


def test_budget_refuses_a_vm_over_it_naming_the_arm():
    with pytest.raises(ConfigError, match=r"arm 'kd' needs 6,000 FLOPs/example, over the budget 5,000"):
        check_budget(6000, 5000, "arm 'kd'")


def test_budget_zero_is_unchecked_and_a_fitting_vm_passes():
    assert check_budget(10**9, 0) == 10**9
    assert check_budget(4000, 5000) == 4000
