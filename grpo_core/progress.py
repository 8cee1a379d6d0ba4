"""How far a run has come: the one record of a run that changes from step to step, changed
only through its methods (by the phases, and by a resume)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(kw_only=True)
class Progress:
    """Where the loop starts (a resumed run: the checkpoint's step) and what it has seen."""

    start: int = 0  # the first step this process runs
    steps_run: int = 0  # steps this process ran
    tokens_seen: int = 0  # prompt and completion tokens of every step so far (resumed too)
    first_reward: float | None = None  # the run's first step's reward (resumed too; None: NaN)
    last: dict | None = None  # the latest step's metrics record
    best: float | None = None  # best eval metric so far (eval.keep_best)
    nonfinite: int = 0  # steps in a row whose update was skipped
    filler_groups: int = 0  # groups kept only to fill a batch (DAPO), the whole run

    @property
    def step(self) -> int:
        """The step running now (before its metrics are observed)."""
        return self.start + self.steps_run

    def state(self) -> dict:
        """What a checkpoint keeps, so that a resumed run's totals are the whole run's."""
        return {
            "tokens_seen": self.tokens_seen,
            "filler_groups": self.filler_groups,
            "first_reward": self.first_reward,
            "best": self.best,
        }

    def resumed(self, step: int, state: dict) -> None:
        """A checkpoint after ``step`` steps, with its :meth:`state`, was loaded."""
        self.start = step
        self.tokens_seen = state.get("tokens_seen", 0)
        self.filler_groups = state.get("filler_groups", 0)
        self.first_reward, self.best = state.get("first_reward"), state.get("best")

    def saw(self, tokens: int) -> int:
        """A step's tokens; returns the total so far."""
        self.tokens_seen += tokens
        return self.tokens_seen

    def updated(self, skipped: bool) -> int:
        """A step's update, skipped or not; returns how many steps in a row were skipped."""
        self.nonfinite = self.nonfinite + 1 if skipped else 0
        return self.nonfinite

    def improved(self, value: float) -> bool:
        """An eval value: whether it is the best so far (then kept)."""
        if self.best is not None and value <= self.best:
            return False
        self.best = value
        return True

    def observed(self, record: dict) -> None:
        """A step's metrics record."""
        if self.step == 0:  # the run's first step (a resumed run keeps the checkpoint's)
            reward = record.get("reward")
            self.first_reward = reward if reward is not None and math.isfinite(reward) else None
        self.last = record
        self.steps_run += 1
        self.filler_groups += int(record.get("groups/filler", 0))
