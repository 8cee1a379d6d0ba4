"""Groups: completions of one prompt, kept together from sampling to the loss.

A rollout's rows carry their group index; these helpers lay rows out on the ``[P, G]`` grid
that baselines see, find groups with no learning signal, share extra completions by the
groups' std, and cut the batch into micro-batches of whole groups.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch


def allocate(std: torch.Tensor, budget: int) -> torch.Tensor:
    """Std-driven group sizes: ``budget`` more completions shared among P prompts in
    proportion to the std of their first samples (the prompts whose samples disagree most
    get the most; equally when none disagree), rounded by largest remainder (ties: the
    earlier prompt). std [P] -> [P] long, summing to ``budget``."""
    w = std.double().clamp(min=0)
    w = w if w.sum() > 0 else torch.ones_like(w)
    quota = budget * w / w.sum()
    n = quota.floor().long()
    left = budget - int(n.sum())
    order = sorted(range(len(w)), key=lambda p: (-float(quota[p] - n[p]), p))
    n[order[:left]] += 1
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
