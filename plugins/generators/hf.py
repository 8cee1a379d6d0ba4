"""The ``hf`` generator: a KV-cached decode loop over the policy itself (transformers).

Each prompt is prefilled once and its cache shared by its completions; log-probs under the
sampling distribution are kept, so no extra pass is needed to get the old policy's log-probs.
For small models the per-call cost of a forward, not its arithmetic, bounds decoding, so the
loop keeps its own share small: it runs in inference mode (plain no_grad for sharded FSDP
weights, which refuse it), calls the decoder and the LM head on the last position only (when
that gives the model's own logits), hands SDPA models each decode step's attention mask
ready-made, and draws every step's sampling noise at once.
"""

from __future__ import annotations

import inspect
import weakref

import torch
from grpo_core_plugins.generators.cascade import CascadeDecode, written_out
from grpo_core_plugins.generators.cascade import supports as cascade_supports
from grpo_core_plugins.generators.static import StaticDecode, agrees, pick, prompt_tokens

from grpo_core.errors import PluginError
from grpo_core.hookspecs import Generator, TurnSampler, hookimpl
from grpo_core.rollout import Rollout, SamplingParams, pad_left, pad_right
from grpo_core.sampling import hits_stop, stop_window, uniform

GRPO_CORE_API = (2,)


def eos_ids(model, tokenizer) -> list[int]:
    """Every id that ends a completion: the tokenizer's EOS and the generation config's."""
    ids = {tokenizer.eos_token_id}
    gen = getattr(model, "generation_config", None)
    extra = getattr(gen, "eos_token_id", None) if gen is not None else None
    ids.update(extra if isinstance(extra, (list, tuple)) else [extra])
    return sorted(i for i in ids if i is not None)


def _prepared_mask_key(model) -> str | None:
    """ "full_attention" when a decode step can be given its attention mask ready-made: SDPA
    attention, every layer full attention, and a decoder that takes a prepared mask mapping
    (transformers' models name it ``causal_mask_mapping``). A decode step's mask is then the
    padding mask itself (every key so far precedes the query), so transformers' per-call
    mask construction can be skipped. None: let the model build it."""
    cfg = getattr(model, "config", None)
    if getattr(cfg, "_attn_implementation", None) != "sdpa":
        return None
    types = getattr(cfg, "layer_types", None)
    if not types or not _full_attention(model):
        return None
    get = getattr(model, "get_decoder", None)
    try:
        src = inspect.getsource(type(get()).forward) if get else ""
    except (OSError, TypeError):
        return None
    return "full_attention" if "causal_mask_mapping" in src else None


def _full_attention(model) -> bool:
    """Every layer attends to every earlier key (no sliding window, whose span counts cache
    slots, padding included): then padding anywhere in the cache is only masked keys."""
    cfg = getattr(model, "config", None)
    types = getattr(cfg, "layer_types", None)
    if types:
        return all(t == "full_attention" for t in types)
    return getattr(cfg, "sliding_window", None) is None


class _InPlace:
    """A cache layer's ``update`` that writes each step's keys and values into room made
    once, instead of concatenating (which copies the whole cache every step: quadratic in
    the length, a quarter of decoding at 150-token prompts). Holds its layer weakly, so the
    cache is freed as soon as the loop drops it."""

    def __init__(self, layer, room: int):
        k, v = layer.keys, layer.values
        self.n, self.layer = k.shape[-2], weakref.ref(layer)
        self.k = k.new_empty((*k.shape[:-2], self.n + room, k.shape[-1]))
        self.v = v.new_empty((*v.shape[:-2], self.n + room, v.shape[-1]))
        self.k[..., : self.n, :], self.v[..., : self.n, :] = k, v

    def select(self, rows: torch.Tensor) -> None:
        """Keep only the batch rows ``rows`` (the layer's ``batch_select_indices``)."""
        self.k, self.v, layer = self.k[rows], self.v[rows], self.layer()
        layer.keys, layer.values = self.k[..., : self.n, :], self.v[..., : self.n, :]

    def __call__(self, key_states, value_states, *args, **kwargs):
        end = self.n + key_states.shape[-2]
        if end > self.k.shape[-2]:  # more than promised: make more room
            self.k = torch.cat([self.k, torch.empty_like(self.k)], -2)
            self.v = torch.cat([self.v, torch.empty_like(self.v)], -2)
            return self(key_states, value_states)
        self.k[..., self.n : end, :], self.v[..., self.n : end, :] = key_states, value_states
        self.n, layer = end, self.layer()
        layer.keys, layer.values = self.k[..., :end, :], self.v[..., :end, :]
        return layer.keys, layer.values


def _make_room(cache, room: int) -> None:
    """Give every plain growing (full-attention) layer of ``cache`` room for ``room`` more
    tokens; other layer kinds (sliding windows, quantized, ...) keep their own ``update``."""
    for layer in getattr(cache, "layers", ()):
        if (
            type(layer).__name__ == "DynamicLayer"
            and isinstance(getattr(layer, "keys", None), torch.Tensor)
            and layer.keys.dim() == 4
        ):
            layer.update = _InPlace(layer, room)
            layer.batch_select_indices = layer.update.select


def _direct_parts(model):
    """(decoder, LM head) when running them directly gives the model's own logits (no
    soft-capping or scaling after the head: checked once on a few tokens), else (None, None)
    and the loop calls the whole model."""
    get_dec = getattr(model, "get_decoder", None)
    get_head = getattr(model, "get_output_embeddings", None)
    decoder = get_dec() if get_dec else None
    head = get_head() if get_head else None
    if decoder is None or head is None:
        return None, None
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            ids = (torch.arange(1, 6) % head.weight.shape[0])[None].to(head.weight.device)
            full = model(input_ids=ids).logits[0, -1].float()
            mine = head(decoder(input_ids=ids).last_hidden_state[0, -1]).float()
        same = bool((full - mine).abs().max() <= 1e-5 * full.abs().max().clamp(min=1e-6))
    except (RuntimeError, TypeError, ValueError, AttributeError):
        same = False
    finally:
        model.train(was_training)
    return (decoder, head) if same else (None, None)


def _shared_head(ids: torch.Tensor, mask: torch.Tensor) -> int:
    """How many leading real tokens every left-padded prompt in ``ids`` [P, Lp] shares,
    leaving each at least one token of its own."""
    lengths = mask.sum(-1)
    shortest = int(lengths.min())
    if shortest < 2:
        return 0
    Lp = mask.shape[1]
    firsts = Lp - lengths  # each row's first real column
    cols = firsts[:, None] + torch.arange(shortest - 1, device=ids.device)[None]
    heads = ids.gather(1, cols)  # [P, shortest - 1]: each prompt's opening tokens
    differs = (heads != heads[:1]).any(0)
    return int(differs.int().argmax()) if bool(differs.any()) else shortest - 1


class _ModelSteps:
    """Decode steps through the model's own forward, on transformers' cache: the prompts'
    keys and values repeated for each row, the cache grown in place, SDPA models handed
    each step's attention mask ready-made (the padding mask, as an additive one)."""

    def __init__(self, gen: HFGenerator, cache, cached, local, T: int, dtype: torch.dtype):
        cache.batch_select_indices(local)
        _make_room(cache, T - 1)
        self.gen, self.cache, self.Lp, self.t = gen, cache, cached.shape[1], 0
        self.attn = torch.cat([cached[local], cached.new_ones((local.shape[0], T))], 1)
        self.keep = None  # a bool mask would be converted in every layer of every step
        if gen.mask_key:
            keep = torch.zeros(self.attn.shape, dtype=dtype, device=self.attn.device)
            self.keep = keep.masked_fill_(self.attn == 0, float("-inf"))[:, None, None, :]

    def select(self, kept: torch.Tensor) -> None:
        """Keep only rows ``kept``."""
        self.cache.batch_select_indices(kept)
        self.attn = self.attn[kept]
        self.keep = None if self.keep is None else self.keep[kept]

    def step(self, tok: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Logits [R, V] after feeding ``tok`` [R] at positions ``pos`` [R, 1]."""
        seen = self.Lp + self.t + 1
        gen, self.t = self.gen, self.t + 1
        mask = self.attn[:, :seen] if self.keep is None else {gen.mask_key: self.keep[..., :seen]}
        logits, self.cache = gen._step(tok[:, None], mask, pos, self.cache)
        return logits


def _same_logits(steps: list, local, pos, V: int, tol: float) -> bool:
    """Whether two decode-step objects give the same logits (relative ``tol``) over four
    steps of fixed tokens, rows 2, 3 and 4 leaving after the second step."""
    tok = torch.arange(local.shape[0], device=local.device)
    for t in range(4):
        if t == 2:
            kept = torch.tensor([0, 1, 5], device=local.device)
            for s in steps:
                s.select(kept)
            tok, pos = tok[kept], pos[kept]
        mine, own = (s.step((tok + 7 * t) % V, pos).float() for s in steps)
        if not bool((mine - own).abs().max() <= tol * own.abs().max().clamp(min=1e-6)):
            return False
        pos = pos + 1
    return True


class HFGenerator(Generator):
    """Generates with the training model; nothing to sync after an optimizer step."""

    supports_episodes = True

    def __init__(
        self,
        check_every: int = 8,
        share_min: int = 16,
        cascade: bool = True,
        decode: str = "auto",
        compile_backend="inductor",
    ):
        self.check_every = check_every
        self.share_min = share_min  # shared opening tokens worth a prefill of their own
        self.cascade = cascade  # asked for; set up only where it applies and agrees
        self.decode, self.compile_backend = decode, compile_backend
        self.model, self.static = None, None

    def setup(self, model, tokenizer, device) -> None:
        # a LoRA model's adapters live inside its base model: call that directly
        model = model.get_base_model() if hasattr(model, "disable_adapter") else model
        self.model, self.tokenizer, self.device = model, tokenizer, device
        self.eos = torch.tensor(eos_ids(model, tokenizer), device=device)
        pad = tokenizer.pad_token_id
        self.pad = pad if pad is not None else int(self.eos[0])
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self.mask_key = _prepared_mask_key(model)
        self.shares_heads = _full_attention(model)
        self.decoder, self.head = _direct_parts(model)
        self.static = self._static_decode(model, device)
        self.cascade = (
            self.static is None
            and self.cascade
            and cascade_supports(model, self.decoder, self.head, device)
            and self._cascade_agrees()
        )

    def _static_decode(self, model, device: torch.device) -> StaticDecode | None:
        """The decode strategy, chosen once: static-shape steps (plugins/generators/static.py)
        when asked (``decode: static``) or on CUDA (``auto``), for a model whose layers are
        the written-out Llama-family layer and whose logits it reproduces; else None, the
        eager loop. ``static`` asked for a model it cannot serve is an error."""
        from torch.distributed.fsdp import FSDPModule

        if self.decode == "eager" or (self.decode == "auto" and device.type != "cuda"):
            return None
        fits = (
            written_out(model, self.decoder, self.head)
            and not any(isinstance(m, FSDPModule) for m in model.modules())
            and not any(hasattr(p, "ds_id") for p in model.parameters())  # ZeRO-3 partitions
        )
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                # float32 rounding over 30 layers (SmolLM2): 1.4e-4 of the largest logit
                tol = 1e-3 if self.head.weight.dtype == torch.float32 else 3e-2
                fits = fits and agrees(self.decoder, self.head, self.pad, tol)
        except (RuntimeError, TypeError, ValueError, AttributeError, IndexError):
            fits = False
        finally:
            model.train(was_training)
        if not fits:
            if self.decode == "static":
                raise PluginError(
                    "generator hf: decode: static needs a Llama-family model (llama, mistral, "
                    "qwen2) with plain linear layers, not sharded; use decode: auto or eager"
                )
            return None
        dtype = torch.bfloat16 if device.type == "cuda" else self.head.weight.dtype
        return StaticDecode(self, model, device, dtype, self.compile_backend)

    def _cascade_agrees(self) -> bool:
        """Whether cascade decoding gives the model's own logits (to float32 rounding) on
        three prompts of unequal length, two rows each, over four decode steps, after the
        second of which one prompt's rows both leave and another's one: checked once, on
        this model."""
        V, was_training = self.head.weight.shape[0], self.model.training
        ids, mask = pad_left([[1, 2, 3, 4, 5], [3, 4], [6, 7, 8]], self.pad)
        ids, mask = ids.to(self.device) % V, mask.to(self.device)
        local = torch.tensor([0, 0, 1, 1, 2, 2], device=self.device)
        tol = 1e-4  # float32 rounding of a few layers is ~1e-6 of the largest logit
        self.model.eval()
        try:
            with torch.inference_mode():
                steps = []
                for cascade in (True, False):
                    logits, cache, cached = self._prefill(ids, mask)
                    steps.append(self._steps(cache, cached, local, 5, logits.dtype, cascade))
                return _same_logits(steps, local, mask.sum(-1, keepdim=True)[local], V, tol)
        except (RuntimeError, TypeError, ValueError, AttributeError, IndexError):
            return False
        finally:
            self.model.train(was_training)

    def sync_weights(self, model) -> None:
        """Eager decoding samples from the training model itself: nothing to do. Static
        decoding's inference copy (bf16 on CUDA) takes the updated weights."""
        if self.static is not None:
            model = model.get_base_model() if hasattr(model, "disable_adapter") else model
            self.static.refresh(model)

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: list[list[int]],
        n: int,
        sampling: SamplingParams,
        seed: int = 0,
        row_offset: int = 0,
    ) -> Rollout:
        """``n`` completions of each prompt. Row ids (for noise) are row_offset + p * n + j."""
        P = len(prompt_ids)
        pids, pmask = (t.to(self.device) for t in pad_left(prompt_ids, self.pad))
        rows = torch.arange(P * n, device=self.device)
        cap = P * n if self.static is not None else sampling.batch_size or P * n
        parts = [  # static decoding batches continuously: every row in one call
            self._decode(pids, pmask, rows[s : s + cap], n, sampling, seed, row_offset)
            for s in range(0, P * n, cap)
        ]
        ids = pad_right([p[0] for p in parts], self.pad)
        return Rollout(
            pids,
            pmask,
            ids,
            pad_right([p[1] for p in parts], 0),
            pad_right([p[2] for p in parts], 0.0),
            torch.cat([p[3] for p in parts]),
            rows // n,
        )

    def _step(self, input_ids, attention_mask, position_ids, cache=None):
        """(logits at the last position [R, V], the KV cache) of one forward."""
        kw = {} if cache is None else {self._cache_kw: cache}
        if self.decoder is not None:
            out = self.decoder(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=True,
                **kw,
            )
            logits = self.head(out.last_hidden_state[:, -1])
        else:
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=True,
                logits_to_keep=1,
                **kw,
            )
            logits = out.logits[:, -1]
        new = getattr(out, "cache", None)
        return logits, new if new is not None else out.past_key_values

    def _prefill(self, ids: torch.Tensor, mask: torch.Tensor):
        """(logits at each prompt's last token [P, V], the KV cache, the mask over the cache's
        positions [P, L]) of left-padded prompts ``ids``/``mask`` [P, Lp].

        Prompts that open with the same tokens (a system prompt and a chat template's
        header: often most of a short prompt) run that shared head once, and only their
        own tails as a batch after it: the cache then holds the head, each row's padding,
        its tail (padding in the middle is masked like padding on the left, and positions
        count real tokens only). Below ``share_min`` shared tokens, for one prompt, or for a
        model with sliding-window layers, the plain batched prefill."""
        c = _shared_head(ids, mask) if self.shares_heads else 0
        if ids.shape[0] < 2 or c < max(self.share_min, 1):
            logits, cache = self._step(ids, mask, (mask.cumsum(-1) - 1).clamp(min=0))
            return logits, cache, mask
        P, Lp = mask.shape
        firsts = Lp - mask.sum(-1, keepdim=True)  # each prompt's first real column
        start = int(firsts[0])
        head = ids[:1, start : start + c]  # the first prompt's opening tokens
        _, cache = self._step(head, torch.ones_like(head), torch.arange(c, device=ids.device)[None])
        cache.batch_repeat_interleave(P)
        # left-padded, so the tails are the last columns; each keeps at least one token
        tail_len = Lp - int(firsts.min()) - c
        cols = torch.arange(Lp, device=ids.device)[None]
        tail_mask = (cols >= firsts + c).to(mask.dtype)[:, Lp - tail_len :]
        full = torch.cat([tail_mask.new_ones((P, c)), tail_mask], 1)
        logits, cache = self._step(
            ids[:, Lp - tail_len :],
            full,
            c + (tail_mask.cumsum(-1) - 1).clamp(min=0),
            cache,
        )
        return logits, cache, full

    def start_episodes(
        self,
        prompt_ids: list[list[int]],
        n: int,
        sampling: SamplingParams,
        seed: int = 0,
        row_offset: int = 0,
    ) -> TurnSampler:
        """Trajectories sampled turn by turn on one growing KV cache
        (plugins/generators/hf_turns.py)."""
        from grpo_core_plugins.generators.hf_turns import HFTurns

        return HFTurns(self, prompt_ids, n, sampling, seed, row_offset)

    def _forward(self, **kw):
        if "cache" in kw:
            kw[self._cache_kw] = kw.pop("cache")
        return self.model(use_cache=True, **kw)

    def _decode(self, pids, pmask, rows, n, sp: SamplingParams, seed, row_offset):
        """The decode loop in inference mode (less bookkeeping per op than no_grad: no
        version counters or autograd dispatch, which small models' decode steps feel); its
        results are copied out of it, so the trainer can use them. Plain no_grad for a
        sharded model, whose gathered weights are reused buffers that inference mode
        refuses."""
        from torch.distributed.fsdp import FSDPModule

        if self.static is not None:
            return self.static.decode(pids, pmask, rows, n, sp, seed, row_offset)
        if isinstance(self.model, FSDPModule):
            with torch.no_grad():
                return self._loop(pids, pmask, rows, n, sp, seed, row_offset)
        with torch.inference_mode():
            out = self._loop(pids, pmask, rows, n, sp, seed, row_offset)
        return tuple(t.clone() for t in out)

    def _loop(self, pids, pmask, rows, n, sp: SamplingParams, seed, row_offset):
        was_training = self.model.training
        self.model.eval()
        prompts = torch.unique(rows // n)  # each prompt in this chunk is prefilled once
        local = torch.searchsorted(prompts, rows // n)
        logits, cache, cached = self._prefill(pids[prompts], pmask[prompts])
        R, T = rows.shape[0], sp.max_new_tokens
        steps = self._steps(cache, cached, local, T, logits.dtype, self.cascade)
        logits, pos = logits[local], cached[local].sum(-1, keepdim=True)
        noise = (
            None
            if sp.greedy
            else uniform(seed, rows + row_offset, torch.arange(T, device=rows.device)[:, None])
        )
        done = torch.zeros(R, dtype=torch.bool, device=pids.device)
        used = None  # [R, V] tokens in each row so far (prompt, not padding): the penalty's
        if sp.repetition_penalty != 1.0:
            used = prompt_tokens(pids[rows // n], pmask[rows // n], logits.shape[-1])
        out_tok = torch.full((R, T), self.pad, dtype=torch.long, device=pids.device)
        out_live = torch.zeros((R, T), dtype=torch.bool, device=pids.device)
        out_lp, at = None, slice(None)  # ``at``: the batch's rows in the outputs
        for t in range(T):
            tok, lp = pick(logits, sp, used, None if noise is None else noise[t])
            out_lp = lp.new_zeros((R, T)) if out_lp is None else out_lp
            out_live[at, t], out_tok[at, t] = ~done, tok.masked_fill(done, self.pad)
            out_lp[at, t] = lp.masked_fill(done, 0.0)
            if used is not None:
                used.scatter_(1, tok[:, None], True)
            stopped = (
                self._stopped(
                    out_tok[at, max(t + 1 - stop_window(sp.stop), 0) : t + 1], done, sp.stop
                )
                if sp.stop
                else False
            )
            done = done | torch.isin(tok, self.eos) | stopped
            if t == T - 1:
                break
            if (t + 1) % self.check_every == 0:
                left = int((~done).sum())
                if left == 0:
                    break
                # finished rows leave the batch once the decode work that saves (rows x steps
                # left) reaches a step of the whole batch: about what copying the cache costs
                if (len(done) - left) * (T - t - 1) >= len(done):
                    kept = torch.nonzero(~done).squeeze(1)
                    at = kept if isinstance(at, slice) else at[kept]
                    steps.select(kept)
                    tok, done, pos = tok[kept], done[kept], pos[kept]
                    noise = None if noise is None else noise[:, kept]
                    used = None if used is None else used[kept]
            logits = steps.step(tok, pos)
            pos = pos + 1
        self.model.train(was_training)
        truncated = torch.zeros(R, dtype=torch.bool, device=pids.device)
        truncated[at] = ~done  # rows that left the batch had finished
        return out_tok[:, : t + 1], out_live[:, : t + 1].long(), out_lp[:, : t + 1], truncated

    def _steps(self, cache, cached, local, T: int, dtype: torch.dtype, cascade: bool):
        """The decode steps after a prefill (``cache`` over positions ``cached`` [P, L] of
        the chunk's prompts; ``local`` [R]: each row's prompt): cascade decoding, or the
        model's own forward on transformers' cache."""
        if cascade:
            keys = [layer.keys for layer in cache.layers]
            values = [layer.values for layer in cache.layers]
            return CascadeDecode(self.decoder, self.head, keys, values, cached, local, T - 1)
        return _ModelSteps(self, cache, cached, local, T, dtype)

    def _stopped(
        self, tail: torch.Tensor, done: torch.Tensor, stop: tuple[str, ...]
    ) -> torch.Tensor:
        """[R] bool: rows still going whose newest token completes a stop string (only the
        decoded ``tail`` [R, window] of their last tokens is looked at)."""
        hit = torch.zeros_like(done)
        tail = tail.tolist()
        for i in torch.nonzero(~done).squeeze(1).tolist():
            hit[i] = hits_stop(self.tokenizer, tail[i], stop)
        return hit


@hookimpl
def generator(register):
    register(
        "hf",
        HFGenerator,
        schema={
            "type": "object",
            "properties": {
                "check_every": {
                    "type": "integer",
                    "minimum": 1,
                    "default": 8,
                    "description": "decode steps between all-finished checks",
                },
                "cascade": {
                    "type": "boolean",
                    "default": True,
                    "description": "decode Llama-family models on the CPU with each prompt's "
                    "keys and values read once for all its completions (used where its logits "
                    "equal the model's own, checked at set-up)",
                },
                "decode": {
                    "enum": ["auto", "eager", "static"],
                    "default": "auto",
                    "description": "static: fixed-shape decode steps compiled once per batch "
                    "bucket (CUDA graphs and a bf16 inference copy on CUDA; Llama-family "
                    "models), rows that end replaced by waiting ones (continuous batching); "
                    "eager: the model's own forward (or cascade decoding) step by step; auto: "
                    "static on CUDA where it applies, else eager",
                },
                "compile_backend": {
                    "type": "string",
                    "default": "inductor",
                    "description": "torch.compile backend of the static decode step (inductor "
                    "on CUDA runs it as CUDA graphs; eager or aot_eager: no code generation)",
                },
                "share_min": {
                    "type": "integer",
                    "minimum": 1,
                    "default": 16,
                    "description": "opening tokens all of a batch's prompts share (a system "
                    "prompt) that are prefilled once for all of them",
                },
            },
            "additionalProperties": False,
        },
        description="KV-cached sampling with the training model (transformers)",
    )
