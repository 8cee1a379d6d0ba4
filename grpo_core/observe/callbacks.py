"""Callback plugins (``callbacks`` in the config) called at the loop's boundaries.

They run in the main process only; a stop that one of them asks for at a step's end is
shared with every rank, so all leave the loop after the same step.
"""

from __future__ import annotations

from grpo_core.building import create
from grpo_core.engine import dist
from grpo_core.hookspecs import Callback


class Callbacks:
    """The run's callbacks, built from the config on the main process (none elsewhere)."""

    def __init__(self, refs: list[dict], main: bool):
        self.active = bool(refs)  # the same on every rank: whether to share stop requests
        self.items: list[Callback] = (
            [create("callback", r["name"], r.get("options")) for r in refs] if main else []
        )

    def begin(self, run_dir: str, config: dict, start_step: int) -> None:
        for c in self.items:
            c.on_train_begin(run_dir, config, start_step)

    def step_end(self, step: int, metrics: dict, device) -> bool:
        """Every callback sees the step's metrics; True (on every rank) when any asked to
        stop."""
        if not self.active:
            return False
        stop = False
        for c in self.items:
            stop = bool(c.on_step_end(step, metrics)) or stop
        return dist.sum_named({"stop": float(stop)}, device)["stop"] > 0

    def saved(self, step: int, path: str) -> None:
        for c in self.items:
            c.on_save(step, path)

    def end(self, summary: dict) -> None:
        for c in self.items:
            c.on_train_end(summary)
