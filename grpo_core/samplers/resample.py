"""Resampling flat groups (``groups.resample_zero_std_max: n``): a group whose rewards are all
equal gets n more completions of its prompt, scored and appended to it, once per step."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from grpo_core import phases
from grpo_core.config.view import Config
from grpo_core.data.prompts import Batch
from grpo_core.engine import dist
from grpo_core.records import Sampled, Scored, joined
from grpo_core.rollout import merge
from grpo_core.samplers.inline import Inline

if TYPE_CHECKING:
    from grpo_core.run import Run


class Resample(Inline):
    """Inline sampling, then n more completions for each flat group."""

    @classmethod
    def chosen(cls, config: Config) -> bool:
        return bool(config.groups.resample_zero_std_max)

    @classmethod
    def refusals(
        cls, config: Config, world: int, how: str = "none", lora: bool = False
    ) -> list[str]:
        found = []
        if config.groups.dynamic_sampling:
            found.append(
                "groups.resample_zero_std_max: not with groups.dynamic_sampling, which "
                "replaces flat groups with new prompts instead; set one of them"
            )
        if config.environment:
            found.append(
                "groups.resample_zero_std_max: resampling flat groups is not yet "
                "supported with an environment; set it to 0"
            )
        return found

    def refine(self, run: Run, step: int, sampled: Sampled, scored: Scored) -> Scored:
        # the weights are gathered by every rank together: all enter when any has a flat group
        if not flat_any(scored.flat):
            return scored
        with run.autocast, run.engine.gathered():
            if scored.flat.any():
                scored = draw_more(
                    run,
                    sampled.batch,
                    scored,
                    scored.flat,
                    run.config.groups.resample_zero_std_max,
                    phases.step_seed(run.config.train.seed, step),
                    run.rank * 1_000_000,
                )
        return scored


def draw_more(
    run: Run, batch: Batch, scored: Scored, which: torch.Tensor, n: int, seed: int, offset: int
) -> Scored:
    """``n`` more completions for each group in ``which`` ([P] bool), scored and appended to
    their groups; row ids from ``offset``."""
    ro = scored.rollout
    idx = torch.nonzero(which).squeeze(1).tolist()
    sub = batch.select(idx)
    t0 = time.time()
    extra = run.generator.generate(
        sub.prompt_ids, n, run.sampling, seed=seed ^ 0x5BD1E995, row_offset=offset
    ).to(ro.group.device)
    seconds = time.time() - t0
    got = phases.rewards(run, sub, extra)
    extra = replace(
        extra,
        prompt_ids=ro.prompt_ids,
        prompt_mask=ro.prompt_mask,
        group=torch.tensor(idx, device=ro.group.device)[extra.group],
    )
    sizes = [len(scored.rewards), extra.size]
    return replace(
        scored,
        rollout=merge(ro, extra),
        rewards=torch.cat([scored.rewards, got.rewards]),
        dimensions=joined([scored.dimensions, got.dimensions], sizes, float("nan")),
        extras=joined([scored.extras, got.extras], sizes, None),
        problem=scored.problem or got.problem,
        extra_completions=scored.extra_completions + extra.size,
        extra_seconds=scored.extra_seconds + seconds,
    )


def flat_any(flat: torch.Tensor) -> bool:
    """Whether any rank has a flat group (the weights are gathered by every rank together)."""
    return bool(dist.all_sum(flat.any().double().reshape(1)).item())
