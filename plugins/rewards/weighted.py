"""``weighted``: the multi-dimensional reward.

total_i = sum_k w_k * gate_k,i * d_k,i over the components that score completion i (a
component's None or NaN means it does not apply there: TRL's NaN-aware sum with its
``reward_weights``; a completion no component scores gets None, no reward), where d_k is
component k's score (optionally normalised within each group: (d - group mean) / (group
std + eps)), and gate_k,i is 1 only when every dimension named in k's ``requires`` scored
at least its ``pass_threshold`` ("format correct AND answer correct"). Components run
concurrently in threads (``async def`` functions too, one event loop each). Each
dimension's raw scores are reported, so each is logged as ``reward/<name>``.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

import grpo_core
from grpo_core.hookspecs import Reward
from grpo_core.registry import registry
from grpo_core.reward.functions import declared_columns
from grpo_core.scores import Scores

MAX_COMPONENTS = 256  # dimensions a reward is read by; more is a generated config gone wrong


class WeightedReward(Reward):
    def __init__(self, components: list[dict], normalize: str = "none", threads: int = 8):
        problems = self.check_options({"components": components})
        if problems:
            raise ValueError(problems[0])
        self.parts = [
            {
                "dim": c.get("as") or c["name"],
                "fn": grpo_core.create("reward", c["name"], c.get("options")),
                "weight": c["weight"],
                "requires": c["requires"],
                "threshold": c["pass_threshold"],
            }
            for c in components
        ]
        self.normalize, self.threads = normalize, threads
        # the best total is known when every component's best is and nothing is normalised;
        # a component with a negative weight is a penalty whose best is taken to be 0
        maxima = [p["fn"].max_value for p in self.parts]
        known = normalize == "none" and None not in maxima
        self.max_value = (
            sum(max(p["weight"] * m, 0.0) for p, m in zip(self.parts, maxima)) if known else None
        )

    @classmethod
    def check_options(cls, options: dict) -> list[str]:
        """Dimension names used twice, and ``requires`` naming no dimension."""
        components = options.get("components") or []
        dims = [c.get("as") or c["name"] for c in components]
        problems = [
            f"components[{i}]: two components are named {d!r}; give one an 'as' name"
            for i, d in enumerate(dims)
            if d in dims[:i]
        ]
        for i, c in enumerate(components):
            problems += [
                f"components[{i}].requires: {r!r} is not a dimension; known: {sorted(set(dims))}"
                for r in c.get("requires") or []
                if r not in dims
            ]
        return problems

    @classmethod
    def columns_for(cls, options: dict) -> tuple[str, ...]:
        found: list[str] = []
        for c in options["components"]:
            factory = registry().get("reward", c["name"]).factory
            found += declared_columns(factory, c.get("options") or {})
        return tuple(dict.fromkeys(found))

    def close(self) -> None:
        for p in self.parts:
            p["fn"].close()

    def __call__(self, prompts, completions, **columns) -> Scores:
        with ThreadPoolExecutor(max_workers=min(self.threads, len(self.parts))) as pool:
            futures = {
                p["dim"]: pool.submit(p["fn"], prompts, completions, **columns) for p in self.parts
            }
            results = {dim: f.result() for dim, f in futures.items()}
        dims = {}
        for dim, out in results.items():
            if len(out) != len(completions):
                raise ValueError(
                    f"component {dim!r} returned {len(out)} scores for "
                    f"{len(completions)} completions"
                )
            dims[dim] = torch.tensor([_value(v) for v in out], dtype=torch.float64)
        groups = columns.get("group_ids")
        total = torch.zeros(len(completions), dtype=torch.float64)
        scored = torch.zeros(len(completions), dtype=torch.bool)
        for p in self.parts:
            d = dims[p["dim"]]
            if self.normalize == "group" and groups is not None:
                d = _group_normalise(d, torch.tensor(groups))
            gate = torch.ones_like(d, dtype=torch.bool)
            for r in p["requires"]:
                threshold = next(q["threshold"] for q in self.parts if q["dim"] == r)
                gate &= dims[r] >= threshold  # a missing dimension closes the gate
            # a closed gate: the component does not count there, whatever it scored (NaN too)
            total += torch.where(gate, torch.nan_to_num(p["weight"] * d, nan=0.0), 0.0)
            scored |= ~d.isnan()
        extras, more = {}, {}
        for out in results.values():
            if isinstance(out, Scores):
                extras.update(out.extras)
                more.update(out.dimensions)  # a function's log_metric values, say
        return Scores(
            [t if s else None for t, s in zip(total.tolist(), scored.tolist())],
            dimensions={**more, **{k: v.tolist() for k, v in dims.items()}},
            extras=extras,
        )


def _value(v) -> float:
    """A component's score as a float; None (no reward for this completion) is NaN."""
    return float("nan") if v is None else float(v)


def _group_normalise(d: torch.Tensor, groups: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(d - group mean) / (group std + eps), over each group's scored completions (NaN: a
    completion the component does not score, left NaN)."""
    out = torch.full_like(d, float("nan"))
    for g in groups.unique():
        m = (groups == g) & ~d.isnan()
        x = d[m]
        if x.numel() == 0:
            continue
        sd = x.std(unbiased=False) if x.numel() > 1 else torch.tensor(0.0, dtype=d.dtype)
        out[m] = (x - x.mean()) / (sd + eps)
    return out


COMPONENT = {
    "type": "object",
    "x-plugin": "reward",
    "additionalProperties": False,
    "required": ["name"],
    "properties": {
        "name": {"type": "string"},
        "options": {"type": "object", "default": {}},
        "weight": {"type": "number", "default": 1.0},
        "as": {"type": ["string", "null"], "default": None, "description": "dimension name"},
        "requires": {
            "type": "array",
            "items": {"type": "string"},
            "default": [],
            "description": "dimensions that must pass for this one to count",
        },
        "pass_threshold": {
            "type": "number",
            "default": 1.0,
            "description": "score at which this dimension passes a gate",
        },
    },
}

SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["components"],
    "properties": {
        "components": {
            "type": "array",
            "items": COMPONENT,
            "minItems": 1,
            "maxItems": MAX_COMPONENTS,
            "description": f"at most {MAX_COMPONENTS}; components of one kind share workers",
        },
        "normalize": {
            "enum": ["none", "group"],
            "default": "none",
            "description": "normalise each dimension within its group first",
        },
        "threads": {"type": "integer", "minimum": 1, "default": 8},
    },
}
