"""Groups: completions of one prompt, kept together from sampling to the loss.

A rollout's rows carry their group index; these helpers lay rows out on the ``[P, G]`` grid
that baselines see, find groups with no learning signal, share extra completions by the
groups' std, and cut the batch into micro-batches of whole groups.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch


def allocate(std: torch.Tensor, budget: int, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """Std-driven group sizes, as the article has them: more samples where the in-group std
    is small, so that a prompt whose first samples all agree (0 of 4 right on a hard prompt)
    gets the chance to find one that differs. Each prompt's share of the budget weighs
    ``1 / (std + mean std)``: a flat group twice a group at the mean std; equal shares when
    none differ. The budget is ``budget`` more completions' worth of tokens: with ``lengths``
    (each prompt's mean first-sample length, in tokens) a prompt's extra completions cost its
    own length, so long answers get fewer of them. Rounded down, then the tokens left go to
    the largest remainders that still fit (ties: the earlier prompt).
    std [P], lengths [P] -> [P] long, costing at most ``budget x mean(lengths)`` tokens."""
    std = std.double().clamp(min=0)
    cost = torch.ones_like(std) if lengths is None else lengths.double().clamp(min=1)
    tau = float(std.mean())
    w = 1 / (std + tau) if tau > 0 else torch.ones_like(std)
    tokens = budget * float(cost.mean())
    quota = tokens * (w / w.sum()) / cost
    n = quota.floor().long()
    left = tokens - float((n * cost).sum())
    order = sorted(range(len(w)), key=lambda p: (-round(float(quota[p] - n[p]), 9), p))
    for p in order:
        if cost[p] <= left + 1e-9:
            n[p] += 1
            left -= float(cost[p])
    return n


def group_std_zero(rewards: torch.Tensor) -> torch.Tensor:
    """[P, G] -> [P] bool: the group's valid rewards are all equal (no learning signal)."""
    ok = torch.isfinite(rewards)
    hi = torch.where(ok, rewards, -torch.inf).amax(-1)
    lo = torch.where(ok, rewards, torch.inf).amin(-1)
    return ~(hi > lo)


def group_std(rewards: torch.Tensor) -> torch.Tensor:
    """[P, G] -> [P] float64: the population std of each group's valid rewards (0 for a group
    with none)."""
    ok = torch.isfinite(rewards)
    x = torch.where(ok, rewards.double(), 0.0)
    n = ok.sum(-1).clamp(min=1)
    mean = x.sum(-1, keepdim=True) / n[:, None]
    return (torch.where(ok, x - mean, 0.0).pow(2).sum(-1) / n).sqrt()


def to_grid(values: torch.Tensor, group: torch.Tensor, P: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows [B] -> [P, Gmax] with NaN where a group has fewer rows; also each row's slot
    (counted in Python: per-element tensor updates cost a millisecond a call)."""
    counts, slots = [0] * P, []
    for g in group.tolist():
        slots.append(counts[g])
        counts[g] += 1
    slot = torch.tensor(slots, dtype=group.dtype, device=group.device)
    grid = torch.full((P, max(counts)), torch.nan)
    grid[group, slot] = values
    return grid, slot


def micro_batches(group: torch.Tensor, P: int, per: int, start: int = 0) -> Iterator[torch.Tensor]:
    """Row indices of each micro-batch of groups ``start`` to ``P - 1``; a micro-batch holds
    whole groups, never part of one."""
    for s in range(start, P, per):
        rows = torch.nonzero((group >= s) & (group < min(s + per, P))).squeeze(1)
        if rows.numel():
            yield rows


def mini_batches(group: torch.Tensor, P: int, count: int, per: int) -> list[list[torch.Tensor]]:
    """The micro-batches of each of ``count`` mini-batches (one optimizer update each): P
    groups cut into ``count`` runs of P / count whole groups (``count`` divides P), each cut
    into micro-batches of ``per`` groups. Mini-batches without rows are left out."""
    size = P // count
    cuts = [list(micro_batches(group, s + size, per, start=s)) for s in range(0, P, size)]
    return [c for c in cuts if c]
