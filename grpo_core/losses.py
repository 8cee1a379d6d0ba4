"""The GRPO objective as pure tensor functions.

Shapes: ``B`` completions, ``T`` completion positions, ``N`` valid completion tokens,
``H`` hidden size, ``V`` vocabulary. ``mask`` is 1 on completion tokens (EOS included).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def _acc(t: torch.Tensor) -> torch.dtype:
    """Accumulation dtype: float64 stays float64, everything else computes in float32."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


class _LMHeadLogProb(torch.autograd.Function):
    """log p(target) and entropy of softmax(h W^T / temperature), ``chunk`` rows at a time.

    Only ``[chunk, V]`` logits exist at once, in forward and in backward (which recomputes
    them), so memory is O(chunk * V) instead of O(N * V).
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, inv_temp: float, chunk: int):
        n = hidden.shape[0]
        logp = torch.empty(n, dtype=_acc(hidden), device=hidden.device)
        ent = torch.empty_like(logp)
        lse_all = torch.empty_like(logp)
        for s in range(0, n, chunk):
            z = (hidden[s:s + chunk] @ weight.T).to(_acc(hidden)) * inv_temp
            lse = torch.logsumexp(z, dim=-1)
            p = torch.exp(z - lse[:, None])
            logp[s:s + chunk] = z.gather(1, targets[s:s + chunk, None]).squeeze(1) - lse
            ent[s:s + chunk] = lse - (p * z).sum(-1)
            lse_all[s:s + chunk] = lse
        ctx.save_for_backward(hidden, weight, targets, lse_all, ent)
        ctx.inv_temp, ctx.chunk = inv_temp, chunk
        ctx.set_materialize_grads(False)
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        hidden, weight, targets, lse_all, ent = ctx.saved_tensors
        grad_h = torch.zeros_like(hidden) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros(weight.shape, dtype=_acc(weight), device=weight.device) \
            if ctx.needs_input_grad[1] else None
        for s in range(0, hidden.shape[0], ctx.chunk):
            h = hidden[s:s + ctx.chunk]
            z = (h @ weight.T).to(_acc(hidden)) * ctx.inv_temp
            lse = lse_all[s:s + ctx.chunk, None]
            p = torch.exp(z - lse)
            g = torch.zeros_like(z)
            if g_logp is not None:  # d logp / dz = onehot - p
                gl = g_logp[s:s + ctx.chunk, None]
                g -= gl * p
                g.scatter_add_(1, targets[s:s + ctx.chunk, None], gl)
            if g_ent is not None:  # d H / dz = -p (z - lse + H)
                g -= g_ent[s:s + ctx.chunk, None] * p * (z - lse + ent[s:s + ctx.chunk, None])
            g = (g * ctx.inv_temp).to(weight.dtype)
            if grad_h is not None:
                grad_h[s:s + ctx.chunk] = g @ weight
            if grad_w is not None:
                grad_w += g.T.to(grad_w.dtype) @ h.to(grad_w.dtype)
        return grad_h, (grad_w.to(weight.dtype) if grad_w is not None else None), None, None, None


def token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                   temperature: float = 1.0, chunk: int = 1024):
    """Log-prob of each target token and the entropy at that position.

    hidden [N, H], weight [V, H] (the LM head), targets [N] -> (logp [N], entropy [N]), fp32.
    Logits are divided by ``temperature`` so they match the sampling distribution.
    """
    return _LMHeadLogProb.apply(hidden, weight, targets, 1.0 / temperature, chunk)


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman, 2020).

    k1 = log r', k2 = (log r')^2 / 2, k3 = exp(-log r') + log r' - 1 with
    log r' = logp - ref_logp. k3 is unbiased and always >= 0. Shapes: [B, T] -> [B, T].
    """
    log_ratio = logp - ref_logp
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.pow(2)
    if estimator == "k3":
        return torch.exp(-log_ratio) + log_ratio - 1.0
    raise ValueError(f"unknown KL estimator {estimator!r}; expected k1, k2 or k3")


@dataclass
class Normaliser:
    """Denominators of the loss, computed once over the whole optimizer step's batch so that
    summing micro-batch losses gives exactly the full-batch loss."""

    tokens: float  # valid completion tokens in the batch
    sequences: float  # completions in the batch
    max_len: float  # Dr. GRPO's constant: the generation budget (max_new_tokens)

    @classmethod
    def of(cls, mask: torch.Tensor, max_len: int) -> Normaliser:
        return cls(float(mask.sum().clamp(min=1)), float(max(mask.shape[0], 1)), float(max_len))


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str,
              norm: Normaliser) -> torch.Tensor:
    """Reduce a [B, T] per-token loss to a scalar.

    token_mean:              sum(l * m) / tokens              (DAPO; every token counts equally)
    seq_mean_token_mean:     sum_i mean_t(l_i) / sequences    (GRPO paper, eq. 3)
    seq_mean_token_sum_norm: sum(l * m) / (sequences * max_len)  (Dr. GRPO: no length bias)
    """
    masked = per_token * mask
    if mode == "token_mean":
        return masked.sum() / norm.tokens
    if mode == "seq_mean_token_mean":
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1)).sum() / norm.sequences
    if mode == "seq_mean_token_sum_norm":
        return masked.sum() / (norm.sequences * norm.max_len)
    raise ValueError(f"unknown aggregation {mode!r}")


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor, *, clip_low: float = 0.2, clip_high: float = 0.2,
                ref_logp: torch.Tensor | None = None, kl_coef: float = 0.0,
                kl_estimator: str = "k3", entropy: torch.Tensor | None = None,
                entropy_coef: float = 0.0, aggregation: str = "token_mean",
                norm: Normaliser | None = None, is_weights: torch.Tensor | None = None):
    """Clipped surrogate with KL to a reference and an entropy bonus.

    logp, old_logp, ref_logp, entropy, is_weights, mask: [B, T]; advantages: [B].
    per-token loss = -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A) * w
                     + kl_coef * KL_est - entropy_coef * H, with r = exp(logp - old_logp)
    and w an optional truncated importance weight (sampler/trainer mismatch).
    Returns (loss, stats) where stats are detached per-batch sums for logging.
    """
    mask = mask.to(logp.dtype)
    norm = norm or Normaliser.of(mask, mask.shape[1])
    adv = advantages[:, None].to(logp.dtype)
    ratio = torch.exp(logp - old_logp)
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - clip_low, 1 + clip_high) * adv)
    per_token = -surrogate
    if is_weights is not None:
        per_token = per_token * is_weights
    kl = None
    if ref_logp is not None:
        kl = kl_penalty(logp, ref_logp, kl_estimator)
        per_token = per_token + kl_coef * kl
    if entropy is not None and entropy_coef:
        per_token = per_token - entropy_coef * entropy
    loss = aggregate(per_token, mask, aggregation, norm)
    with torch.no_grad():
        stats = {
            "clip_low_frac": float((((ratio < 1 - clip_low) & (adv < 0)) * mask).sum()),
            "clip_high_frac": float((((ratio > 1 + clip_high) & (adv > 0)) * mask).sum()),
            "kl": float((kl * mask).sum()) if kl is not None else 0.0,
            "entropy": float((entropy * mask).sum()) if entropy is not None else 0.0,
            "tokens": float(mask.sum()),
        }
    return loss, stats
