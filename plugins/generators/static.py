"""Static-shape decoding: the hf generator's decode path made for CUDA graphs.

Why. A small model's decode step on a GPU is bound by kernel launches, not arithmetic: 30
layers of a dozen kernels, a few microseconds each. Replayed as one CUDA graph the step costs
about the launch of one; but a graph can only replay a step whose every tensor keeps its shape
and address. So here nothing grows: each batch bucket (rows padded to a power of two) gets
per-layer key/value buffers of a fixed length (the prompt plus the budget, rounded up to a
power of two, at least ``LENGTH_MIN``), written in place at the step's column; the attention
mask is derived inside the step from a fixed [B, L] table of usable columns and the step's
column; positions and the column are tensors. One function, :func:`decode_step`, is the
whole step (the Llama-family layer written out as in cascade.py), compiled with
``fullgraph=True`` and ``dynamic=False``: once per (bucket, length) shape, no graph breaks, no
recompiles across steps. On CUDA the
compile mode is ``reduce-overhead`` (inductor's CUDA graphs) and the weights are a bfloat16
inference copy refreshed after each update (``refresh``), not autocast casting float32 weights
on every call.

The loop around it keeps the eager path's arithmetic: the same token choice (:func:`pick`,
batch-invariant noise from grpo_core.sampling by (seed, row id, step)), so the same seed draws
the same tokens as the eager path on the same logits. Inside it nothing waits for the device
except one check every ``check_every`` steps (have all rows finished? stop strings, which need
the host's tokenizer, are found there for the steps since the last check, and the completion
is cut where the eager path would have cut it). Finished rows stay in the batch until every row
has finished (the shape is fixed): their tokens are computed and dropped.
"""

from __future__ import annotations

import copy

import torch
from grpo_core_plugins.generators.cascade import _linear, _rms, _rotate

from grpo_core.rollout import SamplingParams
from grpo_core.sampling import apply_repetition_penalty, draw, hits_stop, stop_window, uniform

#: the smallest batch bucket; buckets are powers of two from here
BUCKET_MIN = 8
#: the shortest key/value buffer; buffers are powers of two from here (few shapes to compile)
LENGTH_MIN = 256
#: shapes a compiled step may be specialised for (dynamo's recompile limit is raised to it)
MAX_SHAPES = 64


def bucket(rows: int) -> int:
    """The batch size ``rows`` is padded to: the next power of two, at least BUCKET_MIN."""
    return max(BUCKET_MIN, 1 << (max(rows, 1) - 1).bit_length())


def columns(length: int) -> int:
    """The key/value buffer length for ``length`` tokens: the next power of two, at least
    LENGTH_MIN."""
    return max(LENGTH_MIN, 1 << (length - 1).bit_length())


def pick(
    logits: torch.Tensor, sp: SamplingParams, used: torch.Tensor | None, u: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step's tokens [R] and their log-probs [R] from ``logits`` [R, V]: penalized
    logits (``used`` [R, V]: tokens seen, or None) pick the token, by argmax when greedy or by
    each row's uniform number ``u`` [R]; the log-prob kept is the policy's at the temperature
    (see Rollout)."""
    raw, scale = logits.float(), 1.0 if sp.greedy else sp.temperature
    z = raw / scale if scale != 1.0 else raw
    picked = (
        z if used is None else apply_repetition_penalty(raw, used, sp.repetition_penalty) / scale
    )
    if sp.greedy:
        tok = torch.argmax(picked, dim=-1)
    else:
        tok = draw(picked, u, sp.top_k, sp.top_p, sp.min_p)
    return tok, torch.log_softmax(z, dim=-1).gather(1, tok[:, None]).squeeze(1)


def decode_step(decoder, head, keys, values, usable, tok, pos, col) -> torch.Tensor:
    """Logits [B, V] (float32) after feeding ``tok`` [B] at positions ``pos`` [B, 1], its keys
    and values written at column ``col`` [1] of each layer's ``keys``/``values`` [B, kv, L, d];
    a row attends to the columns ``usable`` [B, L] marks, up to ``col``. Every shape is fixed
    by the buffers: the function compiled and replayed as a CUDA graph."""
    B, x = tok.shape[0], decoder.embed_tokens(tok)
    cos, sin = decoder.rotary_emb(x, pos)  # [B, 1, d]
    cos, sin = cos[:, :, None], sin[:, :, None]  # over [B, kv, g, d]
    cols = torch.arange(usable.shape[1], device=tok.device)
    seen = usable & (cols <= col)
    bias = torch.zeros(seen.shape, dtype=x.dtype, device=x.device)
    bias = bias.masked_fill(~seen, torch.finfo(x.dtype).min)[:, None, None, :]
    for i, layer in enumerate(decoder.layers):
        a, h = layer.self_attn, _rms(x, layer.input_layernorm)
        kv, d = keys[i].shape[1], keys[i].shape[3]
        q = _rotate(_linear(h, a.q_proj).view(B, kv, -1, d), cos, sin)
        keys[i].index_copy_(2, col, _rotate(_linear(h, a.k_proj).view(B, kv, 1, d), cos, sin))
        values[i].index_copy_(2, col, _linear(h, a.v_proj).view(B, kv, 1, d))
        scores = (q * a.scaling) @ keys[i].transpose(-1, -2) + bias  # [B, kv, g, L]
        w = torch.softmax(scores.float(), -1).to(q.dtype)
        x = x + _linear((w @ values[i]).reshape(B, -1), a.o_proj)
        mlp, h = layer.mlp, _rms(x, layer.post_attention_layernorm)
        x = x + _linear(
            mlp.act_fn(_linear(h, mlp.gate_proj)) * _linear(h, mlp.up_proj), mlp.down_proj
        )
    return head(_rms(x, decoder.norm)).float()


class _Buffers:
    """One (bucket, length) shape's key/value buffers and usable-column table, kept for the
    generator's life: a CUDA graph replays on the addresses it was captured with."""

    def __init__(self, decoder, B: int, L: int, dtype, device):
        cfg = decoder.config
        kv = cfg.num_key_value_heads
        d = decoder.layers[0].self_attn.head_dim
        shape = (B, kv, L, d)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in decoder.layers]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in decoder.layers]
        self.usable = torch.zeros((B, L), dtype=torch.bool, device=device)
        for t in (*self.keys, *self.values, self.usable):
            torch._dynamo.mark_static_address(t)

    def fill(self, keys, values, cached: torch.Tensor, idx: torch.Tensor) -> None:
        """Row r takes prompt ``idx[r]``'s prefilled keys and values over its first columns;
        its usable columns are that prompt's real tokens and every column after them."""
        Lc = cached.shape[1]
        for mine, theirs in zip((*self.keys, *self.values), (*keys, *values)):
            mine[:, :, :Lc].copy_(theirs[idx])
        self.usable[:, :Lc].copy_(cached[idx] > 0)
        self.usable[:, Lc:] = True


def prefill(decoder, head, ids: torch.Tensor, mask: torch.Tensor):
    """(logits at each prompt's last token [P, V] in float32, per-layer keys and values [P, kv,
    Lp, d]) of left-padded prompts ``ids``/``mask`` [P, Lp], one batched forward."""
    out = decoder(
        input_ids=ids,
        attention_mask=mask,
        position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
        use_cache=True,
    )
    cache = getattr(out, "cache", None) or out.past_key_values
    logits = head(out.last_hidden_state[:, -1]).float()
    return logits, [c.keys for c in cache.layers], [c.values for c in cache.layers]


def prompt_tokens(ids: torch.Tensor, mask: torch.Tensor, vocab: int) -> torch.Tensor:
    """[R, vocab] bool: the tokens of each row's prompt ``ids``/``mask`` [R, Lp] (padding
    left out): where the repetition penalty starts from."""
    seen = torch.zeros((ids.shape[0], vocab), dtype=torch.int32, device=ids.device)
    return seen.scatter_add_(1, ids, mask.int()) > 0


def agrees(decoder, head, pad: int, tol: float) -> bool:
    """Whether :func:`decode_step` (uncompiled) gives the logits of one plain forward over
    the whole sequence (relative ``tol``): three left-padded prompts of unequal length, four
    decode steps. Checked once at set-up, on these weights."""
    V, dev = head.weight.shape[0], head.weight.device
    prompts = [[1, 2, 3, 4, 5], [3, 4], [6, 7, 8]]
    ids = torch.tensor([[pad] * (5 - len(p)) + p for p in prompts], device=dev) % V
    mask = torch.tensor([[0] * (5 - len(p)) + [1] * len(p) for p in prompts], device=dev)
    toks = (torch.arange(3, device=dev)[:, None] * 7 + torch.arange(4, device=dev) * 3 + 1) % V
    whole = torch.cat([mask, torch.ones_like(toks)], 1)
    out = decoder(
        input_ids=torch.cat([ids, toks], 1),
        attention_mask=whole,
        position_ids=(whole.cumsum(-1) - 1).clamp(min=0),
    )
    ref = head(out.last_hidden_state[:, 5:]).float()  # the logits after each decode step
    _, keys, values = prefill(decoder, head, ids, mask)
    buf = _Buffers(decoder, 3, 9, head.weight.dtype, dev)
    buf.fill(keys, values, mask, torch.arange(3, device=dev))
    pos, col = mask.sum(-1, keepdim=True), torch.tensor([5], device=dev)
    for s in range(4):
        mine = decode_step(decoder, head, buf.keys, buf.values, buf.usable, toks[:, s], pos, col)
        if not bool((mine - ref[:, s]).abs().max() <= tol * ref.abs().max()):
            return False
        pos, col = pos + 1, col + 1
    return True


class StaticDecode:
    """The static decode strategy of one hf generator ``gen`` (its pad, EOS ids, tokenizer and
    ``check_every``): the inference weights, the compiled step and the buffers. ``dtype``:
    the inference copy's (the model's own: no copy). ``backend``: torch.compile's (a name or
    a callable); on CUDA, inductor runs in ``reduce-overhead`` mode (CUDA graphs)."""

    def __init__(self, gen, model, device: torch.device, dtype: torch.dtype, backend="inductor"):
        self.gen, self.device, self.dtype, self.model = gen, device, dtype, model
        if dtype != model.get_output_embeddings().weight.dtype:
            self.model = copy.deepcopy(model).eval().requires_grad_(False)
            for p in self.model.parameters():  # not buffers: the rotary inverse frequencies
                p.data = p.data.to(dtype)
        self.decoder = self.model.get_decoder()
        self.head = self.model.get_output_embeddings()
        self.buffers: dict[tuple[int, int], _Buffers] = {}
        graphs = device.type == "cuda" and backend == "inductor"
        limits = torch._dynamo.config
        limits.recompile_limit = max(limits.recompile_limit, MAX_SHAPES)
        self.step = torch.compile(
            decode_step,
            fullgraph=True,
            dynamic=False,
            backend=backend,
            mode="reduce-overhead" if graphs else None,
        )
        self.mark = torch.compiler.cudagraph_mark_step_begin if graphs else _nothing

    def refresh(self, model) -> None:
        """Copy ``model``'s current weights into the inference copy (cast to its dtype), in
        place: the compiled step keeps reading the same tensors."""
        if self.model is model:
            return
        with torch.no_grad():
            for mine, theirs in zip(self.model.parameters(), model.parameters(), strict=True):
                mine.copy_(theirs)

    def _buffers(self, B: int, L: int) -> _Buffers:
        if (B, L) not in self.buffers:
            self.buffers[B, L] = _Buffers(self.decoder, B, L, self.dtype, self.device)
        return self.buffers[B, L]

    @torch.no_grad()
    def decode(self, pids, pmask, rows, n, sp: SamplingParams, seed, row_offset):
        """The hf generator's decode contract: (tokens, live mask, log-probs [R, t], and
        truncated [R]) of rows ``rows`` (row id r: prompt r // n) of the left-padded prompts
        ``pids``/``pmask``. Rows are padded to the bucket with copies of the last."""
        was_training = self.model.training
        self.model.eval()
        R, T = rows.shape[0], sp.max_new_tokens
        B = bucket(R)
        prompts = torch.unique(rows // n)
        idx = torch.searchsorted(prompts, rows // n)
        idx = torch.cat([idx, idx[-1:].expand(B - R)])
        ids = torch.cat([rows, rows[-1:].expand(B - R)]) + row_offset
        ids_p, mask_p = pids[prompts], pmask[prompts]
        with torch.autocast(self.device.type, enabled=False):  # the weights are in their dtype
            logits, keys, values = prefill(self.decoder, self.head, ids_p, mask_p)
            buf = self._buffers(B, columns(mask_p.shape[1] + T))
            buf.fill(keys, values, mask_p, idx)
            noise = uniform(seed, ids, torch.arange(T, device=ids.device)[:, None])
            used = None
            if sp.repetition_penalty != 1.0:
                used = prompt_tokens(ids_p[idx], mask_p[idx], logits.shape[-1])
            start = (mask_p[idx].sum(-1, keepdim=True), mask_p.shape[1])
            out = self._run(buf, logits[idx], start, sp, noise, used)
        self.model.train(was_training)
        return tuple(o[:R] for o in out)

    def _run(self, buf: _Buffers, logits, start, sp: SamplingParams, noise, used):
        """The decode loop over the bucket's rows from ``start`` (positions [B, 1], the first
        free column); the host waits only in :meth:`_finished`."""
        gen, (B, T) = self.gen, (logits.shape[0], sp.max_new_tokens)
        pos, col = start[0], torch.tensor([start[1]], device=logits.device)
        done = torch.zeros(B, dtype=torch.bool, device=logits.device)
        outs = (
            torch.full((B, T), gen.pad, dtype=torch.long, device=logits.device),
            torch.zeros((B, T), dtype=torch.bool, device=logits.device),
            torch.zeros((B, T), dtype=torch.float32, device=logits.device),
        )
        since, ended = 0, False
        for t in range(T):
            tok, lp = pick(logits, sp, used, None if sp.greedy else noise[t])
            outs[0][:, t], outs[1][:, t] = tok.masked_fill(done, gen.pad), ~done
            outs[2][:, t] = lp.masked_fill(done, 0.0)
            if used is not None:
                used.scatter_(1, tok[:, None], True)
            done = done | torch.isin(tok, gen.eos)
            if t == T - 1:
                break
            if (t + 1) % gen.check_every == 0:
                ended, since = self._finished(outs, done, since, t, sp), t + 1
                if ended:
                    break
            self.mark()
            logits = self.step(
                self.decoder, self.head, buf.keys, buf.values, buf.usable, tok, pos, col
            )
            pos, col = pos + 1, col + 1
        if not ended:
            self._finished(outs, done, since, t, sp)
        return outs[0][:, : t + 1], outs[1][:, : t + 1].long(), outs[2][:, : t + 1], ~done

    def _finished(self, outs, done, since: int, t: int, sp: SamplingParams) -> bool:
        """The bounded check, the loop's one host wait: stop strings completed in steps
        ``since``..``t`` end their rows there (``done`` and the outputs changed in place, as
        the eager path would have cut them); whether every row has finished."""
        if sp.stop:
            _cut_at_stops(self.gen, outs, done, since, t, sp.stop)
        return not bool((~done).any())


def _nothing() -> None:
    """No step marking (no CUDA graphs)."""


def _cut_at_stops(gen, outs, done, since: int, t: int, stop: tuple[str, ...]) -> None:
    """End each row at the first of steps ``since``..``t`` (where it was live) whose token
    completes a stop string: later tokens become padding, ``done`` is set."""
    out_tok, out_live, out_lp = outs
    w = stop_window(stop)
    lo = max(since + 1 - w, 0)
    toks, live = out_tok[:, lo : t + 1].tolist(), out_live[:, since : t + 1].tolist()
    for r, flags in enumerate(live):
        for at in (since + s for s, alive in enumerate(flags) if alive):
            if hits_stop(gen.tokenizer, toks[r][max(at + 1 - w, 0) - lo : at + 1 - lo], stop):
                out_tok[r, at + 1 :], out_live[r, at + 1 :] = gen.pad, False
                out_lp[r, at + 1 :], done[r] = 0.0, True
                break
