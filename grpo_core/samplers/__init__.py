"""Samplers: phases 1 and 2 of a step, ``sampled, scored = run.sampler.next(run, step)``.

One is chosen at start (grpo_core.plan) from the config, each in a file of its own:
``inline`` (the trainer generates), ``overlap`` (generation in its own process),
``dynamic`` (DAPO's dynamic sampling: new prompts replace groups with no signal), ``sizes``
(std-driven group sizes) and ``resample`` (more completions for flat groups). Each declares
what it cannot be combined with (:meth:`Sampler.refusals`); the plan reads those, so a run
that starts has a sampler that can serve it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from grpo_core.errors import UserError

if TYPE_CHECKING:
    from grpo_core.config.view import Config
    from grpo_core.records import Sampled, Scored, Targets
    from grpo_core.run import Run


class Sampler:
    """The default hooks; :meth:`next` is each sampler's own."""

    @classmethod
    def chosen(cls, config: Config) -> bool:
        """Whether the config asks for this sampler."""
        raise NotImplementedError

    @classmethod
    def refusals(
        cls, config: Config, world: int, how: str = "none", lora: bool = False
    ) -> list[str]:
        """Why the config, which chooses this sampler, cannot run with it: one line each,
        naming the key (``world`` processes spread as ``how``; ``lora``: a LoRA policy)."""
        return []

    @classmethod
    def start(cls, run: Run, inflight: dict | None) -> Sampler:
        """The sampler for ``run``; ``inflight``: the rollouts a checkpoint kept for later
        steps, which only the overlap sampler can take."""
        if inflight:
            raise UserError(
                f"--resume: the checkpoint holds {len(inflight['steps'])} rollouts of an "
                f"asynchronous run; resume with its sampling.max_staleness"
            )
        return cls()

    def next(self, run: Run, step: int) -> tuple[Sampled, Scored]:
        raise NotImplementedError

    def published(self, run: Run, step: int) -> None:
        """The policy was updated after ``step`` (the overlap sampler hands it on)."""

    def metrics(self, step: int, sampled: Sampled, targets: Targets) -> dict:
        """The sampler's own numbers in the step's metrics record."""
        return {}

    def inflight(self, step: int) -> dict | None:
        """Rollouts asked for later steps, which a checkpoint keeps (None: none)."""
        return None

    def close(self) -> None:
        """Stop what the sampler started."""
