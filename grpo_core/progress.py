"""How far a run has come: the one record of a run that changes from step to step, changed
only through its methods (by the phases, and by a resume)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True)
class Progress:
    """Where the loop starts (a resumed run: the checkpoint's step) and what it has seen."""

    start: int = 0  # the first step this process runs
    steps_run: int = 0  # steps this process ran
    tokens_seen: int = 0  # prompt and completion tokens of every step so far (resumed too)
    first: dict | None = None  # the first step's metrics record (of this process)
    last: dict | None = None  # the latest one
    best: float | None = None  # best eval metric so far (eval.keep_best)
    nonfinite: int = 0  # steps in a row whose update was skipped

    @property
    def step(self) -> int:
        """The step running now (before its metrics are observed)."""
        return self.start + self.steps_run

    def resumed(self, step: int, tokens_seen: int) -> None:
        """A checkpoint after ``step`` steps and ``tokens_seen`` tokens was loaded."""
        self.start, self.tokens_seen = step, tokens_seen

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
        self.first, self.last = self.first or record, record
        self.steps_run += 1
