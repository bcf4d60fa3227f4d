"""Name -> function registries for advantage estimators and policy losses.

A GRPO variant is a registered function, never a branch in the trainer (the pattern of verl's
``@register_adv_est`` / ``@register_policy_loss``). The trainer looks functions up by the name set
in the config and calls them with tensors and plain keyword arguments.

Adding a variant is one decorator::

    import torch
    from rlfw.algos import get_adv_est, register_adv_est

    @register_adv_est("batch_mean")
    def batch_mean(rewards, group_ids, *, eps=1e-6):
        return rewards - rewards.mean()  # one baseline for the whole batch

    adv = get_adv_est("batch_mean")(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]))

``register_policy_loss`` works the same way for functions with the ``PolicyLossFn`` signature.
Registering a name twice raises; looking up an unknown name raises ``ValueError`` listing the
registered names. From the command line, name the module that registers your variant, and rlfw
imports it in the driver and in every worker before the config is checked::

    python -m rlfw.run algo.module=mypkg.myalgos algo.advantage_estimator=batch_mean
"""

from __future__ import annotations

import importlib
from typing import Callable, Protocol, TypeVar

from torch import Tensor


class AdvEstFn(Protocol):
    """One scalar advantage per episode from its outcome reward and its group."""

    def __call__(self, rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6) -> Tensor:
        """rewards: [N] float, group_ids: [N] long -> advantages: [N]."""
        ...


class PolicyLossFn(Protocol):
    """Scalar policy loss over a batch of token sequences, plus detached stats."""

    def __call__(
        self,
        logp: Tensor,  # [B, L] log-probs of the sampled tokens under the current policy
        old_logp: Tensor,  # [B, L] the same under the policy that sampled them
        advantages: Tensor,  # [B]
        mask: Tensor,  # [B, L] bool or 0/1 float; 1 on tokens the loss sees
        *,
        clip_low: float,
        clip_high: float,
        loss_agg: str,
        max_tokens: int | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """Returns (scalar loss, {stat name: detached scalar})."""
        ...


F = TypeVar("F", bound=Callable)

_ADV_ESTS: dict[str, AdvEstFn] = {}
_POLICY_LOSSES: dict[str, PolicyLossFn] = {}


def _register(table: dict, kind: str, name: str) -> Callable[[F], F]:
    def decorator(fn: F) -> F:
        if name in table:
            prev = table[name]
            raise ValueError(
                f"{kind} {name!r} is already registered "
                f"(by {prev.__module__}.{prev.__qualname__}); choose another name"
            )
        table[name] = fn
        return fn

    return decorator


def _get(table: dict, kind: str, name: str):
    if name not in table:
        raise ValueError(f"unknown {kind} {name!r}; registered: {sorted(table)}")
    return table[name]


def register_adv_est(name: str) -> Callable[[F], F]:
    """Decorator registering an advantage estimator (``AdvEstFn``) under ``name``."""
    return _register(_ADV_ESTS, "advantage estimator", name)


def register_policy_loss(name: str) -> Callable[[F], F]:
    """Decorator registering a policy loss (``PolicyLossFn``) under ``name``."""
    return _register(_POLICY_LOSSES, "policy loss", name)


def get_adv_est(name: str) -> AdvEstFn:
    """The advantage estimator registered under ``name``."""
    return _get(_ADV_ESTS, "advantage estimator", name)


def get_policy_loss(name: str) -> PolicyLossFn:
    """The policy loss registered under ``name``."""
    return _get(_POLICY_LOSSES, "policy loss", name)


def list_adv_ests() -> list[str]:
    """Registered advantage-estimator names, sorted."""
    return sorted(_ADV_ESTS)


def list_policy_losses() -> list[str]:
    """Registered policy-loss names, sorted."""
    return sorted(_POLICY_LOSSES)


def import_algo_module(name: str | None) -> None:
    """Import the user's module `name` (``algo.module``) so that its ``register_*`` calls run."""
    if not name:
        return
    try:
        importlib.import_module(name)
    except Exception as exc:
        raise ImportError(f"algo.module={name!r} could not be imported ({type(exc).__name__}: {exc}); make sure "
                          "it is installed or on PYTHONPATH and that importing it does not fail") from exc
