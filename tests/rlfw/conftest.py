import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture
def nan_policy_loss() -> str:
    """The name of a registered policy loss that is PPO's times NaN (a run that diverged)."""
    from rlfw.algos import get_policy_loss, list_policy_losses, register_policy_loss

    if "nan_ppo" not in list_policy_losses():
        @register_policy_loss("nan_ppo")
        def nan_ppo(logp, old_logp, advantages, mask, **kw):
            loss, stats = get_policy_loss("ppo")(logp, old_logp, advantages, mask, **kw)
            return loss * float("nan"), stats

    return "nan_ppo"
