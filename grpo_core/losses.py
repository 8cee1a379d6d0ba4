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
    them, in place), so memory is O(chunk * V) instead of O(N * V).
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, inv_temp: float, chunk: int, with_entropy: bool):
        n, acc = hidden.shape[0], _acc(hidden)
        logp = torch.empty(n, dtype=acc, device=hidden.device)
        ent = torch.zeros_like(logp)
        lse_all = torch.empty_like(logp)
        for s in range(0, n, chunk):
            z = (hidden[s:s + chunk] @ weight.T).to(acc)
            if inv_temp != 1.0:
                z.mul_(inv_temp)
            lse = torch.logsumexp(z, dim=-1)
            logp[s:s + chunk] = z.gather(1, targets[s:s + chunk, None]).squeeze(1) - lse
            if with_entropy:  # H = lse - sum p z
                ent[s:s + chunk] = lse - (torch.softmax(z, dim=-1) * z).sum(-1)
            lse_all[s:s + chunk] = lse
        ctx.save_for_backward(hidden, weight, targets, lse_all, ent)
        ctx.inv_temp, ctx.chunk = inv_temp, chunk
        ctx.set_materialize_grads(False)
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        hidden, weight, targets, lse_all, ent = ctx.saved_tensors
        acc = _acc(hidden)
        grad_h = torch.zeros_like(hidden) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros(weight.shape, dtype=_acc(weight), device=weight.device) \
            if ctx.needs_input_grad[1] else None
        for s in range(0, hidden.shape[0], ctx.chunk):
            e = min(s + ctx.chunk, hidden.shape[0])
            h = hidden[s:e]
            g = (h @ weight.T).to(acc)  # z, then turned into dLoss/dz in place
            if ctx.inv_temp != 1.0:
                g.mul_(ctx.inv_temp)
            g.sub_(lse_all[s:e, None])  # log p
            if g_ent is not None:  # d H / dz = -p (log p + H)
                logp_full = g.clone()
                g.exp_()
                coef = logp_full.add_(ent[s:e, None]).mul_(g).mul_(-g_ent[s:e, None])
            else:
                g.exp_()
                coef = None
            if g_logp is not None:  # d logp / dz = onehot - p
                gl = g_logp[s:e, None]
                g.mul_(-gl).scatter_add_(1, targets[s:e, None], gl)
            else:
                g.zero_()
            if coef is not None:
                g.add_(coef)
            if ctx.inv_temp != 1.0:
                g.mul_(ctx.inv_temp)
            g = g.to(weight.dtype)
            if grad_h is not None:
                grad_h[s:e] = g @ weight
            if grad_w is not None:
                grad_w.addmm_(g.T.to(grad_w.dtype), h.to(grad_w.dtype))
        return (grad_h, grad_w.to(weight.dtype) if grad_w is not None else None,
                None, None, None, None)


def token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                   temperature: float = 1.0, chunk: int = 1024, entropy: bool = True):
    """Log-prob of each target token and the entropy at that position.

    hidden [N, H], weight [V, H] (the LM head), targets [N] -> (logp [N], entropy [N]), fp32.
    Logits are divided by ``temperature`` so they match the sampling distribution. With
    ``entropy=False`` the entropy is not computed (zeros), which saves a pass over the logits.
    """
    return _LMHeadLogProb.apply(hidden, weight, targets, 1.0 / temperature, chunk, entropy)


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
