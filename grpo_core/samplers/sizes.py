"""Std-driven group sizes (``groups.adaptive_first: G0``): each prompt first gets G0
completions; the rest of the step's budget, P (G - G0) completions' worth of tokens at the
first samples' mean length (over all ranks), is shared with more for the groups whose first
samples agree (grpo_core.loss.groups.allocate), drawn and merged into the groups."""

from __future__ import annotations

from typing import TYPE_CHECKING

from grpo_core import phases
from grpo_core.config.view import Config
from grpo_core.engine import dist
from grpo_core.loss.groups import allocate, group_std, to_grid
from grpo_core.records import Sampled, Scored
from grpo_core.samplers.inline import Inline
from grpo_core.samplers.resample import draw_more

if TYPE_CHECKING:
    from grpo_core.run import Run


class Sizes(Inline):
    """Inline sampling of G0 completions each, then the rest by the groups' std."""

    @classmethod
    def chosen(cls, config: Config) -> bool:
        return config.groups.adaptive_first is not None

    @classmethod
    def refusals(
        cls, config: Config, world: int, how: str = "none", lora: bool = False
    ) -> list[str]:
        gc, first, found = config.groups, config.groups.adaptive_first, []
        if first is not None and first >= config.sampling.group_size:
            found.append(
                f"groups.adaptive_first: {first} leaves no completions to allocate "
                f"(sampling.group_size: {config.sampling.group_size})"
            )
        if gc.resample_zero_std_max or gc.dynamic_sampling or config.environment:
            found.append(
                "groups.adaptive_first: not with groups.resample_zero_std_max, "
                "groups.dynamic_sampling or an environment"
            )
        return found

    def refine(self, run: Run, step: int, sampled: Sampled, scored: Scored) -> Scored:
        """Every rank enters the gathering, with work or not."""
        everyone, first = dist.gather_grid(scored.grid)
        ro = scored.rollout
        tokens = ro.action_mask.sum(-1).float().cpu()  # each first completion's length
        lengths = dist.gather_grid(to_grid(tokens, ro.group.cpu(), scored.prompts)[0])[0]
        G, G0 = run.config.sampling.group_size, run.config.first_group_size
        n = allocate(group_std(everyone), everyone.shape[0] * (G - G0), lengths.nanmean(-1))
        n = n[first : first + scored.prompts]
        seed = phases.step_seed(run.config.train.seed, step)
        with run.autocast, run.engine.gathered():
            for k, size in enumerate(sorted(set(n.tolist()) - {0})):
                scored = draw_more(
                    run,
                    sampled.batch,
                    scored,
                    n == size,
                    size,
                    seed ^ (k + 1),
                    (run.rank * 64 + k) * 1_000_000,
                )
        return scored
