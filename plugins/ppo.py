"""PPO with a critic (Schulman et al. 2017; for language models Ouyang et al. 2022): the
critic ``ppo`` learns per-token values with a value model of its own (a copy of the
policy's decoder with a scalar head, its own AdamW), and turns each completion's reward into
per-token advantages by GAE. The estimators are grpo_core.loss.critic's pure functions."""

from __future__ import annotations

import torch

from grpo_core import hookspecs
from grpo_core.hookspecs import hookimpl
from grpo_core.loss.critic import gae, masked_whiten, terminal_rewards, value_loss
from grpo_core.model.value import ValueModel
from grpo_core.rollout import Rollout

GRPO_CORE_API = (4,)


class PPO(hookspecs.Critic):
    """GAE(gamma, lambda) advantages from a learnt critic, whitened over the batch's tokens;
    the critic fitted to the returns with PPO's clipped value loss."""

    def __init__(
        self,
        gamma: float = 1.0,
        lam: float = 0.95,
        cliprange_value: float | None = 0.2,
        lr: float = 1e-5,
        weight_decay: float = 0.0,
        max_grad_norm: float | None = 1.0,
        whiten: bool = True,
    ):
        self.gamma, self.lam, self.clip, self.whiten = gamma, lam, cliprange_value, whiten
        self.lr, self.weight_decay = lr, weight_decay
        self.max_norm = max_grad_norm or float("inf")
        self.critic: ValueModel | None = None
        self.optimizer: torch.optim.Optimizer | None = None

    def attach(self, policy) -> None:
        self.critic = ValueModel(policy)
        self.optimizer = torch.optim.AdamW(
            self.critic.parameters(), lr=self.lr, weight_decay=self.weight_decay
        )

    def token_targets(
        self, rollout: Rollout, rewards: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        mask = mask.float()
        with torch.no_grad():
            values = self.critic(rollout) * mask
        adv, returns = gae(
            terminal_rewards(rewards.to(mask.device), mask), values, mask, self.gamma, self.lam
        )
        return (masked_whiten(adv, mask) if self.whiten else adv), returns, values

    def fit(
        self,
        rollout: Rollout,
        returns: torch.Tensor,
        values: torch.Tensor,
        mask: torch.Tensor,
        batches: list[torch.Tensor],
    ) -> dict[str, float]:
        mask = mask.float()
        tokens = float(mask.sum().clamp(min=1))
        self.optimizer.zero_grad(set_to_none=True)
        total, clipped = 0.0, 0.0
        for rows in batches:
            m = mask[rows]
            loss, hit = value_loss(
                self.critic(rollout.rows(rows)), values[rows], returns[rows], self.clip
            )
            loss = (loss * m).sum() / tokens  # token mean over the whole batch
            loss.backward()
            total, clipped = total + float(loss.detach()), clipped + float((hit * m).sum())
        norm = float(torch.nn.utils.clip_grad_norm_(self.critic.parameters(), self.max_norm))
        self.optimizer.step()
        return {
            "critic/value_loss": total,
            "critic/clip_frac": clipped / tokens,
            "critic/grad_norm": norm,
            "critic/values": float((values * mask).sum()) / tokens,
            "critic/returns": float((returns * mask).sum()) / tokens,
        }

    def state_dict(self) -> dict:
        return {"critic": self.critic.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.critic.load_state_dict(state["critic"])
        self.optimizer.load_state_dict(state["optimizer"])


@hookimpl
def critic(register):
    register(
        "ppo",
        PPO,
        schema={
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "gamma": {
                    "type": "number",
                    "minimum": 0,
                    "maximum": 1,
                    "default": 1.0,
                    "description": "discount per token",
                },
                "lam": {
                    "type": "number",
                    "minimum": 0,
                    "maximum": 1,
                    "default": 0.95,
                    "description": "GAE's lambda",
                },
                "cliprange_value": {
                    "type": ["number", "null"],
                    "exclusiveMinimum": 0,
                    "default": 0.2,
                    "description": "value-loss clip around the rollout's values "
                    "(null: plain squared error)",
                },
                "lr": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "default": 1e-5,
                    "description": "the critic's AdamW learning rate",
                },
                "weight_decay": {"type": "number", "minimum": 0, "default": 0.0},
                "max_grad_norm": {
                    "type": ["number", "null"],
                    "exclusiveMinimum": 0,
                    "default": 1.0,
                    "description": "clip the critic's gradient norm",
                },
                "whiten": {
                    "type": "boolean",
                    "default": True,
                    "description": "whiten the advantages over the batch's tokens",
                },
            },
        },
        description="PPO: GAE advantages from a learnt critic (a value-head copy of the policy)",
    )
