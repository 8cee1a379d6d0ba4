"""What the phases of a step hand on: ``Sampled -> Scored -> Targets -> Updated``.

Each record is built by keyword and never edited after. The two that hold groups (Sampled,
Scored) know how to keep some of their groups (``select``) and how to put the groups of
several records one after another (``cat``), so that a sampler that draws in rounds (DAPO's
dynamic sampling) says only which groups it keeps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING

import torch

from grpo_core.data.prompts import Batch
from grpo_core.loss.groups import group_std_zero, to_grid
from grpo_core.rollout import Rollout, pad_right

if TYPE_CHECKING:
    from grpo_core.env.episodes import Transcript


@dataclass(kw_only=True, frozen=True)
class Sampled:
    """Phase 1: this rank's prompts and G completions of each (with an environment: G
    episodes, and their transcripts)."""

    batch: Batch
    rollout: Rollout
    seconds: float
    transcripts: list[Transcript] | None = None
    greedy: Rollout | None = None  # ReMax: one greedy completion per prompt
    greedy_seconds: float = 0.0
    version: int | None = None  # overlap: the weights version that sampled it
    waited: float = 0.0  # overlap: how long the trainer waited for the rollout

    def select(self, idx: list[int]) -> Sampled:
        """Groups ``idx`` only, renumbered 0..len(idx)-1 in that order."""
        rows = group_rows(self.rollout, idx)
        return replace(
            self,
            batch=self.batch.select(idx),
            rollout=select_groups(self.rollout, idx),
            transcripts=_pick(self.transcripts, rows.tolist()),
            greedy=None if self.greedy is None else select_groups(self.greedy, idx),
        )

    @staticmethod
    def cat(parts: list[Sampled]) -> Sampled:
        """The groups of ``parts`` one after another (times summed)."""
        first = parts[0]
        return Sampled(
            batch=Batch(
                [x for p in parts for x in p.batch.raw],
                [x for p in parts for x in p.batch.prompts],
                [x for p in parts for x in p.batch.prompt_ids],
                {k: [x for p in parts for x in p.batch.columns[k]] for k in first.batch.columns},
            ),
            rollout=cat_rollouts([p.rollout for p in parts]),
            seconds=sum(p.seconds for p in parts),
            transcripts=None
            if first.transcripts is None
            else [t for p in parts for t in p.transcripts or ()],
            greedy=None
            if first.greedy is None
            else cat_rollouts([p.greedy for p in parts if p.greedy is not None]),
            greedy_seconds=sum(p.greedy_seconds for p in parts),
        )


@dataclass(kw_only=True, frozen=True)
class Scored:
    """Phase 2: the rollout (with any extra completions drawn for flat groups) and its task
    rewards: ``rewards`` [B] (NaN = missing), named ``dimensions`` and ``extras`` per
    completion, the reward's first ``problem``; the greedy completions' rewards (ReMax)."""

    rollout: Rollout
    rewards: torch.Tensor
    dimensions: dict = field(default_factory=dict)
    extras: dict = field(default_factory=dict)
    problem: str | None = None
    greedy_rewards: torch.Tensor | None = None  # [P]
    extra_completions: int = 0
    seconds: float = 0.0  # scoring, the extra completions' included: time/reward
    extra_seconds: float = 0.0  # generating the extra completions: time/generate's, not reward's
    greedy_seconds: float = 0.0
    filler: torch.Tensor | None = None  # [P] bool: kept only to fill the batch (DAPO), out of
    # the loss; None: no such group

    @property
    def prompts(self) -> int:
        return self.rollout.prompt_ids.shape[0]

    @cached_property
    def grid(self) -> torch.Tensor:
        """[P, Gmax] rewards, NaN where a group has fewer completions."""
        return to_grid(self.rewards, self.rollout.group.cpu(), self.prompts)[0]

    @property
    def flat(self) -> torch.Tensor:
        """[P] bool: the group's valid rewards are all equal (no learning signal)."""
        return group_std_zero(self.grid)

    def select(self, idx: list[int]) -> Scored:
        """Groups ``idx`` only, renumbered 0..len(idx)-1 in that order."""
        rows = group_rows(self.rollout, idx).tolist()
        return Scored(
            rollout=select_groups(self.rollout, idx),
            rewards=self.rewards[rows],
            dimensions=_pick_named(self.dimensions, rows),
            extras=_pick_named(self.extras, rows),
            problem=self.problem,
            greedy_rewards=None if self.greedy_rewards is None else self.greedy_rewards[idx],
            seconds=self.seconds,
            extra_seconds=self.extra_seconds,
            greedy_seconds=self.greedy_seconds,
        )

    @staticmethod
    def cat(parts: list[Scored]) -> Scored:
        """The groups of ``parts`` one after another (times summed; a dimension or extra a
        part lacks is filled: NaN, None)."""
        sizes = [len(p.rewards) for p in parts]
        return Scored(
            rollout=cat_rollouts([p.rollout for p in parts]),
            rewards=torch.cat([p.rewards for p in parts]),
            dimensions=joined([p.dimensions for p in parts], sizes, math.nan),
            extras=joined([p.extras for p in parts], sizes, None),
            problem=next((p.problem for p in parts if p.problem), None),
            greedy_rewards=None
            if parts[0].greedy_rewards is None
            else torch.cat([p.greedy_rewards for p in parts if p.greedy_rewards is not None]),
            extra_completions=sum(p.extra_completions for p in parts),
            seconds=sum(p.seconds for p in parts),
            extra_seconds=sum(p.extra_seconds for p in parts),
            greedy_seconds=sum(p.greedy_seconds for p in parts),
        )


@dataclass(kw_only=True, frozen=True)
class Targets:
    """Phase 3: what the update needs beside the rollout."""

    old_logp: torch.Tensor  # [B, T] log-probs under the policy that sampled
    ref_logp: torch.Tensor | None  # [B, T] under the frozen reference
    is_weights: torch.Tensor | None  # [B, T] truncated importance weights (other sampler)
    rewards: torch.Tensor  # [B] what the baseline saw: task reward, minus KL if so placed
    advantages: torch.Tensor  # [B]; [B, T] from a critic (PPO)
    keep: torch.Tensor  # [B] bool: in the loss (reward present, not a filler group, not
    # dropped as flat, not cut by the budget under mask_truncated_completions)
    seconds: float
    returns: torch.Tensor | None = None  # [B, T] the critic's targets
    values: torch.Tensor | None = None  # [B, T] the critic's values at sampling time

    def per_completion(self, ro: Rollout) -> torch.Tensor:
        """[B] advantages as they are, or [B, T] ones (a critic's) as each completion's mean."""
        if self.advantages.dim() == 1:
            return self.advantages
        mask = ro.action_mask.to(self.advantages)
        return (self.advantages * mask).sum(-1) / mask.sum(-1).clamp(min=1)


@dataclass(kw_only=True, frozen=True)
class Updated:
    """Phase 4: the loss terms and counts of each inner iteration (summed over micro-batches
    and ranks), the gradient norm, and how many updates were skipped."""

    iterations: list[dict[str, float]]
    grad_norm: float
    skipped: int
    seconds: float


def group_rows(ro: Rollout, idx: list[int]) -> torch.Tensor:
    """Row indices of the completions of groups ``idx``, group by group."""
    group = ro.group.cpu()
    return torch.cat([torch.nonzero(group == g).squeeze(1) for g in idx])


def select_groups(ro: Rollout, idx: list[int]) -> Rollout:
    """The completions of groups ``idx``, renumbered 0..len(idx)-1 in that order."""
    where = {g: k for k, g in enumerate(idx)}
    sub = ro.rows(group_rows(ro, idx).to(ro.group.device))
    group = torch.tensor(
        [where[g] for g in sub.group.tolist()], dtype=torch.long, device=ro.group.device
    )
    keep = torch.tensor(idx, dtype=torch.long, device=ro.prompt_ids.device)
    return replace(
        sub, prompt_ids=ro.prompt_ids[keep], prompt_mask=ro.prompt_mask[keep], group=group
    )


def _left(t: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(t, (width - t.shape[1], 0), value=0)


def cat_rollouts(parts: list[Rollout]) -> Rollout:
    """Rollouts of different prompts as one: prompts re-padded on the left, completions on
    the right, group indices shifted by the prompts before them."""
    width = max(r.prompt_ids.shape[1] for r in parts)
    offsets = torch.tensor([0] + [r.prompt_ids.shape[0] for r in parts]).cumsum(0).tolist()
    return Rollout(
        torch.cat([_left(r.prompt_ids, width) for r in parts]),
        torch.cat([_left(r.prompt_mask, width) for r in parts]),
        pad_right([r.completion_ids for r in parts], 0),
        pad_right([r.completion_mask for r in parts], 0),
        pad_right([r.logprobs for r in parts], 0.0),
        torch.cat([r.truncated for r in parts]),
        torch.cat([r.group + o for r, o in zip(parts, offsets)]),
        pad_right([r.action_mask for r in parts], 0),
    )


def joined(named: list[dict], sizes: list[int], fill: object) -> dict:
    """Per-completion named lists of several parts (``sizes`` completions each) one after
    another; a name a part lacks is filled with ``fill``."""
    keys = list(dict.fromkeys(k for d in named for k in d))
    return {k: [x for d, n in zip(named, sizes) for x in d.get(k, [fill] * n)] for k in keys}


def _pick(values: list | None, rows: list[int]) -> list | None:
    return None if values is None else [values[r] for r in rows]


def _pick_named(named: dict, rows: list[int]) -> dict:
    return {k: [v[r] for r in rows] for k, v in named.items()}
