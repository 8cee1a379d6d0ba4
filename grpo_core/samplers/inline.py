"""The plain sampler: the trainer generates G completions of each of its prompts and scores
them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from grpo_core import phases
from grpo_core.config.view import Config
from grpo_core.records import Sampled, Scored
from grpo_core.samplers import Sampler

if TYPE_CHECKING:
    from grpo_core.run import Run


class Inline(Sampler):
    """Phases 1-2 in the trainer's process, on this step's prompts."""

    @classmethod
    def chosen(cls, config: Config) -> bool:
        return True

    def next(self, run: Run, step: int) -> tuple[Sampled, Scored]:
        sampled = phases.generate(
            run,
            step,
            take(run),
            phases.step_seed(run.config.train.seed, step),
            run.rank * run.prompts * run.config.first_group_size,
        )
        assert sampled is not None  # every rank has its share of the prompts
        return sampled, phases.score(
            run, step, sampled, lambda s: self.refine(run, step, sampled, s)
        )

    def refine(self, run: Run, step: int, sampled: Sampled, scored: Scored) -> Scored:
        """What a sampler adds to the scored rollout (more completions); none here."""
        return scored


def take(run: Run) -> list[dict]:
    """This rank's share of the step's prompts, in the data order."""
    P = run.prompts
    return run.stream.take(run.config.train.prompts_per_step)[run.rank * P : (run.rank + 1) * P]
