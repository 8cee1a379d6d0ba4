"""DAPO's dynamic sampling (Yu et al. 2025, sec. 3.2): a step trains on ``prompts_per_step``
groups that carry a learning signal. Groups whose rewards are all equal (or whose std is at
most ``groups.min_std``) are filtered out and replaced by groups of new prompts, taken from
the data order, until the batch is full or ``groups.max_rounds`` generation rounds have run.

Round 1 is the ordinary step (the same prompts, seed and noise). Each later round takes from
the stream exactly as many new prompts as the ranks together still need, each rank the share
it lacks, in rank order; a completion draws the noise of its row in the round, so one process
and several generate the same groups. The prompts consumed are counted by the stream's
position, which the checkpoint records: a resumed run continues exactly. When the rounds run
out, a rank still short completes its batch with the last round's filtered groups (as many
as it lacks, exactly), which stay out of the loss.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from grpo_core import phases
from grpo_core.config.view import Config
from grpo_core.engine import dist
from grpo_core.loss.groups import group_std, group_std_zero
from grpo_core.records import Sampled, Scored, Targets
from grpo_core.samplers import Sampler

if TYPE_CHECKING:
    from grpo_core.run import Run


def has_signal(rewards: torch.Tensor, min_std: float = 0.0) -> torch.Tensor:
    """[P, G] rewards (NaN = missing) -> [P] bool: the group's valid rewards differ and their
    population std is above ``min_std`` (DAPO keeps 0 < accuracy < 1: std > 0)."""
    return ~group_std_zero(rewards) & (group_std(rewards) > min_std)


def round_seed(seed: int, step: int, k: int) -> int:
    """The sampling seed of round ``k`` of a step (round 0: the step's own seed)."""
    return phases.step_seed(seed, step) ^ ((k * 0x9E3779B9) & 0xFFFFFFFF)


class Dynamic(Sampler):
    """Rounds of inline sampling until this rank holds ``run.prompts`` groups with signal."""

    @classmethod
    def chosen(cls, config: Config) -> bool:
        return config.groups.dynamic_sampling

    def __init__(self) -> None:
        self.counts: dict[str, float] = {}  # the last step's, for its metrics record

    def next(self, run: Run, step: int) -> tuple[Sampled, Scored]:
        """This rank's ``run.prompts`` groups, drawn over as many rounds as the batch needs
        (at most ``groups.max_rounds``), with the metrics ``groups/filtered`` (groups left
        out for want of signal), ``groups/generated``, ``groups/filler`` and
        ``groups/rounds``, over all ranks; ``reward`` is the mean over every completion
        generated (before filtering) and ``reward_kept`` over the groups with signal."""
        gc, P, G = run.config.groups, run.prompts, run.config.first_group_size
        kept: list[tuple[Sampled, Scored]] = []
        have, rounds, generated, filtered, spare = 0, 0, 0, 0, None
        drawn: list[tuple[Sampled, Scored]] = []  # every round, kept or filtered
        while rounds < gc.max_rounds:
            needs = [int(n[0]) for n in dist.gather_numbers([float(P - have)])]
            if not sum(needs):
                break
            rows = run.stream.take(sum(needs))
            start = sum(needs[: run.rank])
            s = phases.generate(
                run,
                step,
                rows[start : start + needs[run.rank]],
                round_seed(run.config.train.seed, step, rounds),
                start * G,
            )
            rounds += 1
            if s is None:
                continue
            j = phases.score(run, step, s)
            drawn.append((s, j))
            signal = has_signal(j.grid, gc.min_std)
            idx = torch.nonzero(signal).squeeze(1).tolist()
            if idx:
                kept.append((s.select(idx), j.select(idx)))
            have, generated = have + len(idx), generated + len(signal)
            filtered += len(signal) - len(idx)
            spare = (s, j, torch.nonzero(~signal).squeeze(1).tolist())
        n_filler = P - have  # the last round's filtered groups, exactly as many as are missing
        if n_filler:
            assert spare is not None  # a round ran (groups.max_rounds >= 1)
            s, j, idx = spare
            kept.append((s.select(idx[:n_filler]), j.select(idx[:n_filler])))
        scored = Scored.cat([j for _, j in kept])
        filler = torch.arange(scored.prompts) >= P - n_filler  # the filler groups come last
        signal = scored.rewards[~filler[scored.rollout.group.cpu()]]
        gen, judged = [s for s, _ in drawn], [j for _, j in drawn]
        counts = dist.sum_named(
            {
                "groups/filtered": filtered,
                "groups/generated": generated,
                "groups/filler": n_filler,
                **_sums("reward", torch.cat([j.rewards for j in judged] or [torch.zeros(0)])),
                **_sums("reward_kept", signal),
            }
        )
        # every round's times once, kept or filtered: the kept groups' parts hold only their
        # own rounds' times, and the last round's twice when it also gave the filler
        sampled = replace(
            Sampled.cat([s for s, _ in kept]),
            seconds=sum(s.seconds for s in gen),
            greedy_seconds=sum(s.greedy_seconds for s in gen),
        )
        self.counts = {**_means(counts), "groups/rounds": float(rounds)}
        return sampled, replace(
            scored,
            filler=filler,
            seconds=sum(j.seconds for j in judged),
            greedy_seconds=sum(j.greedy_seconds for j in judged),
        )

    def metrics(self, step: int, sampled: Sampled, targets: Targets) -> dict:
        """The step's counts (see :meth:`next`); its ``reward`` replaces the record's."""
        return self.counts


def _sums(name: str, rewards: torch.Tensor) -> dict[str, float]:
    """The sum and count of a rewards tensor's valid values, to be summed over ranks."""
    ok = torch.isfinite(rewards)
    return {f"{name}|sum": float(rewards[ok].double().sum()), f"{name}|n": float(ok.sum())}


def _means(counts: dict[str, float]) -> dict[str, float]:
    """The counts as they are, and each ``name|sum`` over ``name|n`` as ``name``: ``reward``,
    the mean over every completion the step generated (the policy's success rate, before any
    filtering), and ``reward_kept``, over the groups with signal it trains on."""
    out = {k: v for k, v in counts.items() if "|" not in k}
    for key in [k for k in counts if k.endswith("|sum")]:
        name, n = key[:-4], counts[key[:-4] + "|n"]
        out[name] = counts[key] / n if n else math.nan
    return out
