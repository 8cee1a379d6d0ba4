"""Running a reward plugin in a killable worker process, so its time limit always holds.

A reward called in the trainer's process can only be abandoned past ``reward.timeout``, not
stopped: a catastrophic regex or a C extension holding the GIL keeps running (and keeps the
trainer waiting). With ``reward.isolation: process`` (the default) the reward is built and
called in a worker process of its own (grpo_core.workers); past the budget the worker is
killed and replaced, and the call fails under ``reward.failure`` like any other. Rewards that
declare ``inline`` (a reward model holding a model on the device) run in the trainer's
process, as do plugin modules added at run time (``registry().add``). Plain functions
(grpo_core.reward.functions) are pickled for the worker; one that cannot be runs inline.
"""

from __future__ import annotations

import sys
from typing import Any

from grpo_core import faults
from grpo_core.building import create
from grpo_core.config.view import RewardSection
from grpo_core.errors import PluginError
from grpo_core.hookspecs import Reward
from grpo_core.registry import registry
from grpo_core.reward import functions
from grpo_core.workers import WorkerCrashed, WorkerError, WorkerPool, WorkerTimeout

#: seconds a worker may take to build the reward (a model may load) before it is given up
BUILD_TIMEOUT = 600.0


def build_reward(section: RewardSection) -> Reward:
    """The configured reward, where its time limit can be enforced (see the module doc)."""
    info = registry().get("reward", section.name)
    inline = (
        isinstance(info.factory, type) and issubclass(info.factory, Reward) and info.factory.inline
    )
    payload, stays, why = functions.shipped({"name": section.name, "options": section.options})
    if why and section.isolation == "process" and not inline:
        print(
            f"notice: the reward runs in the trainer's process, not a worker process "
            f"({why}); reward.timeout can abandon a call there but not stop it",
            file=sys.stderr,
        )
    if section.isolation == "inline" or inline or stays:
        return create("reward", section.name, section.options)
    return IsolatedReward(
        section.name, section.options, section.timeout, section.memory_mb, payload
    )


def preload() -> None:
    """Run in the fork server: discover plugins once, so each worker starts with them."""
    registry()


def build(name: str, options: dict, shipped: bytes | None = None) -> tuple[str, Reward]:
    """Worker setup: the reward's name and the reward, built the way the trainer would build
    it, with the plugins the trainer's process added at run time (``shipped``: see
    grpo_core.reward.functions)."""
    functions.receive(shipped)
    return name, create("reward", name, options)


def call(state: tuple[str, Reward], payload: Any) -> Any:
    """Worker target: ``"describe"`` -> the reward's declarations; else score a batch (a
    failure comes back as a grpo_core.faults.Fault, described here where the frames are)."""
    name, reward = state
    if payload == "describe":
        return {"max_value": reward.max_value}
    prompts, completions, columns = payload
    try:
        return reward(prompts, completions, **columns)
    except Exception as exc:
        return faults.describe(exc, ("reward", name))


class IsolatedReward(Reward):
    """A reward that lives in a worker process; calls past ``timeout`` seconds kill it."""

    def __init__(
        self,
        name: str,
        options: dict,
        timeout: float | None,
        memory_mb: int | None = None,
        shipped: bytes | None = None,
    ):
        self.name, self.timeout = name, timeout
        self.pool = WorkerPool(
            "grpo_core.reward.isolation:call",
            setup="grpo_core.reward.isolation:build",
            setup_args=(name, options, shipped),
            size=1,
            memory_mb=memory_mb,
            preload=("grpo_core.reward.isolation:preload",),
        )
        try:
            described = self.pool.map(["describe"], timeout=BUILD_TIMEOUT)[0]
        except RuntimeError as exc:  # the worker could not even build the reward
            self.pool.close()
            why = (self.pool.boot_error or str(exc)).splitlines()[0]
            raise PluginError(
                f"reward {name!r} could not be built in its worker process: {why}"
            ) from exc
        if isinstance(described, Exception):
            self.pool.close()
            raise PluginError(
                f"reward {name!r} could not be built in its worker process: {_why(described)}"
            )
        self.max_value = described["max_value"]

    def __call__(self, prompts, completions, **columns):
        budget = self.timeout if self.timeout is not None else 10.0**9
        out = self.pool.map([(list(prompts), list(completions), columns)], timeout=budget)[0]
        if isinstance(out, WorkerTimeout):
            raise TimeoutError(
                f"did not return within {budget:g} s (reward.timeout); its "
                f"worker process was killed and replaced"
            )
        if isinstance(out, (WorkerCrashed, WorkerError)):
            raise RuntimeError(_why(out))
        if isinstance(out, faults.Fault):
            raise faults.PluginFailed(out)
        return out

    def close(self) -> None:
        self.pool.close()


def _why(failure: Exception) -> str:
    if isinstance(failure, WorkerError):
        return f"{failure.type_name}: {failure.message}"
    if isinstance(failure, WorkerCrashed):
        return "its worker process died (memory limit, crash or exit)"
    return str(failure)
