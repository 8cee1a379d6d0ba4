"""The ``hf`` generator: a KV-cached decode loop over the policy itself (transformers).

Each prompt is prefilled once and its cache shared by its completions; log-probs under the
sampling distribution are kept, so no extra pass is needed to get the old policy's log-probs.
"""

from __future__ import annotations

import inspect

import torch

from grpo_core.hookspecs import Generator, TurnSampler, hookimpl
from grpo_core.rollout import Rollout, SamplingParams, pad_right
from grpo_core.sampling import sample

GRPO_CORE_API = (2,)


def eos_ids(model, tokenizer) -> list[int]:
    """Every id that ends a completion: the tokenizer's EOS and the generation config's."""
    ids = {tokenizer.eos_token_id}
    gen = getattr(model, "generation_config", None)
    extra = getattr(gen, "eos_token_id", None) if gen is not None else None
    ids.update(extra if isinstance(extra, (list, tuple)) else [extra])
    return sorted(i for i in ids if i is not None)


class HFGenerator(Generator):
    """Generates with the training model; nothing to sync after an optimizer step."""

    supports_episodes = True

    def __init__(self, check_every: int = 8):
        self.check_every = check_every
        self.model = None

    def setup(self, model, tokenizer, device) -> None:
        # a LoRA model's adapters live inside its base model: call that directly
        model = model.get_base_model() if hasattr(model, "disable_adapter") else model
        self.model, self.tokenizer, self.device = model, tokenizer, device
        self.eos = torch.tensor(eos_ids(model, tokenizer), device=device)
        pad = tokenizer.pad_token_id
        self.pad = pad if pad is not None else int(self.eos[0])
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    def sync_weights(self, model) -> None:
        """Nothing to do: this backend samples from the training model itself."""

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], n: int, sampling: SamplingParams,
                 seed: int = 0, row_offset: int = 0) -> Rollout:
        """``n`` completions of each prompt. Row ids (for noise) are row_offset + p * n + j."""
        P = len(prompt_ids)
        width = max(len(p) for p in prompt_ids)
        pids = torch.full((P, width), self.pad, dtype=torch.long)
        pmask = torch.zeros((P, width), dtype=torch.long)
        for i, p in enumerate(prompt_ids):
            pids[i, width - len(p):] = torch.tensor(p)
            pmask[i, width - len(p):] = 1
        pids, pmask = pids.to(self.device), pmask.to(self.device)
        rows = torch.arange(P * n, device=self.device)
        cap = sampling.batch_size or P * n
        parts = [self._decode(pids, pmask, rows[s:s + cap], n, sampling, seed, row_offset)
                 for s in range(0, P * n, cap)]
        ids = pad_right([p[0] for p in parts], self.pad)
        return Rollout(pids, pmask, ids, pad_right([p[1] for p in parts], 0),
                       pad_right([p[2] for p in parts], 0.0), torch.cat([p[3] for p in parts]),
                       rows // n)

    def start_episodes(self, prompt_ids: list[list[int]], n: int, sampling: SamplingParams,
                       seed: int = 0, row_offset: int = 0) -> TurnSampler:
        """Trajectories sampled turn by turn on one growing KV cache (plugins/hf_turns.py)."""
        from grpo_core_plugins.hf_turns import HFTurns

        return HFTurns(self, prompt_ids, n, sampling, seed, row_offset)

    def _forward(self, **kw):
        if "cache" in kw:
            kw[self._cache_kw] = kw.pop("cache")
        return self.model(use_cache=True, **kw)

    def _decode(self, pids, pmask, rows, n, sp: SamplingParams, seed, row_offset):
        was_training = self.model.training
        self.model.eval()
        prompts = torch.unique(rows // n)  # each prompt in this chunk is prefilled once
        local = torch.searchsorted(prompts, rows // n)
        mask = pmask[prompts]
        out = self._forward(input_ids=pids[prompts], attention_mask=mask,
                            position_ids=(mask.cumsum(-1) - 1).clamp(min=0), logits_to_keep=1)
        cache = getattr(out, "cache", None) or out.past_key_values
        cache.batch_select_indices(local)
        logits = out.logits[local, -1]
        attn = pmask[rows // n]
        pos = attn.sum(-1, keepdim=True)
        R, T = rows.shape[0], sp.max_new_tokens
        ids = torch.full((R, T), self.pad, dtype=torch.long, device=pids.device)
        logps = torch.zeros((R, T), dtype=torch.float32, device=pids.device)
        live = torch.ones((R, T), dtype=torch.long, device=pids.device)
        done = torch.zeros(R, dtype=torch.bool, device=pids.device)
        steps = T
        for t in range(T):
            z = logits.float() / (1.0 if sp.greedy else sp.temperature)
            if sp.greedy:
                tok = torch.argmax(z, dim=-1)
            else:
                tok = sample(z, seed, rows + row_offset, t, sp.top_k, sp.top_p)
            lp = torch.log_softmax(z, dim=-1).gather(1, tok[:, None]).squeeze(1)
            live[:, t] = (~done).long()
            ids[:, t] = torch.where(done, self.pad, tok)
            logps[:, t] = torch.where(done, 0.0, lp)
            done = done | torch.isin(tok, self.eos)
            if t == T - 1 or ((t + 1) % self.check_every == 0 and bool(done.all())):
                steps = t + 1
                break
            attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=1)
            out = self._forward(input_ids=tok[:, None], attention_mask=attn, position_ids=pos,
                                cache=cache)
            logits, pos = out.logits[:, -1], pos + 1
        self.model.train(was_training)
        live = live[:, :steps]
        return ids[:, :steps], live, logps[:, :steps], ~done


@hookimpl
def generator(register):
    register("hf", HFGenerator, schema={
        "type": "object",
        "properties": {"check_every": {"type": "integer", "minimum": 1, "default": 8,
                                       "description": "decode steps between all-finished checks"}},
        "additionalProperties": False,
    }, description="KV-cached sampling with the training model (transformers)")
