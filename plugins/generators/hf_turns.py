"""Multi-turn sampling for the ``hf`` generator: trajectories that alternate model turns with
an environment's tokens, decoded together and never re-prefilled.

Each prompt is prefilled once and its KV cache copied to its ``n`` trajectories; after that
the cache only grows. A turn appends the environment's tokens (one forward over the new
tokens only: prefix caching across turns) and then decodes every trajectory still in the
episode at once. Trajectories advance by different amounts, so a batch row of the cache can
hold *holes*: positions masked out of attention (a row that finished its turn while others
decode, the left padding of a chunk of environment tokens). Position ids count real tokens
only, so every trajectory sees exactly what a single forward over its own tokens would:
sampling log-probs equal the trainer's recomputation (up to summation order).
"""

from __future__ import annotations

import torch

from grpo_core.hookspecs import Turn, TurnSampler
from grpo_core.rollout import SamplingParams, pad_left
from grpo_core.sampling import apply_repetition_penalty, hits_stop, sample, stop_window


def _acc(t: torch.Tensor) -> torch.dtype:
    """Float64 logits stay float64 (exact tests); anything narrower is computed in float32."""
    return torch.promote_types(t.dtype, torch.float32)


class HFTurns(TurnSampler):
    """Trajectories ``0 .. P*n - 1`` of an :class:`~grpo_core_plugins.generators.hf.HFGenerator`;
    trajectory ``r`` continues prompt ``r // n`` and draws the noise of row
    ``row_offset + r`` at each of its positions after the prompt."""

    def __init__(
        self,
        gen,
        prompt_ids: list[list[int]],
        n: int,
        sampling: SamplingParams,
        seed: int,
        row_offset: int,
    ):
        self.gen, self.sp, self.seed = gen, sampling, seed
        self.model, self.device = gen.model, gen.device
        self.was_training = self.model.training
        self.model.eval()
        P = len(prompt_ids)
        pids, pmask = (t.to(self.device) for t in pad_left(prompt_ids, gen.pad))
        with torch.no_grad():
            out = gen._forward(
                input_ids=pids,
                attention_mask=pmask,
                position_ids=(pmask.cumsum(-1) - 1).clamp(min=0),
                logits_to_keep=1,
            )
        index = torch.arange(P * n, device=self.device) // n
        self.cache = getattr(out, "cache", None) or out.past_key_values
        self.cache.batch_select_indices(index)  # each prompt's cache, once per trajectory
        self.attn = pmask[index]  # [R, L] 1 on real tokens, 0 on padding and holes
        self.pos = pmask.sum(-1)[index]  # [R] the next token's position id
        self.logits = out.logits[index, -1]  # [R, V] next-token logits of each trajectory
        self.alive = list(range(P * n))  # trajectory of each cache row
        self.noise = torch.arange(P * n, device=self.device) + row_offset
        self.steps = torch.zeros(P * n, dtype=torch.long, device=self.device)  # tokens so far
        self.pending: dict[int, int] = {}  # a turn's last token, not yet in the cache
        self.used = None  # [R, V] tokens each trajectory holds (the repetition penalty's)
        if sampling.repetition_penalty != 1.0:
            used = torch.zeros_like(self.logits, dtype=torch.int32)
            self.used = used.scatter_add_(1, pids[index], pmask[index].int()) > 0

    def _keep(self, rows: list[int]) -> None:
        """Drop finished trajectories from the cache; keep ``rows`` in that order."""
        if rows == self.alive:
            return
        where = {r: i for i, r in enumerate(self.alive)}
        sel = torch.tensor([where[r] for r in rows], device=self.device)
        self.cache.batch_select_indices(sel)
        self.attn, self.pos, self.logits = self.attn[sel], self.pos[sel], self.logits[sel]
        self.used = None if self.used is None else self.used[sel]
        self.alive = list(rows)

    def _append(self, rows: list[int], context: list[list[int]]) -> None:
        """One forward over each trajectory's new context tokens (left-padded into a chunk),
        after its last sampled token if that is not in the cache yet."""
        chunks = [
            ([self.pending.pop(r)] if r in self.pending else []) + list(c)
            for r, c in zip(rows, context)
        ]
        width = max((len(c) for c in chunks), default=0)
        if width == 0:
            return
        ids = torch.full((len(rows), width), self.gen.pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, c in enumerate(chunks):
            if c:
                ids[i, width - len(c) :] = torch.tensor(c)
                mask[i, width - len(c) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        if self.used is not None:  # the environment's tokens count as seen (as in vLLM)
            self.used |= (
                torch.zeros_like(self.used, dtype=torch.int32).scatter_add_(1, ids, mask.int()) > 0
            )
        self.attn = torch.cat([self.attn, mask], 1)
        out = self.gen._forward(
            input_ids=ids,
            attention_mask=self.attn,
            position_ids=self.pos[:, None] + (mask.cumsum(-1) - 1).clamp(min=0),
            cache=self.cache,
            logits_to_keep=1,
        )
        has = mask[:, -1].bool()
        self.logits = torch.where(has[:, None], out.logits[:, -1], self.logits)
        self.pos = self.pos + mask.sum(-1)
        self.steps[rows] += torch.tensor([len(c) for c in context], device=self.device)

    @torch.no_grad()
    def turn(
        self, rows: list[int], context: list[list[int]], budgets: list[int], stop: tuple[str, ...]
    ) -> list[Turn]:
        self._keep(list(rows))
        self._append(list(rows), context)
        sp, R = self.sp, len(rows)
        noise, start = self.noise[rows], self.steps[rows]
        window = stop_window(stop)
        live = torch.ones(R, dtype=torch.bool, device=self.device)
        ids: list[list[int]] = [[] for _ in range(R)]
        lps: list[list[float]] = [[] for _ in range(R)]
        finish = ["length"] * R
        for t in range(max(budgets)):
            raw, scale = self.logits.to(_acc(self.logits)), 1.0 if sp.greedy else sp.temperature
            z = raw / scale  # the log-prob kept is the policy's, unpenalized (see Rollout)
            picked = (
                z
                if self.used is None
                else apply_repetition_penalty(raw, self.used, sp.repetition_penalty) / scale
            )
            tok = (
                torch.argmax(picked, -1)
                if sp.greedy
                else sample(picked, self.seed, noise, start + t, sp.top_k, sp.top_p, sp.min_p)
            )
            lp = torch.log_softmax(z, -1).gather(1, tok[:, None]).squeeze(1)
            if self.used is not None:
                self.used[live] = self.used[live].scatter(1, tok[live, None], True)
            fed = live.clone()
            eos = torch.isin(tok, self.gen.eos)
            for i in torch.nonzero(live).squeeze(1).tolist():
                ids[i].append(int(tok[i]))
                lps[i].append(float(lp[i]))
                if bool(eos[i]):
                    finish[i] = "eos"
                elif stop and hits_stop(self.gen.tokenizer, ids[i][-window:], stop):
                    finish[i] = "stop"
                elif len(ids[i]) < budgets[i]:
                    continue
                live[i] = False
            if not bool(live.any()):  # the last tokens enter the cache with the next context
                self.pending.update({rows[i]: ids[i][-1] for i in range(R) if bool(fed[i])})
                break
            mask = fed.long()[:, None]
            self.attn = torch.cat([self.attn, mask], 1)
            out = self.gen._forward(
                input_ids=torch.where(fed, tok, self.gen.pad)[:, None],
                attention_mask=self.attn,
                position_ids=self.pos[:, None],
                cache=self.cache,
            )
            self.logits = torch.where(fed[:, None], out.logits[:, -1], self.logits)
            self.pos = self.pos + fed.long()
        self.steps[rows] += torch.tensor([len(i) for i in ids], device=self.device)
        return [Turn(i, lp, f) for i, lp, f in zip(ids, lps, finish)]

    def close(self) -> None:
        self.cache = self.logits = None
        self.model.train(self.was_training)
