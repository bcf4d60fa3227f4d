"""Registries: custom variants by decorator, duplicate and unknown names, shared signatures."""

import inspect
import re
import textwrap

import pytest
import torch

import rlfw.algos.registry as registry
from rlfw.algos import (
    get_adv_est,
    get_policy_loss,
    list_adv_ests,
    list_policy_losses,
    register_adv_est,
    register_policy_loss,
)


@pytest.fixture
def scratch_registries(monkeypatch):
    """Registrations made in a test are dropped afterwards."""
    monkeypatch.setattr(registry, "_ADV_ESTS", dict(registry._ADV_ESTS))
    monkeypatch.setattr(registry, "_POLICY_LOSSES", dict(registry._POLICY_LOSSES))


def test_builtins_registered():
    assert list_adv_ests() == ["dr_grpo", "grpo", "rloo"]
    assert list_policy_losses() == ["gspo", "ppo"]


def test_custom_estimator_and_loss(scratch_registries):
    @register_adv_est("raw")
    def raw(rewards, group_ids, *, eps=1e-6):
        return rewards

    @register_policy_loss("reinforce")
    def reinforce(logp, old_logp, advantages, mask, *, clip_low, clip_high, loss_agg,
                  max_tokens=None):
        return -(advantages[:, None] * logp * mask).sum(), {}

    assert get_adv_est("raw") is raw and "raw" in list_adv_ests()
    assert get_policy_loss("reinforce") is reinforce and "reinforce" in list_policy_losses()


def test_duplicate_name_raises(scratch_registries):
    with pytest.raises(ValueError, match="'grpo' is already registered"):
        register_adv_est("grpo")(lambda rewards, group_ids, *, eps=1e-6: rewards)
    with pytest.raises(ValueError, match="'ppo' is already registered"):
        register_policy_loss("ppo")(lambda *a, **k: None)


def test_unknown_name_lists_registered():
    with pytest.raises(ValueError, match=re.escape("['dr_grpo', 'grpo', 'rloo']")):
        get_adv_est("gae")
    with pytest.raises(ValueError, match=re.escape("['gspo', 'ppo']")):
        get_policy_loss("grpo")


def test_docstring_example_runs(scratch_registries):
    # The example is copied into the README: keep it runnable.
    doc = registry.__doc__
    block = doc.split("::\n", 1)[1].split("\n\n``", 1)[0]
    namespace = {}
    exec(textwrap.dedent(block), namespace)
    torch.testing.assert_close(namespace["adv"], torch.tensor([0.5, -0.5]))


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_estimators_share_the_signature(name):
    inspect.signature(get_adv_est(name)).bind(torch.zeros(2), torch.zeros(2), eps=1e-6)


@pytest.mark.parametrize("name", ["ppo", "gspo"])
def test_losses_share_the_signature(name):
    x = torch.zeros(1, 1)
    inspect.signature(get_policy_loss(name)).bind(
        x, x, torch.zeros(1), x, clip_low=0.2, clip_high=0.2, loss_agg="token-mean",
        max_tokens=None,
    )
