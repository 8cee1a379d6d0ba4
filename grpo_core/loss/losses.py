"""The loss around the policy objective, as pure tensor functions: KL estimators and where
the KL enters (the loss or the reward), the aggregation of per-token losses, and their sum
with the KL and entropy terms.

Shapes: ``B`` completions, ``T`` completion positions; ``mask`` [B, T] is 1 on completion
tokens (EOS included). The policy term itself is an objective plugin (plugins/objectives.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpo_core.hookspecs import PolicyTerm


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


class KlInLoss:
    """``kl.placement: loss`` (the GRPO paper's): the estimator's per-token term joins the
    loss with the controller's coefficient; the rewards are left as scored."""

    def rewards(self, rewards: torch.Tensor, *_: object) -> torch.Tensor:
        return rewards

    def loss_coef(self, coef: float) -> float:
        return coef


class KlInReward:
    """``kl.placement: reward`` (PPO-RLHF's): each completion's summed k1 estimate, times the
    coefficient, is subtracted from its reward before the advantages; none in the loss."""

    def rewards(
        self,
        rewards: torch.Tensor,
        logp: torch.Tensor,
        ref_logp: torch.Tensor | None,
        mask: torch.Tensor,
        coef: float,
    ) -> torch.Tensor:
        """[B] rewards less ``coef`` x sum_t k1 [B, T] over ``mask``; unchanged without a
        reference (the coefficient can never be non-zero then)."""
        if ref_logp is None:
            return rewards
        return rewards - coef * (kl_penalty(logp, ref_logp, "k1") * mask).sum(-1).cpu()

    def loss_coef(self, coef: float) -> float:
        return 0.0


#: where the KL enters: what the phases ask of it (``rewards``, ``loss_coef``)
KlPlacement = KlInLoss | KlInReward

#: ``kl.placement`` -> where the KL enters, chosen once when a run starts
KL_PLACEMENTS: dict[str, KlPlacement] = {"loss": KlInLoss(), "reward": KlInReward()}


def truncated_is_weights(
    logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    mask: torch.Tensor,
    cap: float,
    level: str = "token",
) -> torch.Tensor:
    """Truncated importance weights (TIS; Yao et al., 2025; Espeholt et al., 2018 for the
    truncation) of tokens sampled by a behaviour policy mu and trained as if from pi:

        token:    w_t = min(pi(y_t) / mu(y_t), cap)
        sequence: w_t = min(prod_s pi(y_s) / mu(y_s), cap) for every t of the completion

    logp (pi), behaviour_logp (mu), mask: [B, T] -> [B, T] weights, 0 off the mask. The
    sequence ratio is taken in log space and cut before exp, so long completions cannot
    overflow it."""
    log_cap = torch.log(torch.tensor(cap, dtype=torch.float64)).item()
    log_ratio = (logp - behaviour_logp) * mask
    if level == "sequence":
        log_ratio = log_ratio.sum(-1, keepdim=True).expand_as(mask)
    elif level != "token":
        raise ValueError(f"unknown TIS level {level!r}; expected token or sequence")
    return torch.exp(log_ratio.clamp(max=log_cap)) * mask


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


def aggregate(
    per_token: torch.Tensor, mask: torch.Tensor, mode: str, norm: Normaliser
) -> torch.Tensor:
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


def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, quantile: float) -> torch.Tensor:
    """The tokens of ``mask`` whose entropy is among the highest ``quantile`` share (TRL's
    ``top_entropy_quantile``, after Wang et al. 2025, "Beyond the 80/20 rule"): 1 where
    ``entropy >= q``, q the (1 - quantile) quantile (linear interpolation) of the masked
    tokens' entropies; 0 elsewhere and off the mask. quantile 1 keeps the whole mask.
    entropy, mask: [B, T] -> [B, T] in mask's dtype."""
    values = entropy.detach()[mask.bool()].float()
    if quantile >= 1.0 or values.numel() == 0:
        return mask
    threshold = torch.quantile(values, 1.0 - quantile)
    return mask * (entropy.detach() >= threshold).to(mask.dtype)


def pulls(policy: torch.Tensor, kl_term: torch.Tensor, logp: torch.Tensor) -> dict[str, float]:
    """How hard each term of the loss pulls the sampled tokens' log-probs: the L1 norm of its
    gradient with respect to ``logp`` [B, T] (``pull/policy``, ``pull/kl``; additive over
    micro-batches, as the loss is). A term's value says nothing of this: a policy term over
    zero-mean advantages is near 0 however strong its gradient (PPO's whitened advantages:
    ~1e-7), so weighing a KL penalty by the two values misjudges it; by their pulls it does
    not. Two small backward passes, through the per-token arithmetic only."""
    out = {}
    for name, term in (("pull/policy", policy), ("pull/kl", kl_term)):
        (grad,) = torch.autograd.grad(term, logp, retain_graph=True, allow_unused=True)
        out[name] = 0.0 if grad is None else float(grad.abs().sum())
    return out


def objective_loss(
    term: PolicyTerm,
    mask: torch.Tensor,
    aggregation: str,
    norm: Normaliser,
    *,
    logp: torch.Tensor | None = None,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    is_weights: torch.Tensor | None = None,
    policy_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict]:
    """The loss of one micro-batch: policy term (times the truncated importance weight when
    the sampler's numerics differ), plus KL to the reference, minus the entropy bonus:

        l_t = w_t * e_t * policy_t + kl_coef * KL_t - entropy_coef * H_t,   loss = aggregate(l)

    with e_t = ``policy_mask`` (high_entropy_mask; 1 without one): the policy term on the
    tokens it keeps, still normalised over all of ``mask``'s tokens, as TRL does.
    term.loss, logp, ref_logp, entropy, is_weights, mask: [B, T]. Returns (loss, stats):
    stats are detached sums for logging: each term's share of the loss (``loss/policy``,
    ``loss/kl``, ``loss/entropy``; they add up to the loss, and over micro-batches to the
    step's), the token sums of KL (only with a reference: no KL is not a KL of 0) and entropy,
    the token count, the objective's counts (``count/<name>``, apart from the names above)
    and, with a KL term, each term's pull on the log-probs (``pull/policy``, ``pull/kl``).
    """
    mask = mask.to(term.loss.dtype)
    policy_pt = term.loss if is_weights is None else term.loss * is_weights
    if policy_mask is not None:
        policy_pt = policy_pt * policy_mask
    policy = aggregate(policy_pt, mask, aggregation, norm)
    loss, parts = policy, {"loss/policy": policy}
    kl = None
    if ref_logp is not None:
        assert logp is not None, "the KL term needs the policy's log-probs"
        kl = kl_penalty(logp, ref_logp, kl_estimator)
        parts["loss/kl"] = kl_coef * aggregate(kl, mask, aggregation, norm)
        loss = loss + parts["loss/kl"]
    if entropy is not None and entropy_coef:
        parts["loss/entropy"] = -entropy_coef * aggregate(entropy, mask, aggregation, norm)
        loss = loss + parts["loss/entropy"]
    pulled = {}
    if (
        kl is not None
        and kl_coef
        and logp is not None
        and logp.requires_grad
        and policy.requires_grad
    ):
        pulled = pulls(policy, parts["loss/kl"], logp)
    with torch.no_grad():
        stats = {k: float(v) for k, v in parts.items()} | pulled
        if kl is not None:
            stats["kl"] = float((kl * mask).sum())
        stats["entropy"] = float((entropy * mask).sum()) if entropy is not None else 0.0
        stats["tokens"] = float(mask.sum())
        stats.update({f"count/{k}": float((v * mask).sum()) for k, v in term.counts.items()})
    return loss, stats
