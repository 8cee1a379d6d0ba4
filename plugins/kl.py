"""KL-coefficient controllers."""

from __future__ import annotations

import math

from grpo_core.hookspecs import KLController, hookimpl

GRPO_CORE_API = (2,)


class Fixed(KLController):
    """A constant coefficient; at 0 the trainer loads no reference model."""

    def __init__(self, coef: float = 0.0):
        self.value = coef

    def needs_reference(self) -> bool:
        return self.value != 0


class Adaptive(KLController):
    """Ziegler et al. 2019: err = clip(KL / target - 1, -clip, clip);
    coef <- coef * (1 + err * n_samples / horizon)."""

    def __init__(
        self, init_coef: float = 0.05, target: float = 0.02, horizon: int = 10000, clip: float = 0.2
    ):
        self.value = init_coef
        self.target, self.horizon, self.clip = target, horizon, clip

    def update(self, kl: float, n_samples: int) -> None:
        err = min(max(kl / self.target - 1.0, -self.clip), self.clip)
        self.value *= 1.0 + err * n_samples / self.horizon

    def needs_reference(self) -> bool:
        return self.value != 0  # a multiplicative controller never leaves 0


class Schedule(KLController):
    """From ``start`` to ``end`` over ``steps`` updates, linearly or on a half cosine."""

    def __init__(
        self, start: float = 0.1, end: float = 0.0, steps: int = 1000, shape: str = "linear"
    ):
        self.value = start
        self.start, self.end, self.steps, self.shape, self.t = start, end, steps, shape, 0

    def update(self, kl: float, n_samples: int) -> None:
        self.t += 1
        frac = min(self.t / self.steps, 1.0)
        if self.shape == "cosine":
            frac = 0.5 * (1 - math.cos(math.pi * frac))
        self.value = self.start + (self.end - self.start) * frac

    def needs_reference(self) -> bool:
        return self.start != 0 or self.end != 0

    def state_dict(self) -> dict:
        return {"value": self.value, "t": self.t}

    def load_state_dict(self, state: dict) -> None:
        self.value, self.t = state["value"], state["t"]


COEF = {"type": "number", "minimum": 0}


@hookimpl
def kl(register):
    register(
        "fixed",
        Fixed,
        schema={
            "type": "object",
            "additionalProperties": False,
            "properties": {"coef": {**COEF, "default": 0.0}},
        },
        description="constant KL coefficient (0: no reference model)",
    )
    register(
        "adaptive",
        Adaptive,
        schema={
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "init_coef": {**COEF, "default": 0.05},
                "target": {"type": "number", "exclusiveMinimum": 0, "default": 0.02},
                "horizon": {"type": "integer", "minimum": 1, "default": 10000},
                "clip": {"type": "number", "exclusiveMinimum": 0, "default": 0.2},
            },
        },
        description="Ziegler et al. 2019 proportional controller towards a target KL",
    )
    register(
        "schedule",
        Schedule,
        schema={
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "start": {**COEF, "default": 0.1},
                "end": {**COEF, "default": 0.0},
                "steps": {"type": "integer", "minimum": 1, "default": 1000},
                "shape": {"enum": ["linear", "cosine"], "default": "linear"},
            },
        },
        description="coefficient moved from start to end over N steps",
    )
