"""Baselines that reproduce TRL's advantage options where ours compute something else.

``batch_std`` is TRL's ``scale_rewards: batch`` (after PPO Lite, Liu et al. 2025): each
reward minus its group's mean, divided by the standard deviation of the rewards over the
whole batch. It is not REINFORCE++ (``reinforce_pp``), which divides the group-centred
advantages by their own batch spread: the two denominators differ by the spread between the
groups' means (docs/trl.md).
"""

from __future__ import annotations

import torch
from grpo_core_plugins.baselines import EPS, Estimator, dr_grpo_advantages

from grpo_core.hookspecs import hookimpl

GRPO_CORE_API = (2,)


def batch_std_advantages(rewards: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """A_i = (r_i - mean of r_i's group) / (std of every valid reward in the batch + eps),
    the std with Bessel's correction (TRL's). NaN rewards are left out of both statistics and
    get 0. [P, G] -> [P, G]."""
    ok = torch.isfinite(rewards)
    valid = rewards[ok].double()
    sd = valid.std() if valid.numel() > 1 else torch.zeros((), dtype=torch.float64)
    centred = dr_grpo_advantages(rewards).double()
    return torch.where(ok, centred / (sd + eps), 0.0).to(rewards.dtype)


@hookimpl
def baseline(register):
    register(
        "batch_std",
        lambda eps: Estimator(batch_std_advantages, eps=eps),
        schema={
            "type": "object",
            "additionalProperties": False,
            "properties": {"eps": {**EPS, "default": 1e-4}},
        },
        description="r - group mean, over the std of the batch's rewards (TRL scale_rewards batch)",
    )
