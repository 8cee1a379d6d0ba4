"""Sources of targets: phase 3 of a step, ``targets = run.targets.compute(run, scored)``.

One is chosen at start (grpo_core.plan): ``baselines`` (the baseline plugin turns each
group's rewards into advantages: GRPO, RLOO, ReMax...) or ``critic`` (a critic plugin learns
per-token values: PPO). What both do (log-probs, the reference, KL in the reward, which
completions are in the loss) is grpo_core.phases.targets; a source adds its advantages, what
it needs sampled beside the rollout (ReMax's greedy completions), its own update (a critic's)
and its checkpoint state. Each declares what it cannot be combined with.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from grpo_core.config.view import Config
    from grpo_core.data.prompts import Batch
    from grpo_core.records import Sampled, Scored, Targets
    from grpo_core.reward.call import Rewards
    from grpo_core.rollout import Rollout
    from grpo_core.run import Run


class TargetSource:
    """The default hooks; :meth:`advantages` is each source's own."""

    @classmethod
    def refusals(
        cls, config: Config, world: int, how: str = "none", lora: bool = False
    ) -> list[str]:
        """Why the config cannot run with this source, one line each naming the key."""
        return []

    @classmethod
    def build(cls, config: Config, policy: Any) -> TargetSource:
        """The source for a run of ``config`` training ``policy`` (its plugin built)."""
        raise NotImplementedError

    def compute(self, run: Run, scored: Scored) -> Targets:
        from grpo_core import phases

        return phases.targets(run, scored, self.advantages)

    def advantages(
        self, run: Run, scored: Scored, rewards: torch.Tensor, keep: torch.Tensor
    ) -> dict:
        """``rewards`` [B] (task reward, minus KL if so placed), ``keep`` [B] bool (in the
        loss) -> ``{"advantages": ...}`` plus any other field of Targets the source fills."""
        raise NotImplementedError

    def greedy(self, run: Run, batch: Batch) -> Rollout | None:
        """Completions to sample beside the rollout, on the same gathered weights (none)."""
        return None

    def greedy_rewards(self, run: Run, sampled: Sampled) -> tuple[Rewards | None, float]:
        """Their rewards (with the first failure) and the seconds sampling and scoring them took."""
        return None, 0.0

    def fit(
        self,
        run: Run,
        ro: Rollout,
        targets: Targets,
        loss_mask: torch.Tensor,
        batches: list[torch.Tensor],
    ) -> dict[str, float]:
        """The source's own update after each pass of the policy's (none); named numbers."""
        return {}

    def state_dict(self) -> dict:
        """What a checkpoint keeps (``baseline.pt``)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned."""
