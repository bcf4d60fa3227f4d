"""RL algorithms as pure-torch functions: advantage estimators, policy losses, KL, dynamic sampling.

Importing this package registers the built-ins: advantage estimators ``grpo``, ``dr_grpo``,
``rloo`` and policy losses ``ppo``, ``gspo``. The trainer selects them by name::

    adv = get_adv_est("grpo")(rewards, group_ids)                      # [N]
    loss, stats = get_policy_loss("ppo")(logp, old_logp, adv, mask,
                                         clip_low=0.2, clip_high=0.28, loss_agg="token-mean")

See ``registry`` for adding a variant.
"""

from rlfw.algos import advantages, losses  # noqa: F401  (registers the built-ins)
from rlfw.algos.advantages import group_stats, step_advantages
from rlfw.algos.kl import KL_KINDS, kl_estimate
from rlfw.algos.losses import LOSS_AGG_MODES, aggregate, entropy_from_logits, masked_mean
from rlfw.algos.registry import (
    AdvEstFn,
    PolicyLossFn,
    get_adv_est,
    get_policy_loss,
    import_algo_module,
    list_adv_ests,
    list_policy_losses,
    register_adv_est,
    register_policy_loss,
)
from rlfw.algos.sampling import nonconstant_groups

__all__ = [
    "AdvEstFn",
    "KL_KINDS",
    "LOSS_AGG_MODES",
    "PolicyLossFn",
    "aggregate",
    "entropy_from_logits",
    "get_adv_est",
    "get_policy_loss",
    "group_stats",
    "import_algo_module",
    "step_advantages",
    "kl_estimate",
    "list_adv_ests",
    "list_policy_losses",
    "masked_mean",
    "nonconstant_groups",
    "register_adv_est",
    "register_policy_loss",
]
