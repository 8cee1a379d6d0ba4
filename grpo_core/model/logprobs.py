"""Log-probabilities of completion tokens under a causal LM, without ever materialising the
[tokens, vocabulary] logits, and with each prompt run once however many completions it has.

Shapes: ``P`` prompts, ``Lp`` prompt positions, ``B`` completions, ``T`` completion positions,
``N`` valid completion tokens, ``H`` hidden size, ``V`` vocabulary.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Iterator

import torch

from grpo_core.engine.zero import logprobs_through_head
from grpo_core.model.packing import (
    choose_capacity,
    pack_tree,
    pack_varlen,
    packed_counts,
    padded_cost,
    padded_counts,
    right_padded,
    tree_cost,
    tree_mask,
)
from grpo_core.observe.flops import Shape
from grpo_core.rollout import Rollout
from grpo_core.store.models import is_peft

# Share a prompt's forward among its completions only when that saves at least this many
# decoder tokens ((B - P) * Lp) per micro-batch: below it the second decoder call costs more
# than the tokens save. Measured in CPU time, policy forward + backward: on a 4-layer x 256
# model (bench/scaling.py, training-pass table) 56 tokens saved cost 9% more, 112 break
# even, 224 save 15%, 448 save 33%; on a 2-layer x 64 model, whose calls are all overhead,
# 112 cost 12-16% more, 280 break even, 560 save 17-25%. Larger models break even sooner.
SHARE_MIN_SAVED_TOKENS = 128


def _acc(t: torch.Tensor) -> torch.dtype:
    """Accumulation dtype: float64 stays float64, everything else computes in float32."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _logits(h: torch.Tensor, weight: torch.Tensor, inv_temp: float, out: torch.Tensor):
    """z = h W^T / temperature written into ``out`` (a reused buffer: no fresh [chunk, V]
    allocation, whose page faults cost as much as the arithmetic on a CPU)."""
    if h.dtype == out.dtype:
        torch.matmul(h, weight.T, out=out)
    else:
        out.copy_(h @ weight.T)
    if inv_temp != 1.0:
        out.mul_(inv_temp)
    return out


class _LMHeadLogProb(torch.autograd.Function):
    """log p(target) and entropy of softmax(h W^T / temperature), ``chunk`` rows at a time.

    Only ``[chunk, V]`` logits exist at once (one reused buffer, two with entropy), so memory
    is O(chunk * V) instead of O(N * V). When only the hidden states need a gradient (a
    frozen head: LoRA), the forward also computes d logp / dh = (W[t] - p W) / temperature,
    [N, H], so the backward is one multiply and never recomputes the logits; when the head
    needs a gradient too, the backward recomputes each chunk's logits (its gradient
    sum_i g_i (onehot_i - p_i) h_i^T needs every p_i again, and g is unknown until then).
    """

    @staticmethod
    def forward(
        ctx,
        hidden,
        weight,
        targets,
        inv_temp: float,
        chunk: int,
        with_entropy: bool,
        need_h: bool,
        need_w: bool,
    ):
        n, acc = hidden.shape[0], _acc(hidden)
        logp = torch.empty(n, dtype=acc, device=hidden.device)
        ent = torch.zeros_like(logp)
        lse_all = torch.empty_like(logp)
        rows = max(min(chunk, n), 1)
        buf = torch.empty(rows, weight.shape[0], dtype=acc, device=hidden.device)
        exp_buf = torch.empty_like(buf) if with_entropy else None
        dlogp_dh = (
            torch.empty(n, hidden.shape[1], dtype=acc, device=hidden.device)
            if need_h and not need_w
            else None
        )
        for s in range(0, n, chunk):
            e = min(s + chunk, n)
            z = _logits(hidden[s:e], weight, inv_temp, buf[: e - s])
            top = z.amax(-1)
            z.sub_(top[:, None])  # z' = z - max; lse = max + log sum exp z'
            logp[s:e] = z.gather(1, targets[s:e, None]).squeeze(1)
            if with_entropy:  # H = log S - sum exp(z') z' / S
                assert exp_buf is not None  # allocated with_entropy
                x = torch.exp(z, out=exp_buf[: e - s])
                tot = x.sum(-1)
                ent[s:e] = tot.log() - torch.bmm(x[:, None, :], z[:, :, None]).view(-1) / tot
            else:
                x = z.exp_()
                tot = x.sum(-1)
            logp[s:e] -= tot.log()
            lse_all[s:e] = top + tot.log()
            if dlogp_dh is not None:  # (W[t] - p W) / temperature; x holds exp(z')
                pw = (x @ weight.to(acc)).div_(tot[:, None])
                dlogp_dh[s:e] = weight[targets[s:e]].to(acc).sub_(pw).mul_(inv_temp)
        ctx.save_for_backward(hidden, weight, targets, lse_all, ent, dlogp_dh)
        ctx.inv_temp, ctx.chunk = inv_temp, chunk
        ctx.set_materialize_grads(False)
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        hidden, weight, targets, lse_all, ent, dlogp_dh = ctx.saved_tensors
        acc, n = _acc(hidden), hidden.shape[0]
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.zeros(hidden.shape, dtype=acc, device=hidden.device) if need_h else None
        grad_w = (
            torch.zeros(weight.shape, dtype=_acc(weight), device=weight.device) if need_w else None
        )
        if dlogp_dh is not None and g_logp is not None and not need_w:
            grad_h += g_logp[:, None].to(acc) * dlogp_dh
            g_logp = None  # done: only the entropy's part (if any) needs the logits again
        if g_logp is not None or g_ent is not None:
            rows = max(min(ctx.chunk, n), 1)
            buf = torch.empty(rows, weight.shape[0], dtype=acc, device=hidden.device)
            p_buf = torch.empty_like(buf) if g_ent is not None else None
            for s in range(0, n, ctx.chunk):
                e = min(s + ctx.chunk, n)
                h = hidden[s:e]
                g = _logits(h, weight, ctx.inv_temp, buf[: e - s])
                g.sub_(lse_all[s:e, None])  # log p
                if g_ent is not None:  # d H / dz = -p (log p + H)
                    p = torch.exp(g, out=p_buf[: e - s])
                    g.add_(ent[s:e, None]).mul_(p).mul_(-g_ent[s:e, None])
                    if g_logp is not None:  # d logp / dz = onehot - p
                        g.addcmul_(p, g_logp[s:e, None], value=-1.0)
                else:
                    g.exp_().mul_(-g_logp[s:e, None])
                if g_logp is not None:
                    g.scatter_add_(1, targets[s:e, None], g_logp[s:e, None].to(acc))
                if ctx.inv_temp != 1.0:
                    g.mul_(ctx.inv_temp)
                g = g.to(weight.dtype)
                if grad_h is not None:
                    grad_h[s:e] += g @ weight
                if grad_w is not None:
                    grad_w.addmm_(g.T.to(grad_w.dtype), h.to(grad_w.dtype))
        return (
            grad_h.to(hidden.dtype) if grad_h is not None else None,
            grad_w.to(weight.dtype) if grad_w is not None else None,
            None,
            None,
            None,
            None,
            None,
            None,
        )


def token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    chunk: int = 1024,
    entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of each target token and the entropy at that position.

    hidden [N, H], weight [V, H] (the LM head), targets [N] -> (logp [N], entropy [N]), fp32
    (fp64 for fp64 inputs). Logits are divided by ``temperature`` so they match the sampling
    distribution. With ``entropy=False`` the entropy is not computed (zeros), which saves a
    pass over the logits.
    """
    grad = torch.is_grad_enabled()
    return _LMHeadLogProb.apply(
        hidden,
        weight,
        targets,
        1.0 / temperature,
        max(int(chunk), 1),
        entropy,
        grad and hidden.requires_grad,
        grad and weight.requires_grad,
    )


_CACHE_KW: dict[type, str] = {}


def _cache_kw(decoder) -> str:
    """The decoder's keyword for a KV cache: ``cache`` (transformers >= 5.2x) or
    ``past_key_values``."""
    kind = type(decoder)
    if kind not in _CACHE_KW:
        params = inspect.signature(decoder.forward).parameters
        _CACHE_KW[kind] = "cache" if "cache" in params else "past_key_values"
    return _CACHE_KW[kind]


def _can_share(decoder) -> bool:
    """Prompt sharing needs a plain growing KV cache the autograd graph runs through: every
    layer full attention (a sliding-window cache drops keys), and no gradient checkpointing
    while gradients are taken (the checkpointed layers drop the cache, and a replayed layer
    would write it twice)."""
    cfg = decoder.config
    types = getattr(cfg, "layer_types", None)
    if types is not None:
        if any(t != "full_attention" for t in types):
            return False
    elif getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
        return False
    return not _recomputes(decoder)


def _recomputes(decoder) -> bool:
    """Whether backward will run the decoder's layers forward again (gradient checkpointing
    while gradients are taken)."""
    if not (torch.is_grad_enabled() and decoder.training):
        return False
    return any(getattr(m, "gradient_checkpointing", False) for m in decoder.modules())


def share_prompts(decoder, rollout: Rollout) -> bool:
    """Whether ``completion_logprobs`` runs each prompt once for this batch: the decoder
    tokens that saves ((B - P) * Lp) reach ``SHARE_MIN_SAVED_TOKENS``, and the model allows
    it (``_can_share``)."""
    (B, T), Lp = rollout.completion_ids.shape, rollout.prompt_ids.shape[1]
    P = int(torch.unique(rollout.group).numel())
    return T > 0 and (B - P) * Lp >= SHARE_MIN_SAVED_TOKENS and _can_share(decoder)


class _ThroughModel:
    """Runs ``decoder`` by calling the whole model, with the LM head applied to no position,
    and returns the decoder's output: wrappers that act on the model's forward (FSDP2
    gathering its shards) see every call. FSDP2 also hooks backward on the model's outputs
    (there it queues the step that finishes gradient reduction), so ``anchor``, the sum of
    the calls' empty logits (zero), must be added to what the loss uses."""

    def __init__(self, model, decoder):
        self.model, self.decoder = model, decoder
        self.anchor: torch.Tensor | float = 0.0

    def __call__(self, **inputs):
        captured: dict = {}

        def keep(module, args, output):
            captured["out"] = output

        none = torch.zeros(0, dtype=torch.long, device=inputs["input_ids"].device)
        handle = self.decoder.register_forward_hook(keep)
        try:
            logits = self.model(**inputs, logits_to_keep=none).logits
        finally:
            handle.remove()
        self.anchor = self.anchor + logits.sum()
        return captured["out"]


@contextlib.contextmanager
def _head_in_place(model) -> Iterator[None]:
    """An FSDP2 root frees its own parameters (the LM head's among them) after a forward
    without gradients; gather them again while the head is used. With gradients they stay
    gathered until backward."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule) and not torch.is_grad_enabled():
        model.unshard()
        try:
            yield
        finally:
            model.reshard()
    else:
        yield


@contextlib.contextmanager
def _grouped_query_sdpa(decoder, device: torch.device) -> Iterator[None]:
    """On the CPU, SDPA's own grouped-query path for masked attention while the decoder runs
    forward. Given a mask, transformers otherwise repeats each key and value head for its
    query heads before SDPA (``repeat_kv``): a copy of the keys and values forward and a sum
    over the copies backward, at prompt sharing's [B, heads, Lp + T, d] keys. Measured on the
    GSM8K-shaped case (bench/gqa.py, two runs): the training pass 0.89-0.93x, the reference
    0.91-0.97x of the copying path's time, the same log-probs and gradients to float32
    rounding; on SmolLM2 no measurable change. Not on GPUs,
    where a mask with grouped-query SDPA falls back to the math kernel.

    transformers reads its switch, ``TRANSFORMERS_SDPA_FORCE_GQA``, from the process's
    environment at each call; it is set only inside this block (so not where backward runs
    layers forward again, gradient checkpointing, which must take the forward's path), and
    left alone where the user set it. Process-wide while set: another thread's transformers
    forward in that time (none runs in the training loop) would take the same path."""
    key = "TRANSFORMERS_SDPA_FORCE_GQA"
    if key in os.environ or device.type != "cpu" or _recomputes(decoder):
        yield
        return
    os.environ[key] = "1"
    try:
        yield
    finally:
        os.environ.pop(key, None)


def repeated_inputs(ro: Rollout) -> dict:
    """Each completion after its prompt (repeated), without the last completion token, which
    predicts nothing we need."""
    fed = max(ro.completion_ids.shape[1] - 1, 0)
    attn = torch.cat([ro.prompt_mask[ro.group], ro.completion_mask[:, :fed]], 1)
    return {
        "input_ids": torch.cat([ro.prompt_ids[ro.group], ro.completion_ids[:, :fed]], 1),
        "attention_mask": attn,
        "position_ids": (attn.cumsum(-1) - 1).clamp(min=0),
        "use_cache": False,
    }


def _repeated_hidden(decoder, ro: Rollout) -> torch.Tensor:
    """[B, T, H]: the hidden state that predicts each completion token, with the decoder run
    over prompt + completion for every completion (the prompt repeated)."""
    T, Lp = ro.completion_ids.shape[1], ro.prompt_ids.shape[1]
    return decoder(**repeated_inputs(ro)).last_hidden_state[:, Lp - 1 : Lp - 1 + T]


def _shared_hidden(decoder, ro: Rollout, kw: str) -> torch.Tensor:
    """[B, T, H] as ``_repeated_hidden``, with each prompt of the batch run once: its KV cache
    (autograd graph included) is indexed out to its completions, which then run on top of
    it. The first completion token is predicted by the prompt's last hidden state."""
    prompts, local = torch.unique(ro.group, return_inverse=True)
    pmask = ro.prompt_mask[prompts]
    out = decoder(
        input_ids=ro.prompt_ids[prompts],
        attention_mask=pmask,
        position_ids=(pmask.cumsum(-1) - 1).clamp(min=0),
        use_cache=True,
    )
    first = out.last_hidden_state[local, -1:]
    T = ro.completion_ids.shape[1]
    if T == 1:
        return first
    cache = getattr(out, "cache", None)
    cache = getattr(out, "past_key_values", None) if cache is None else cache
    if cache is None:  # the model declined to cache (a switch _can_share does not know)
        return _repeated_hidden(decoder, ro)
    cache.batch_select_indices(local)
    attn = torch.cat([pmask[local], ro.completion_mask[:, : T - 1]], 1)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)[:, pmask.shape[1] :]
    rest = decoder(
        input_ids=ro.completion_ids[:, : T - 1],
        attention_mask=attn,
        position_ids=pos,
        use_cache=True,
        **{kw: cache},
    ).last_hidden_state
    return torch.cat([first, rest], 1)


def _varlen(decoder) -> bool:
    """The decoder's attention finds packed sequences from ``position_ids`` alone (a
    flash-attention varlen kernel) rather than needing an explicit mask."""
    return str(decoder.config._attn_implementation).startswith("flash_attention")


def _pair_cost(decoder) -> float | None:
    """A query-key pair's attention FLOPs over a position's matrix FLOPs (4 H over twice a
    layer's weights; grpo_core.observe.flops), or None where the config lacks the sizes."""
    try:
        shape = Shape.of(decoder.config)
    except AttributeError:
        return None
    return 4 * shape.hidden / (2 * shape.layer_params)


def choose_layout(decoder, ro: Rollout, packing: str) -> tuple[str, int | None]:
    """How the decoder runs this batch: ``varlen`` or ``tree`` (packed; the tree's row
    capacity with it) or ``shared`` or ``repeated`` (padded). ``packing``: ``off`` padded;
    ``on`` packed; ``auto`` packed where that counts fewer positions and attention pairs
    than padded (``grpo_core.model.packing.tree_cost``, ``padded_cost``): with flash-attention
    always (no mask, no padding), with a dense mask only where padding outweighs the
    attention a long row adds."""
    shared = share_prompts(decoder, ro)
    padded = "shared" if shared else "repeated"
    if packing == "off" or ro.completion_ids.shape[1] == 0:
        return padded, None
    if packing == "auto" and not right_padded(ro):  # "on" refuses it (completion_lengths)
        return padded, None
    if _varlen(decoder):
        return "varlen", None
    pair_cost = _pair_cost(decoder)
    capacity = None if pair_cost is None else choose_capacity(ro, pair_cost)
    if packing == "on" or pair_cost is None:
        return ("tree" if packing == "on" else padded), capacity
    cheaper = tree_cost(ro, capacity, pair_cost) < padded_cost(ro, shared, pair_cost)
    return ("tree" if cheaper else padded), capacity


def _packed_hidden(run, decoder, ro: Rollout, layout: str, capacity: int | None):
    """[N, H]: the hidden state that predicts each valid completion token, from one decoder
    call over a padding-free layout (grpo_core.model.packing): a varlen row for
    flash-attention, else rows under a tree mask (boolean for SDPA, additive for the
    others)."""
    device, host = ro.completion_ids.device, ro.to("cpu")  # the layout is built on the host
    if layout == "varlen":
        packed, mask = pack_varlen(host, 0), None
    else:
        sdpa = decoder.config._attn_implementation == "sdpa"
        packed = pack_tree(host, 0, capacity)
        mask = tree_mask(packed, None if sdpa else next(decoder.parameters()).dtype)
    out = run(
        input_ids=packed.input_ids.to(device),
        attention_mask=None if mask is None else mask.to(device),
        position_ids=packed.position_ids.to(device),
        use_cache=False,
    ).last_hidden_state
    return out.reshape(-1, out.shape[-1])[packed.picks.to(device)]


def decoder_counts(model, rollout: Rollout, packing: str) -> tuple[int, int]:
    """(decoder positions, of which padding) that ``completion_logprobs`` runs for this
    batch with these settings: the padding-fraction metric's counts."""
    base = model.get_base_model() if is_peft(model) else model
    layout, capacity = choose_layout(base.get_decoder(), rollout, packing)
    if layout in ("varlen", "tree"):
        return packed_counts(rollout, layout == "varlen", capacity)
    return padded_counts(rollout, layout == "shared")


def completion_hidden(run, decoder, rollout: Rollout, packing: str = "off") -> torch.Tensor:
    """[N, H]: the hidden state that predicts each completion token (N: the ones of
    ``completion_mask``, row by row), from ``decoder`` called through ``run`` over the
    layout ``choose_layout`` picks: packed, each prompt once under its completions, or
    prompt + completion per row. Every layout gives the same states and gradients; the
    policy's log-probs and a critic's values both read them."""
    sel = rollout.completion_mask.bool()
    layout, capacity = choose_layout(decoder, rollout, packing)
    with _grouped_query_sdpa(decoder, rollout.completion_ids.device):
        if layout in ("varlen", "tree"):
            return _packed_hidden(run, decoder, rollout, layout, capacity)
        if layout == "shared":
            return _shared_hidden(run, rollout, _cache_kw(decoder))[sel]
        return _repeated_hidden(run, rollout)[sel]


def completion_logprobs(
    model,
    rollout: Rollout,
    temperature: float,
    chunk: int | None,
    entropy: bool = False,
    packing: str = "off",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) of the completion tokens under ``model``: [B, T] each.

    Runs the decoder once over a padding-free layout of the batch (``_packed_hidden``) when
    ``packing`` (``off``, ``on``, ``auto``: ``choose_layout``) says so; else once over each
    prompt and its KV cache under the completions when that saves enough tokens
    (``share_prompts``), else over prompt + completion per row; applies the LM head only at
    completion positions, ``chunk`` rows at a time (``token_logprobs``), never over the
    whole vocabulary at once; ``chunk=None``: the model's own head module
    (``grpo_core.engine.zero.logprobs_through_head``, padded). All ways give the same
    log-probs and gradients.
    """
    if chunk is None:
        return logprobs_through_head(model, repeated_inputs(rollout), rollout, temperature, entropy)
    base = model.get_base_model() if is_peft(model) else model
    decoder = base.get_decoder()
    run = _ThroughModel(model, decoder)
    sel = rollout.completion_mask.bool()
    h = completion_hidden(run, decoder, rollout, packing)
    with _head_in_place(model):
        lp, ent = token_logprobs(
            h,
            base.get_output_embeddings().weight,
            rollout.completion_ids[sel],
            temperature,
            chunk,
            entropy,
        )
    lp = lp + run.anchor
    zeros = torch.zeros(sel.shape, dtype=lp.dtype, device=lp.device)
    return zeros.masked_scatter(sel, lp), (zeros.masked_scatter(sel, ent) if entropy else None)


def reference_logprobs(
    reference, ro: Rollout, temperature: float, chunk: int | None, autocast, packing: str = "off"
) -> torch.Tensor:
    """Log-probs under the frozen reference: a copy (on its own device), or, for LoRA, the
    policy itself with its adapter disabled. Runs in inference mode (less per-op bookkeeping
    than no_grad; plain no_grad for a sharded model, FSDP's or ZeRO-3's (``chunk`` None),
    whose gathered weights are reused buffers); the result is copied out of it so the loss
    can use it. ``packing``: see ``completion_logprobs``."""
    from torch.distributed.fsdp import FSDPModule

    sharded = chunk is None or isinstance(reference, FSDPModule)
    mode = torch.no_grad() if sharded else torch.inference_mode()
    with mode, autocast:
        if is_peft(reference):
            with reference.disable_adapter():
                out = completion_logprobs(reference, ro, temperature, chunk, packing=packing)[0]
        else:
            on = ro.to(next(reference.parameters()).device)
            out = completion_logprobs(reference, on, temperature, chunk, packing=packing)[0]
    return out.to(ro.completion_ids.device).clone()
