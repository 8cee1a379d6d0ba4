"""The plan of a run: which strategies serve it, chosen once from the config and the plugins'
declarations, and every reason the config cannot run so.

The strategies are the sampler (phases 1-2, grpo_core.samplers) and the source of targets
(phase 3, grpo_core.targets). Each declares what it cannot be combined with; this module only
reads those declarations, in one table (:data:`SAMPLERS`, :data:`TARGETS`), so a new strategy
is one file and one line here. ``grpo validate`` and ``run.start`` both ask :func:`make`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from grpo_core.building import declared
from grpo_core.config.view import Config
from grpo_core.samplers import Sampler
from grpo_core.samplers.dynamic import Dynamic
from grpo_core.samplers.inline import Inline
from grpo_core.samplers.overlap import Overlap
from grpo_core.samplers.resample import Resample
from grpo_core.samplers.sizes import Sizes
from grpo_core.targets import TargetSource
from grpo_core.targets.baselines import GreedyBaseline, GroupBaseline
from grpo_core.targets.critic import CriticTargets

#: the samplers, the first the config chooses serving it (inline: when no other is chosen)
SAMPLERS: tuple[type[Sampler], ...] = (Overlap, Dynamic, Sizes, Resample, Inline)


def _greedy(config: Config) -> bool:
    """The baseline declares ``needs_greedy`` (ReMax)."""
    return bool(declared("baseline", config.baseline.name, config.baseline.options, "needs_greedy"))


#: the sources of targets and when the config chooses each, the first that applies serving it
TARGETS: tuple[tuple[type[TargetSource], Callable[[Config], bool]], ...] = (
    (CriticTargets, lambda c: c.critic is not None),
    (GreedyBaseline, _greedy),
    (GroupBaseline, lambda c: True),
)


@dataclass(frozen=True, kw_only=True)
class Plan:
    """The strategies chosen, and the problems that keep the config from running."""

    sampler: type[Sampler]
    targets: type[TargetSource]
    problems: list[str]


def make(config: Config, world: int = 1, how: str = "none", lora: bool = False) -> Plan:
    """The plan for ``config`` run by ``world`` processes spread as ``how`` (``lora``: the
    policy is a LoRA model). A strategy's refusals count when the config asks for it, so two
    settings that cannot be combined are reported whichever serves."""
    samplers = [s for s in SAMPLERS if s.chosen(config)]
    targets = [t for t, chosen in TARGETS if chosen(config)]
    problems = [line for s in reversed(samplers) for line in s.refusals(config, world, how, lora)]
    problems += [line for t in targets for line in t.refusals(config, world, how, lora)]
    problems += _settings(config)
    return Plan(sampler=samplers[0], targets=targets[0], problems=problems)


def _settings(config: Config) -> list[str]:
    """Settings that have no meaning as given."""
    sc, tc, found = config.sampling, config.train, []
    if sc.generation == "inline" and sc.max_staleness:
        found.append("sampling.max_staleness: >= 1 needs sampling.generation: process or auto")
    if tc.prompts_per_step % tc.mini_batches:  # equal runs of whole groups
        found.append(
            f"train.mini_batches: {tc.mini_batches} does not divide "
            f"train.prompts_per_step ({tc.prompts_per_step}); each mini-batch holds "
            f"the same number of whole groups"
        )
    return found
