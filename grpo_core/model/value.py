"""PPO's value model: a copy of the policy's decoder with a scalar head."""

from __future__ import annotations

import copy

import torch

from grpo_core.model.logprobs import completion_hidden
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
        """[B, T] values, 0 on padding, in float32 or the model's wider dtype. The decoder
        runs as the policy's log-probs do (``completion_hidden``): each prompt once under its
        group's completions where that saves tokens, not once per completion."""
        sel = ro.completion_mask.bool()
        v = self.head(completion_hidden(self.decoder, self.decoder, ro)).squeeze(-1)
        v = v.to(torch.promote_types(v.dtype, torch.float32))
        return torch.zeros(sel.shape, dtype=v.dtype, device=v.device).masked_scatter(sel, v)
