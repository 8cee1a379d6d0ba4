"""Group baselines: the baseline plugin sees the whole batch's ``[P, G]`` reward grid (every
rank's groups) and returns an advantage for each completion. ReMax's baseline also needs one
greedy completion of each prompt, sampled and scored beside the rollout."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from grpo_core import phases
from grpo_core.building import create
from grpo_core.config.view import Config
from grpo_core.data.prompts import Batch
from grpo_core.engine import dist
from grpo_core.hookspecs import Baseline
from grpo_core.loss.groups import to_grid
from grpo_core.records import Sampled, Scored
from grpo_core.rollout import Rollout
from grpo_core.targets import TargetSource

if TYPE_CHECKING:
    from grpo_core.reward.call import Rewards
    from grpo_core.run import Run


class GroupBaseline(TargetSource):
    """Advantages from the baseline plugin, one per completion."""

    def __init__(self, baseline: Baseline):
        self.baseline = baseline

    @classmethod
    def build(cls, config: Config, policy: Any) -> GroupBaseline:
        return cls(create("baseline", config.baseline.name, config.baseline.options))

    def advantages(
        self, run: Run, scored: Scored, rewards: torch.Tensor, keep: torch.Tensor
    ) -> dict:
        group = scored.rollout.group.cpu()
        grid, slot = to_grid(rewards, group, run.prompts)
        everyone, first = dist.gather_grid(grid)  # the baseline sees the whole batch
        greedy = (
            None
            if scored.greedy_rewards is None
            else dist.gather_grid(scored.greedy_rewards.cpu()[:, None].double())[0][:, 0]
        )
        adv = self.baseline.advantages(everyone, greedy)[first : first + run.prompts]
        return {"advantages": adv[group, slot]}

    def state_dict(self) -> dict:
        return self.baseline.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.baseline.load_state_dict(state)


class GreedyBaseline(GroupBaseline):
    """A baseline that declares ``needs_greedy`` (ReMax): one greedy completion per prompt,
    its reward handed to the baseline."""

    @classmethod
    def refusals(
        cls, config: Config, world: int, how: str = "none", lora: bool = False
    ) -> list[str]:
        name, found = f"baseline.name: {config.baseline.name}", []
        if config.generation_process:
            found.append(
                f"{name} (greedy completions) is not supported with asynchronous "
                f"generation (sampling.generation: process)"
            )
        if config.environment:
            found.append(f"{name} needs greedy completions, not yet drawn for environment episodes")
        return found

    def greedy(self, run: Run, batch: Batch) -> Rollout | None:
        return run.generator.generate(batch.prompt_ids, 1, replace(run.sampling, greedy=True)).to(
            run.device
        )

    def greedy_rewards(self, run: Run, sampled: Sampled) -> tuple[Rewards | None, float]:
        t0 = time.time()
        assert sampled.greedy is not None  # drawn by :meth:`greedy`
        got = phases.rewards(run, sampled.batch, sampled.greedy)
        return got, sampled.greedy_seconds + time.time() - t0
