"""Log-probabilities of completion tokens under a causal LM, without ever materialising the
[tokens, vocabulary] logits.

Shapes: ``B`` completions, ``T`` completion positions, ``N`` valid completion tokens,
``H`` hidden size, ``V`` vocabulary.
"""

from __future__ import annotations

import torch

from grpo_core.models import is_peft
from grpo_core.rollout import Rollout


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


def completion_logprobs(model, rollout: Rollout, temperature: float, chunk: int,
                        entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) of the completion tokens under ``model``: [B, T] each.

    Runs the decoder over prompt + completion and applies the LM head only at completion
    positions, in chunks (see ``token_logprobs``), never over the whole vocabulary at once.
    """
    prompt, pmask = rollout.prompt_ids[rollout.group], rollout.prompt_mask[rollout.group]
    ids = torch.cat([prompt, rollout.completion_ids], 1)
    attn = torch.cat([pmask, rollout.completion_mask], 1)
    base = model.get_base_model() if is_peft(model) else model
    hidden = base.get_decoder()(input_ids=ids, attention_mask=attn,
                                position_ids=(attn.cumsum(-1) - 1).clamp(min=0)).last_hidden_state
    Lp, T = prompt.shape[1], rollout.completion_ids.shape[1]
    h = hidden[:, Lp - 1:Lp - 1 + T]
    sel = rollout.completion_mask.bool()
    lp, ent = token_logprobs(h[sel], base.get_output_embeddings().weight,
                             rollout.completion_ids[sel], temperature, chunk, entropy)
    zeros = torch.zeros(sel.shape, dtype=lp.dtype, device=lp.device)
    return zeros.masked_scatter(sel, lp), (zeros.masked_scatter(sel, ent) if entropy else None)


@torch.no_grad()
def reference_logprobs(reference, ro: Rollout, temperature: float, chunk: int,
                       autocast) -> torch.Tensor:
    """Log-probs under the frozen reference: a copy (on its own device), or, for LoRA, the
    policy itself with its adapter disabled."""
    with autocast:
        if is_peft(reference):
            with reference.disable_adapter():
                return completion_logprobs(reference, ro, temperature, chunk)[0]
        where = next(reference.parameters()).device
        out = completion_logprobs(reference, ro.to(where), temperature, chunk)[0]
    return out.to(ro.completion_ids.device)
