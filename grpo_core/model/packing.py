"""Padding-free layouts of a micro-batch for the log-prob passes (policy, reference, old
log-probs), and how much padding each layout runs through the decoder.

Two packed layouts, both feeding only real tokens with per-sequence ``position_ids``:

- ``tree`` (SDPA or eager attention: CPU, and GPU without flash-attention): rows that each
  hold a prompt once and then some of its completions, with an explicit 4D mask in which a
  completion token sees its prompt and its own earlier tokens (a tree: the prompt is shared,
  as ``_shared_hidden`` shares it through a KV cache, but in one decoder call and without a
  cache, so it also works under gradient checkpointing). Rows are right-padded to the
  longest. The mask is dense, so attention costs (row length)^2 per row: a row per prompt
  with all its completions can cost more than the padding it saves (G x T long rows), so
  the rows' capacity is chosen per batch by counting both (``choose_capacity``).
- ``varlen`` (flash-attention): the whole micro-batch in one row, each completion after its
  own copy of the prompt, with no mask: the attention kernel finds the sequences from
  where ``position_ids`` restart (transformers' padding-free path), and computes only the
  block-diagonal part. A varlen kernel only knows block-diagonal causal attention, so a
  completion cannot see another sequence's prompt: prompt sharing does not combine with it.

Shapes: ``B`` completions, ``T`` completion positions, ``R`` rows, ``L`` row length, ``N``
valid completion tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch

from grpo_core.rollout import Rollout


@dataclass
class Packed:
    """A packed micro-batch: what the decoder is fed, and where its outputs are read.

    input_ids, position_ids: [R, L]; seq: [R, L] the sequence each position belongs to
    (a prompt, a completion, or a padding position of its own); base: [R, L] the sequence it
    also sees (a completion: its prompt's; others: their own); picks: [N] flat indices into
    the [R * L] hidden states, the one that predicts each valid completion token, in the
    row-major order of ``completion_mask``; padding: positions fed that are padding."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    seq: torch.Tensor
    base: torch.Tensor
    picks: torch.Tensor
    padding: int

    @property
    def positions(self) -> int:
        """Decoder positions the layout runs (real and padding)."""
        return self.input_ids.numel()


def right_padded(ro: Rollout) -> bool:
    """Each completion mask is a prefix of ones, as every generator writes them: what the
    packed layouts need."""
    mask = ro.completion_mask.long()
    return bool((mask.cumprod(-1).sum(-1) == mask.sum(-1)).all())


def completion_lengths(ro: Rollout) -> torch.Tensor:
    """[B] valid tokens of each completion; refuses completions that are not right-padded."""
    if not right_padded(ro):
        raise ValueError("packing needs right-padded completions (completion_mask a prefix)")
    return ro.completion_mask.long().sum(-1)


def _prompt(ro: Rollout, p: int) -> torch.Tensor:
    return ro.prompt_ids[p][ro.prompt_mask[p].bool()]


def _rows(pieces: list[list[torch.Tensor]], pad: int) -> torch.Tensor:
    """[R, L]: each row's pieces joined, right-padded with ``pad`` to the longest row."""
    joined = [torch.cat(r) for r in pieces]
    width = max(len(r) for r in joined)
    out = torch.full((len(joined), width), pad, dtype=joined[0].dtype)
    for i, r in enumerate(joined):
        out[i, : len(r)] = r
    return out


class _Builder:
    """Collects rows of segments (token ids, positions, sequence ids) and the hidden-state
    index that predicts each completion token."""

    def __init__(self, ro: Rollout):
        self.ro, self.n = ro, completion_lengths(ro)
        self.ids: list[list[torch.Tensor]] = []
        self.pos: list[list[torch.Tensor]] = []
        self.seq: list[list[torch.Tensor]] = []
        self.base: list[list[torch.Tensor]] = []
        self.picks: list[torch.Tensor | None] = [None] * ro.size
        self.offset = 0  # within the current row
        self.next_seq = 0

    def row(self) -> None:
        for part in (self.ids, self.pos, self.seq, self.base):
            part.append([])
        self.offset = 0

    def segment(self, ids: torch.Tensor, start: int, base: int | None = None) -> tuple[int, int]:
        """Append one sequence (positions from ``start``) to the current row; returns its
        sequence id and its offset in the row."""
        k, at = self.next_seq, self.offset
        self.ids[-1].append(ids)
        self.pos[-1].append(torch.arange(start, start + len(ids)))
        self.seq[-1].append(torch.full((len(ids),), k))
        self.base[-1].append(torch.full((len(ids),), k if base is None else base))
        self.next_seq, self.offset = k + 1, self.offset + len(ids)
        return k, at

    def fed(self, i: int) -> torch.Tensor:
        """Completion i without its last valid token (which predicts nothing we need)."""
        return self.ro.completion_ids[i, : max(int(self.n[i]) - 1, 0)]

    def pick(self, i: int, row: int, first: int, rest: int) -> None:
        """Completion i's token 0 is predicted at ``first`` in ``row``, token j >= 1 at
        ``rest + j - 1`` (offsets in the row; made flat in ``done``)."""
        n = int(self.n[i])
        local = torch.cat([torch.tensor([first]), rest + torch.arange(max(n - 1, 0))])[:n]
        self.picks[i] = torch.stack([torch.full_like(local, row), local])

    def done(self, pad: int) -> Packed:
        ids = _rows(self.ids, pad)
        width = ids.shape[1]
        real = torch.zeros_like(ids, dtype=torch.bool)
        for r, pieces in enumerate(self.ids):
            real[r, : sum(len(p) for p in pieces)] = True
        # each padding position is a sequence of its own: it sees itself only (no empty rows)
        alone = -2 - torch.arange(ids.numel()).view(ids.shape)
        seq = torch.where(real, _rows(self.seq, 0), alone)
        base = torch.where(real, _rows(self.base, 0), alone)
        picks = torch.cat([p[0] * width + p[1] for p in cast(list[torch.Tensor], self.picks)], 0)
        return Packed(ids, _rows(self.pos, 0), seq, base, picks, int((~real).sum()))


def row_plan(ro: Rollout, capacity: int | None = None) -> list[tuple[int, list[int]]]:
    """The tree layout's rows: (prompt, its completions in the row). Each prompt's
    completions, longest first, fill rows of at most ``capacity`` positions (the prompt and
    each completion but its last token; a row takes at least one completion), the prompt
    repeated at the head of each row; ``capacity`` None: one row per prompt."""
    fed = (completion_lengths(ro) - 1).clamp(min=0).tolist()
    plen = ro.prompt_mask.long().sum(-1).tolist()
    rows: list[tuple[int, list[int]]] = []
    for p in torch.unique(ro.group).tolist():
        members = sorted(torch.nonzero(ro.group == p).flatten().tolist(), key=lambda i: -fed[i])
        used = None
        for i in members:
            if used is None or (capacity is not None and used + fed[i] > capacity):
                rows.append((p, []))
                used = plen[p]
            rows[-1][1].append(i)
            used += fed[i]
    return rows


def _row_lengths(ro: Rollout, plan: list[tuple[int, list[int]]]) -> list[int]:
    fed = (completion_lengths(ro) - 1).clamp(min=0)
    plen = ro.prompt_mask.long().sum(-1)
    return [int(plen[p] + fed[members].sum()) for p, members in plan]


def tree_cost(ro: Rollout, capacity: int | None, pair_cost: float) -> float:
    """The tree layout's work in positions: R rows of L positions, each position's matrix
    work plus ``pair_cost`` per query-key pair of its dense mask (L per position)."""
    lengths = _row_lengths(ro, row_plan(ro, capacity))
    width = max(lengths)
    return len(lengths) * width * (1.0 + pair_cost * width)


def padded_cost(ro: Rollout, shared: bool, pair_cost: float) -> float:
    """The padded layouts' work in the same units: ``shared``, the prompts' rows ([P, Lp],
    Lp keys each) and the completions' ([B, T - 1], Lp + T - 1 keys each); else [B, Lp +
    T - 1] rows, as many keys each. Every position of a padded row counts."""
    B, T = ro.completion_ids.shape
    Lp, fed = ro.prompt_ids.shape[1], max(T - 1, 0)
    if shared:
        P = len(torch.unique(ro.group))
        return P * Lp * (1.0 + pair_cost * Lp) + B * fed * (1.0 + pair_cost * (Lp + fed))
    return B * (Lp + fed) * (1.0 + pair_cost * (Lp + fed))


def choose_capacity(ro: Rollout, pair_cost: float) -> int | None:
    """The row capacity whose tree layout costs the least (``tree_cost``); ``pair_cost`` is a
    pair's attention FLOPs over a position's matrix FLOPs (grpo_core.observe.flops: 4 H / (2
    x layer params)). Longer rows share a prompt among more completions and pad less, but
    attention over a dense row grows as its square. Candidates: multiples of the longest
    single sequence, and one row per prompt (None)."""
    fed = (completion_lengths(ro) - 1).clamp(min=0)
    longest = int((ro.prompt_mask.long().sum(-1)[ro.group] + fed).max())
    candidates = [int(longest * k) for k in (1, 1.5, 2, 3, 4, 6, 8)] + [None]
    costs = [tree_cost(ro, c, pair_cost) for c in candidates]
    return candidates[costs.index(min(costs))]


def pack_tree(ro: Rollout, pad: int, capacity: int | None = None) -> Packed:
    """Rows of ``row_plan``: a prompt, then completions of it (positions continuing the
    prompt's), right-padded with ``pad`` to the longest row."""
    b = _Builder(ro)
    for r, (p, members) in enumerate(row_plan(ro, capacity)):
        b.row()
        prompt = _prompt(ro, p)
        k, _ = b.segment(prompt, 0)
        for i in members:
            _, at = b.segment(b.fed(i), len(prompt), base=k)
            b.pick(i, r, len(prompt) - 1, at)
    return b.done(pad)


def pack_varlen(ro: Rollout, pad: int) -> Packed:
    """The whole micro-batch in one row: each completion after its own copy of its prompt,
    positions restarting at 0 for each (what a varlen attention kernel reads)."""
    b = _Builder(ro)
    b.row()
    for i in range(ro.size):
        prompt = _prompt(ro, int(ro.group[i]))
        _, at = b.segment(torch.cat([prompt, b.fed(i)]), 0)
        b.pick(i, 0, at + len(prompt) - 1, at + len(prompt))
    return b.done(pad)


def tree_mask(packed: Packed, dtype: torch.dtype | None) -> torch.Tensor:
    """[R, 1, L, L] attention mask of a packed layout: query q sees key k when k is not
    after q and k is in q's sequence or in the sequence q hangs on (its prompt). ``dtype``
    None: boolean (True: attend), for SDPA; a float dtype: 0 or that dtype's minimum, added
    to the scores (eager attention)."""
    seq, base = packed.seq, packed.base
    L = seq.shape[1]
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    same = (seq[:, None, :] == seq[:, :, None]) | (seq[:, None, :] == base[:, :, None])
    allowed = (same & causal)[:, None]
    if dtype is None:
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)


def padded_counts(ro: Rollout, shared: bool) -> tuple[int, int]:
    """(decoder positions, of which padding) of the padded layouts: ``shared``: each prompt
    once ([P, Lp]) then the completions ([B, T - 1]); else every completion after its prompt
    ([B, Lp + T - 1]). A completion's last token is never fed."""
    B, T = ro.completion_ids.shape
    fed = max(T - 1, 0)
    cmask = ro.completion_mask[:, :fed].bool()
    if shared:
        pmask = ro.prompt_mask[torch.unique(ro.group)].bool()
        positions = pmask.numel() + cmask.numel()
        return positions, positions - int(pmask.sum()) - int(cmask.sum())
    pmask = ro.prompt_mask[ro.group].bool()
    positions = B * (ro.prompt_ids.shape[1] + fed)
    return positions, positions - int(pmask.sum()) - int(cmask.sum())


def packed_counts(ro: Rollout, varlen: bool, capacity: int | None = None) -> tuple[int, int]:
    """(decoder positions, of which padding) of ``pack_varlen`` (one row, none padding) or
    ``pack_tree`` with ``capacity`` (rows right-padded to the longest), from the lengths."""
    if varlen:
        fed = (completion_lengths(ro) - 1).clamp(min=0)
        return int(ro.prompt_mask.long().sum(-1)[ro.group].sum() + fed.sum()), 0
    rows = _row_lengths(ro, row_plan(ro, capacity))
    positions = max(rows) * len(rows)
    return positions, positions - sum(rows)
