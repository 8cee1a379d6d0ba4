"""PPO's value model: a copy of the policy's decoder with a scalar head."""

from __future__ import annotations

import copy

import torch

from grpo_core.model.logprobs import repeated_inputs
from grpo_core.rollout import Rollout


class ValueModel(torch.nn.Module):
    """A copy of the policy's decoder with a scalar head: V(s_t) at every completion
    position. The head starts at zero (every value 0), so the first advantages are the
    discounted rewards and no random head adds noise."""

    def __init__(self, policy):
        super().__init__()
        self.decoder = copy.deepcopy(policy.get_decoder()).train().requires_grad_(True)
        width = policy.get_output_embeddings().weight.shape[1]
        ref = next(self.decoder.parameters())
        self.head = torch.nn.Linear(width, 1, device=ref.device, dtype=ref.dtype)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, ro: Rollout) -> torch.Tensor:
        """[B, T] float32 values, 0 on padding."""
        T, Lp = ro.completion_ids.shape[1], ro.prompt_ids.shape[1]
        h = self.decoder(**repeated_inputs(ro)).last_hidden_state[:, Lp - 1 : Lp - 1 + T]
        return self.head(h).squeeze(-1).float() * ro.completion_mask
