"""Policy objectives: each a pure function of per-token log-probs, returning the per-token
policy loss and which clip bounds were active.

Shapes: ``logp``, ``old_logp``, ``mask`` ``[B, T]`` (``mask`` 1 on completion tokens);
``advantages`` ``[B]``, or ``[B, T]`` per token (a critic's). ``r = exp(logp - old_logp)``,
with the log-ratio clamped to ``[-log_ratio_clamp, log_ratio_clamp]`` first (a ratio past
e^20 carries no signal, only overflow). The trainer adds the KL and entropy terms and
aggregates over tokens.
"""

from __future__ import annotations

import torch

from grpo_core.hookspecs import Objective, PolicyTerm, hookimpl

GRPO_CORE_API = (2,)


def _per_token(advantages: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """Advantages [B] (one per completion) or [B, T] (per token, from a critic) as [B, 1] or
    [B, T], in ``logp``'s dtype."""
    return (advantages[:, None] if advantages.dim() == 1 else advantages).to(logp.dtype)


def _log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, bound: float | None) -> torch.Tensor:
    d = logp - old_logp
    return d.clamp(-bound, bound) if bound else d


def clipped_ratio(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    log_ratio_clamp: float | None = 20.0,
) -> PolicyTerm:
    """GRPO / PPO clipped surrogate with a token-level ratio (Shao et al. 2024; Schulman et
    al. 2017), separate bounds (DAPO's clip-higher, Yu et al. 2025) and optional dual clip
    (Ye et al. 2020) that bounds the loss of a negative advantage by ``dual_clip * |A|``:

        l_t = -min(r_t A, clip(r_t, 1 - clip_low, 1 + clip_high) A)
        dual clip, A < 0:  l_t = min(l_t, -dual_clip * A)

    [B, T] x3, [B] -> PolicyTerm(loss [B, T], counts clip_low / clip_high / clip_dual).
    """
    adv = _per_token(advantages, logp)
    ratio = torch.exp(_log_ratio(logp, old_logp, log_ratio_clamp))
    loss = -torch.minimum(ratio * adv, ratio.clamp(1 - clip_low, 1 + clip_high) * adv)
    counts = {
        "clip_low": (ratio < 1 - clip_low) & (adv < 0),
        "clip_high": (ratio > 1 + clip_high) & (adv > 0),
    }
    if dual_clip is not None:
        bound = -dual_clip * adv
        dual = (adv < 0) & (loss > bound)
        loss = torch.where(dual, bound, loss)
        counts["clip_dual"] = dual
    return PolicyTerm(loss, counts)


def sequence_ratio(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    log_ratio_clamp: float | None = 20.0,
) -> PolicyTerm:
    """GSPO (Zheng et al. 2025): the ratio of whole sequences, length-normalised,

        s_i = exp(mean_t(logp_it - old_logp_it)),

    clipped as in PPO. Written in the paper's GSPO-token form, s_it = sg(s_i) * pi_it /
    sg(pi_it): every token carries the value s_i and the gradient s_i * grad log pi_it, so
    averaging over a sequence's tokens (aggregation ``seq_mean_token_mean``) gives exactly
    the sequence-level objective and gradient. The bounds are the paper's (3e-4, 4e-4).

    [B, T] x3, [B] -> PolicyTerm(loss [B, T], counts clip_low / clip_high per token).
    """
    m = mask.to(logp.dtype)
    adv = _per_token(advantages, logp)
    seq = ((logp - old_logp) * m).sum(-1) / m.sum(-1).clamp(min=1)
    seq = seq.clamp(-log_ratio_clamp, log_ratio_clamp) if log_ratio_clamp else seq
    s = torch.exp(seq.detach())[:, None] * torch.exp(logp - logp.detach())
    loss = -torch.minimum(s * adv, s.clamp(1 - clip_low, 1 + clip_high) * adv)
    return PolicyTerm(
        loss,
        {"clip_low": (s < 1 - clip_low) & (adv < 0), "clip_high": (s > 1 + clip_high) & (adv > 0)},
    )


def clipped_weight(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float | None = None,
    clip_high: float = 0.28,
    log_ratio_clamp: float | None = 20.0,
) -> PolicyTerm:
    """CISPO (MiniMax-M1, 2025): REINFORCE weighted by a clipped, stop-gradient importance
    weight, so no token loses its gradient to clipping (PPO's clip zeroes it):

        w_t = sg(clip(r_t, 1 - clip_low, 1 + clip_high)),   grad l_t = -w_t A grad log pi_t

    ``clip_low: null`` leaves the weight unbounded below, as the paper does. The loss is
    written -w_t A pi_t / sg(pi_t) so its value is -w_t A (comparable with the other
    objectives) and its gradient the one above.

    [B, T] x3, [B] -> PolicyTerm(loss [B, T], counts clip_low / clip_high per token).
    """
    adv = _per_token(advantages, logp)
    ratio = torch.exp(_log_ratio(logp, old_logp, log_ratio_clamp)).detach()
    lo = 1 - clip_low if clip_low is not None else None
    weight = ratio.clamp(lo, 1 + clip_high)
    loss = -weight * adv * torch.exp(logp - logp.detach())
    low = ratio < lo if lo is not None else torch.zeros_like(ratio, dtype=torch.bool)
    return PolicyTerm(loss, {"clip_low": low, "clip_high": ratio > 1 + clip_high})


class PolicyObjective(Objective):
    """One of the functions above with its options bound."""

    token_advantages = True

    def __init__(self, fn, aggregation: str = "token_mean", **options):
        self.fn, self.options, self.aggregation = fn, options, aggregation

    def __call__(self, logp, old_logp, advantages, mask) -> PolicyTerm:
        return self.fn(logp, old_logp, advantages, mask, **self.options)


def _schema(low: float | None, high: float, extra: dict | None = None) -> dict:
    bound = {"type": "number", "minimum": 0}
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "clip_low": {
                **bound,
                "type": ["number", "null"] if low is None else "number",
                "default": low,
                "description": "lower bound 1 - clip_low",
            },
            "clip_high": {**bound, "default": high, "description": "upper bound 1 + clip_high"},
            "log_ratio_clamp": {
                "type": ["number", "null"],
                "exclusiveMinimum": 0,
                "default": 20.0,
                "description": "bound on |log r| before exp (null: none)",
            },
            **(extra or {}),
        },
    }


@hookimpl
def objective(register):
    register(
        "grpo",
        lambda **o: PolicyObjective(clipped_ratio, **o),
        schema=_schema(
            0.2,
            0.2,
            {
                "dual_clip": {
                    "type": ["number", "null"],
                    "exclusiveMinimum": 1,
                    "default": None,
                    "description": "bound the loss of A < 0 tokens at dual_clip * |A|",
                }
            },
        ),
        description="token-level clipped ratio (GRPO/PPO, DAPO clip-higher, dual clip)",
    )
    register(
        "gspo",
        lambda **o: PolicyObjective(sequence_ratio, "seq_mean_token_mean", **o),
        schema=_schema(3e-4, 4e-4),
        description="sequence-level clipped ratio (GSPO, Zheng et al. 2025)",
    )
    register(
        "cispo",
        lambda **o: PolicyObjective(clipped_weight, **o),
        schema=_schema(None, 0.28),
        description="REINFORCE with a clipped stop-gradient IS weight (CISPO, MiniMax-M1)",
    )
