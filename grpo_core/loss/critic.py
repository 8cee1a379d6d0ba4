"""PPO's critic: the estimators around a value model, each a pure tensor function (the
model itself: grpo_core.model.value).

Shapes: ``B`` completions, ``T`` completion positions; ``mask`` [B, T] is 1 on the model's
tokens (0 on padding and on an environment's tokens). ``values[b, t]`` is V(s_t), the value
of the state *before* token t is emitted: the same position whose hidden state predicts
token t in the policy's log-prob pass.

Conventions follow verl's ``compute_gae_advantage_return`` and ``compute_value_loss`` (and
the PPO-for-RLHF papers: Schulman et al. 2016, GAE; Ouyang et al. 2022; Huang et al. 2024,
"The N+ implementation details of RLHF with PPO"): the task reward is given at the last
token, V after the last token is 0, tokens outside ``mask`` are skipped (no TD error, the
value and advantage carried through), advantages are whitened over the batch's tokens, and
the value loss is clipped around the values the rollout was scored with.
"""

from __future__ import annotations

import torch


def terminal_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """rewards [B] -> [B, T]: each completion's reward on its last token in ``mask``, 0
    elsewhere (a completion with no token gets none)."""
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    has = mask.sum(-1) > 0
    last = mask.shape[1] - 1 - mask.flip(-1).float().argmax(-1)
    rows = torch.nonzero(has).squeeze(1)
    out[rows, last[rows]] = rewards.to(out)[rows]
    return out


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016) backwards over the tokens:

        delta_t = r_t + gamma V_{t'} - V_t,   A_t = delta_t + gamma lam A_{t'}

    with t' the next position in ``mask`` (V and A 0 past the last). rewards, values, mask
    [B, T] -> (advantages [B, T], returns = advantages + values [B, T]), 0 off ``mask``.
    """
    m = mask.to(values.dtype)
    next_v = torch.zeros_like(values[:, 0])
    next_a = torch.zeros_like(next_v)
    out = torch.zeros_like(values)
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gamma * next_v - values[:, t]
        a = delta + gamma * lam * next_a
        next_v = m[:, t] * values[:, t] + (1 - m[:, t]) * next_v
        next_a = m[:, t] * a + (1 - m[:, t]) * next_a
        out[:, t] = next_a
    out = out * m
    return out, (out + values) * m


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over the tokens in ``mask`` (unbiased variance, as
    verl's ``masked_whiten``); [B, T] -> [B, T], 0 off ``mask``."""
    m = mask.to(x.dtype)
    n = m.sum()
    mean = (x * m).sum() / n.clamp(min=1)
    var = ((x - mean).pow(2) * m).sum() / (n - 1).clamp(min=1)
    return (x - mean) * torch.rsqrt(var + eps) * m


def value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped value loss per token (Schulman et al. 2017, as in verl and TRL):

        l_t = 1/2 max((V_t - R_t)^2, (clip(V_t, V_old - c, V_old + c) - R_t)^2)

    [B, T] x3 -> (loss [B, T], clipped [B, T]: 1 where the clipped term was the larger);
    ``clip`` None: the plain squared error."""
    plain = (values - returns).pow(2)
    if clip is None:
        return 0.5 * plain, torch.zeros_like(plain, dtype=torch.bool)
    clipped = (old_values + (values - old_values).clamp(-clip, clip) - returns).pow(2)
    return 0.5 * torch.maximum(plain, clipped), clipped > plain
