"""What one rollout row is, chosen at start: a completion of the prompt (the generator), or an
episode of several turns with an environment (grpo_core.env.episodes)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from grpo_core.env.episodes import EpisodeRunner, Transcript, episode_metrics
from grpo_core.hookspecs import Generator
from grpo_core.rollout import Rollout, SamplingParams

if TYPE_CHECKING:
    from grpo_core.data.prompts import Batch
    from grpo_core.records import Sampled


class Completions:
    """One completion per row, from the generator."""

    runner: EpisodeRunner | None = None
    problem: str | None = None

    def __init__(self, generator: Generator):
        self.generator = generator

    def sample(
        self,
        batch: Batch,
        rows: list[dict],
        n: int,
        sampling: SamplingParams,
        seed: int,
        offset: int,
    ) -> tuple[Rollout, list[Transcript] | None]:
        """``n`` completions of each prompt, completion ``offset + r`` drawing row id
        ``offset + r``'s noise."""
        return (
            self.generator.generate(batch.prompt_ids, n, sampling, seed=seed, row_offset=offset),
            None,
        )

    def metrics(self, sampled: Sampled, device: torch.device) -> dict:
        return {}

    def close(self) -> None:
        pass


class Episodes(Completions):
    """One episode per row: turns of the generator and the environment."""

    runner: EpisodeRunner

    def __init__(self, runner: EpisodeRunner, failure: str):
        self.runner, self.failure = runner, failure

    @property
    def problem(self) -> str | None:  # type: ignore[override]
        """The step's first environment failure, as the warning gives it."""
        if not self.runner.problem:
            return None
        return f"{self.runner.problem}; applied environment.failure: {self.failure}"

    def sample(
        self,
        batch: Batch,
        rows: list[dict],
        n: int,
        sampling: SamplingParams,
        seed: int,
        offset: int,
    ) -> tuple[Rollout, list[Transcript] | None]:
        return self.runner.sample(batch, rows, n, sampling, seed, offset)

    def metrics(self, sampled: Sampled, device: torch.device) -> dict:
        """The step's ``env/*`` metrics."""
        return episode_metrics(sampled.transcripts or [], self.runner.seconds, device)

    def close(self) -> None:
        self.runner.close()
