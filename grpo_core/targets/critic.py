"""A critic: the ``critic`` plugin (PPO's value model) gives per-token advantages and returns
from its values, and is fitted to the returns after each pass of the policy's update. It holds
a whole copy of the policy in this process."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from grpo_core.building import create, declared
from grpo_core.config.view import Config
from grpo_core.hookspecs import Critic
from grpo_core.records import Scored, Targets
from grpo_core.rollout import Rollout
from grpo_core.targets import TargetSource

if TYPE_CHECKING:
    from grpo_core.run import Run


class CriticTargets(TargetSource):
    """Per-token advantages, returns and values from the critic plugin."""

    def __init__(self, critic: Critic):
        self.critic = critic

    @classmethod
    def build(cls, config: Config, policy: Any) -> CriticTargets:
        """The critic plugin, attached to the policy (before any checkpoint loads)."""
        section = config.critic
        assert section is not None  # chosen only with a critic section (plan.TARGETS)
        critic = create("critic", section.name, section.options)
        critic.attach(policy)
        return cls(critic)

    @classmethod
    def refusals(
        cls, config: Config, world: int, how: str = "none", lora: bool = False
    ) -> list[str]:
        assert config.critic is not None  # asked only with a critic section
        name = f"critic.name: {config.critic.name}"
        if world > 1 or how not in ("none", "auto") or config.deepspeed:
            return [f"{name} (a critic) runs in one process only, not sharded or data parallel"]
        if lora or config.model.lora:
            return [f"{name} (a critic) is not supported with model.lora"]
        objective = config.objective
        if not declared("objective", objective.name, objective.options, "token_advantages"):
            return [
                f"{name} gives per-token advantages; objective {config.objective.name!r} "
                f"does not take them"
            ]
        return []

    def advantages(
        self, run: Run, scored: Scored, rewards: torch.Tensor, keep: torch.Tensor
    ) -> dict:
        mask = scored.rollout.action_mask.float()
        with run.autocast:
            adv, returns, values = self.critic.token_targets(
                scored.rollout,
                torch.nan_to_num(rewards, nan=0.0),
                mask * keep.to(mask.device)[:, None],
            )
        return {"advantages": adv, "returns": returns, "values": values}

    def fit(
        self,
        run: Run,
        ro: Rollout,
        targets: Targets,
        loss_mask: torch.Tensor,
        batches: list[torch.Tensor],
    ) -> dict[str, float]:
        assert targets.returns is not None and targets.values is not None  # ours (advantages)
        with run.autocast:
            return self.critic.fit(ro, targets.returns, targets.values, loss_mask, batches)

    def state_dict(self) -> dict:
        return self.critic.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.critic.load_state_dict(state)
