"""A typed, frozen view of the validated config: one dataclass per section, so the spine reads
``config.sampling.group_size`` (a typo is an AttributeError at import of the code that reads
it, found by linters and tests) rather than ``cfg["sampling"]["group_size"]``.

Built by :func:`view` from the dict :func:`grpo_core.config.validate` returns (defaults filled,
every value checked against the schema). The section classes are generated from the schema
(grpo_core/config/sections.py, by grpo_core.config.codegen), so a key is added in one place.
Plugin references are sections too: their ``name``, the ``options`` dict the plugin's own
schema checked, and the keys the core reads beside them. A mapping with keys of its own in
the schema (``model.lora``, ``reward.overlong``, ``objective.tis``) is a section too; lists
the core hands on whole (``output.loggers``, ``callbacks``) stay plain values. Values derived
from several keys are properties of :class:`Config`, computed here once.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass

from grpo_core.config.sections import (
    BaselineSection,
    CriticSection,
    DataSection,
    DistributedSection,
    EnvironmentSection,
    EvalSection,
    GeneratorSection,
    GroupsSection,
    HealthSection,
    KlSection,
    ModelSection,
    ObjectiveSection,
    OptimizerSection,
    OutputSection,
    RewardSection,
    RuntimeSection,
    SamplingSection,
    TrainSection,
)


@dataclass(frozen=True)
class Config:
    """The whole run configuration, one attribute per section."""

    model: ModelSection
    data: DataSection
    sampling: SamplingSection
    reward: RewardSection
    groups: GroupsSection
    baseline: BaselineSection
    critic: CriticSection | None
    kl: KlSection
    objective: ObjectiveSection
    optimizer: OptimizerSection
    train: TrainSection
    generator: GeneratorSection
    environment: EnvironmentSection | None
    runtime: RuntimeSection
    distributed: DistributedSection
    output: OutputSection
    eval: EvalSection
    health: HealthSection
    callbacks: list
    deepspeed: dict | str | None

    def as_dict(self) -> dict:
        """The config as the plain dict it was built from (with any values replaced since,
        such as the resolved sampling settings); ``${env:NAME}`` values stay resolved
        strings that remember their template (grpo_core.config.file.unresolved)."""
        return dataclasses.asdict(self)

    # values derived from several keys, computed here once

    @property
    def first_group_size(self) -> int:
        """Completions drawn for each prompt in the first pass: all G, or
        ``groups.adaptive_first`` (std-driven group sizes)."""
        return self.groups.adaptive_first or self.sampling.group_size

    @property
    def completion_budget(self) -> tuple[str, int]:
        """The longest completion in tokens and the key that sets it: a whole episode's
        after the prompt when an environment runs, else one completion's."""
        if self.environment:
            return "environment.max_total_tokens", self.environment.max_total_tokens
        return "sampling.max_new_tokens", self.sampling.max_new_tokens

    @property
    def generation_process(self) -> bool:
        """Whether generation runs in its own process: ``sampling.generation: process``, or
        ``auto`` with ``sampling.max_staleness`` >= 1."""
        sc = self.sampling
        return sc.generation == "process" or (sc.generation == "auto" and sc.max_staleness > 0)


def _build(cls: type, value: dict):
    """``cls`` from the section dict ``value``; fields that are sections are built in turn."""
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        raw = value.get(f.name)
        section = section_type(hints[f.name])
        kwargs[f.name] = _build(section, raw) if section and raw is not None else raw
    return cls(**kwargs)


def section_type(hint) -> type | None:
    """The section dataclass in a field's type (``X`` or ``X | None``), else None."""
    for arg in typing.get_args(hint) or (hint,):
        if isinstance(arg, type) and dataclasses.is_dataclass(arg):
            return arg
    return None


def section_class(name: str) -> type:
    """The dataclass of the config section ``name`` (``model`` -> ModelSection)."""
    cls = section_type(typing.get_type_hints(Config)[name])
    if cls is None:
        raise KeyError(f"{name} is not a config section")
    return cls


def build_section(name: str, value: dict):
    """Section ``name`` of the view from its validated dict."""
    return _build(section_class(name), value)


def view(config: dict) -> Config:
    """The typed view of a validated config dict (see :func:`grpo_core.config.validate`)."""
    return _build(Config, config)
