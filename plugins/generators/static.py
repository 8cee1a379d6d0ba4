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
batch-invariant noise from grpo_core.sampling keyed by (seed, row id, the row's own step)),
so the same seed draws the same tokens as the eager path on the same logits, whichever slot
a row runs in and whenever it starts. Inside it nothing waits for the device except one check
every ``check_every`` steps: stop strings, which need the host's tokenizer, are found there
for the steps since the last check (the completion is cut where the eager path would have
cut it), and rows that have ended hand their slots to waiting rows (continuous batching:
``sampling.batch_size`` rows decode at once, each slot with its own length; a row entering
is prefilled into its slot's first columns). The step's shapes never change as rows come and
go: nothing recompiles.
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
    """Logits [B, V] (float32) after feeding ``tok`` [B] at positions ``pos`` [B, 1], each
    row's keys and values written at its own column ``col`` [B] of each layer's
    ``keys``/``values`` [B, kv, L, d]; a row attends to the columns ``usable`` [B, L] marks, up
    to its column. Every shape is fixed by the buffers: the function compiled and replayed as
    a CUDA graph, whatever each row's length."""
    B, x = tok.shape[0], decoder.embed_tokens(tok)
    cos, sin = decoder.rotary_emb(x, pos)  # [B, 1, d]
    cos, sin = cos[:, :, None], sin[:, :, None]  # over [B, kv, g, d]
    cols = torch.arange(usable.shape[1], device=tok.device)
    seen = usable & (cols[None, :] <= col[:, None])
    bias = torch.zeros(seen.shape, dtype=x.dtype, device=x.device)
    bias = bias.masked_fill(~seen, torch.finfo(x.dtype).min)[:, None, None, :]
    for i, layer in enumerate(decoder.layers):
        a, h = layer.self_attn, _rms(x, layer.input_layernorm)
        kv, d = keys[i].shape[1], keys[i].shape[3]
        at = col[:, None, None, None].expand(B, kv, 1, d)
        q = _rotate(_linear(h, a.q_proj).view(B, kv, -1, d), cos, sin)
        keys[i].scatter_(2, at, _rotate(_linear(h, a.k_proj).view(B, kv, 1, d), cos, sin))
        values[i].scatter_(2, at, _linear(h, a.v_proj).view(B, kv, 1, d))
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

    def fill(self, keys, values, cached: torch.Tensor, idx: torch.Tensor, slots) -> None:
        """Slot ``slots[i]`` takes prompt ``idx[i]``'s prefilled keys and values over its first
        columns; its usable columns are that prompt's real tokens and every column after
        them (what a slot's previous row left there is overwritten before it is read)."""
        Lc = cached.shape[1]
        for mine, theirs in zip((*self.keys, *self.values), (*keys, *values)):
            mine[slots, :, :Lc] = theirs[idx]
        self.usable[slots, :Lc] = cached[idx] > 0
        self.usable[slots, Lc:] = True


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
    buf.fill(keys, values, mask, torch.arange(3, device=dev), torch.arange(3, device=dev))
    pos, col = mask.sum(-1, keepdim=True), torch.full((3,), 5, device=dev)
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
        ``pids``/``pmask``. At most ``sp.batch_size`` rows decode at once, in slots of one
        bucket; a row that finishes hands its slot to the next waiting row."""
        was_training = self.model.training
        self.model.eval()
        R, T = rows.shape[0], sp.max_new_tokens
        slots = min(sp.batch_size or R, R)
        with torch.autocast(self.device.type, enabled=False):  # the weights are in their dtype
            buf = self._buffers(bucket(slots), columns(pmask.shape[1] + T))
            out = _Run(self, buf, (pids, pmask, n), rows, slots, sp, (seed, row_offset)).loop()
        self.model.train(was_training)
        return out


class _Run:
    """One decode call's continuous batching over a bucket's slots. Each slot holds one row
    (a completion) at a time, with its own age (tokens so far), position and column; a row
    enters at a bounded check, its prompt prefilled into its slot, and leaves at the next
    check after it ends (an end token, a stop string, or the budget). The device state is
    fixed-shape tensors the compiled step reads; the host keeps which row each slot holds
    and when it entered (ages advance one a step, so the host knows them without asking).
    Inside the loop the host waits only in :meth:`check`."""

    def __init__(self, dec: StaticDecode, buf: _Buffers, prompts, rows, slots, sp, seed):
        (self.pids, self.pmask, self.n), self.dec, self.buf, self.sp = prompts, dec, buf, sp
        dev, B, (R, T) = rows.device, buf.usable.shape[0], (rows.shape[0], sp.max_new_tokens)
        V = dec.head.weight.shape[0]
        self.rows, self.R, self.T, self.L = rows, R, T, buf.usable.shape[1]
        ids = torch.cat([rows, rows[-1:]]) + seed[1]  # a last, unused row for idle slots
        self.noise = uniform(seed[0], ids, torch.arange(T, device=dev)[:, None])  # [T, R + 1]
        # device state per slot; an idle slot holds the unused row R, ended
        self.row = torch.full((B,), R, dtype=torch.long, device=dev)
        self.age = torch.zeros(B, dtype=torch.long, device=dev)
        self.ended = torch.ones(B, dtype=torch.bool, device=dev)
        self.pos = torch.zeros((B, 1), dtype=torch.long, device=dev)
        self.col = torch.zeros(B, dtype=torch.long, device=dev)
        self.logits = torch.zeros((B, V), device=dev)
        self.used = None  # [B, V] tokens each slot's row has seen: the penalty's
        if sp.repetition_penalty != 1.0:
            self.used = torch.zeros((B, V), dtype=torch.bool, device=dev)
        buf.usable.fill_(True)  # idle slots attend to something: no row of -inf
        self.outs = (  # [R + 1, T]: the last row takes idle slots' writes
            torch.full((R + 1, T), dec.gen.pad, dtype=torch.long, device=dev),
            torch.zeros((R + 1, T), dtype=torch.bool, device=dev),
            torch.zeros((R + 1, T), dtype=torch.float32, device=dev),
        )
        # the host's view: each of the first ``slots`` slots' row (None: free), the step it
        # entered at, how many of its tokens were scanned for stop strings
        self.held: list[int | None] = [None] * slots
        self.entered, self.scanned = [0] * slots, [0] * slots
        self.waiting, self.steps = list(range(R))[::-1], 0  # popped from the end: in order
        self.truncated = [False] * R

    def loop(self):
        """Decode until every row has finished; the outputs cut to the longest completion."""
        self.admit(self.plan())
        due = self.next_check()
        while True:
            self.pick()
            self.steps += 1
            entering: list[tuple[int, int]] = []
            if self.steps == due:
                if self.check():
                    break
                entering = self.plan()
                due = self.next_check()
            if any(r is not None and self.entered[b] < self.steps for b, r in enumerate(self.held)):
                self.advance()  # some row goes on (else every held row is entering)
            if entering:
                self.admit(entering)
        tok, live, lp = (o[: self.R] for o in self.outs)
        width = max(int(live.sum(1).max()), 1)
        truncated = torch.tensor(self.truncated, device=tok.device)
        return tok[:, :width], live[:, :width].long(), lp[:, :width], truncated

    def advance(self) -> None:
        """One compiled decode step over every slot: the logits after each slot's token."""
        dec, buf = self.dec, self.buf
        dec.mark()
        self.logits = dec.step(
            dec.decoder, dec.head, buf.keys, buf.values, buf.usable, self.toks, self.pos, self.col
        )
        self.pos = self.pos + 1
        self.col = torch.clamp(self.col + 1, max=self.L - 1)  # idle slots stay in range

    def pick(self) -> None:
        """Every slot's next token (the eager path's choice, with its row's noise for its
        age); live slots' tokens and log-probs written at (row, age) of the outputs."""
        sp, T = self.sp, self.T
        age = self.age.clamp(max=T - 1)
        live = ~self.ended & (self.age < T)
        u = None if sp.greedy else self.noise[age, self.row]
        tok, lp = pick(self.logits, sp, self.used, u)
        at = torch.where(live, self.row * T + age, self.R * T)
        for out, value in zip(self.outs, (tok, live, lp)):
            out.view(-1).scatter_(0, at, value)
        if self.used is not None:
            self.used.scatter_(1, tok[:, None], True)
        self.ended |= live & torch.isin(tok, self.dec.gen.eos)
        self.age += 1
        self.toks = tok

    def check(self) -> bool:
        """The bounded check, the loop's one host wait: stop strings completed since the last
        check end their rows there (cut as the eager path would have cut them); rows that
        ended or reached the budget free their slots. Whether every row has finished."""
        ended = self.ended.tolist()
        if self.sp.stop:
            self.cut_at_stops(ended)
        for b, r in enumerate(self.held):
            if r is not None and (ended[b] or self.steps - self.entered[b] >= self.T):
                self.truncated[r], self.held[b] = not ended[b], None
        return not self.waiting and all(r is None for r in self.held)

    def cut_at_stops(self, ended: list[bool]) -> None:
        """End each held row at the first token since its last scan (where it was live) that
        completes a stop string: later tokens become padding, the slot ends."""
        held = [(b, r) for b, r in enumerate(self.held) if r is not None]
        stop, tokenizer = self.sp.stop, self.dec.gen.tokenizer
        w, picked = stop_window(stop), torch.tensor([r for _, r in held], device=self.row.device)
        toks, lives = (o[picked].tolist() for o in self.outs[:2])
        for (b, r), tk, lv in zip(held, toks, lives):
            seen = min(self.steps - self.entered[b], self.T)
            for at in range(self.scanned[b], seen):
                if lv[at] and hits_stop(tokenizer, tk[max(at + 1 - w, 0) : at + 1], stop):
                    self.outs[0][r, at + 1 :], self.outs[1][r, at + 1 :] = self.dec.gen.pad, False
                    self.outs[2][r, at + 1 :], ended[b], self.ended[b] = 0.0, True, True
                    break
            self.scanned[b] = seen

    def plan(self) -> list[tuple[int, int]]:
        """(slot, row) pairs: the free slots given to the waiting rows, in row order (the
        host's view changes here; :meth:`admit` changes the device's)."""
        free = [b for b, r in enumerate(self.held) if r is None]
        entering = [(b, self.waiting.pop()) for b in free[: len(self.waiting)]]
        for b, r in entering:
            self.held[b], self.entered[b], self.scanned[b] = r, self.steps, 0
        return entering

    def next_check(self) -> int:
        """The step of the next check: ``check_every`` steps on, or sooner when no row waits
        and every held row reaches the budget before that."""
        every = self.dec.gen.check_every
        if self.waiting:
            return self.steps + every
        ages = [self.steps - self.entered[b] for b, r in enumerate(self.held) if r is not None]
        return self.steps + min(every, self.T - min(ages))

    def admit(self, entering: list[tuple[int, int]]) -> None:
        """Rows enter their slots: their prompts prefilled (one batched forward) into the
        slots' first columns, the prefill's logits their first tokens'."""
        dev = self.row.device
        slots = torch.tensor([b for b, _ in entering], device=dev)
        which = torch.tensor([r for _, r in entering], device=dev)
        rows = self.rows[which]
        prompts = torch.unique(rows // self.n)
        idx = torch.searchsorted(prompts, rows // self.n)
        ids_p, mask_p = self.pids[prompts], self.pmask[prompts]
        logits, keys, values = prefill(self.dec.decoder, self.dec.head, ids_p, mask_p)
        self.buf.fill(keys, values, mask_p, idx, slots)
        self.logits = self.logits.index_copy(0, slots, logits[idx])
        self.row[slots] = which
        self.age[slots], self.ended[slots] = 0, False
        self.pos[slots] = mask_p[idx].sum(-1, keepdim=True)
        self.col[slots] = mask_p.shape[1]
        if self.used is not None:
            self.used[slots] = prompt_tokens(ids_p[idx], mask_p[idx], logits.shape[-1])


def _nothing() -> None:
    """No step marking (no CUDA graphs)."""
