"""A typed, frozen view of the validated config: one dataclass per section, so the spine reads
``config.sampling.group_size`` (a typo is an AttributeError at import of the code that reads
it, found by linters and tests) rather than ``cfg["sampling"]["group_size"]``.

Built by :func:`view` from the dict :func:`grpo_core.config.validate` returns (defaults filled,
every value checked against the schema). Plugin references are sections too: their ``name``,
the ``options`` dict the plugin's own schema checked, and the keys the core reads beside them.
Nested objects the core hands on whole (``model.lora``, ``output.loggers``) stay plain values.
tests/unit/test_config_view.py keeps these classes and the schema's sections equal.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelSection:
    """``model``: The policy to train."""

    name_or_path: str
    gguf_file: str | None
    dtype: str
    trust_remote_code: bool
    allow_unsafe_weights: bool
    gradient_checkpointing: bool
    lora: dict | None
    quantization: None | str
    attn_implementation: str | None
    reference_device: str


@dataclass(frozen=True)
class DataSection:
    """``data``: The prompts, and the fields rewards read."""

    path: str
    name: str | None
    data_files: str | list | dict | None
    split: str
    streaming: bool
    shuffle_buffer: int
    prompt_field: str
    columns: list | dict
    chat_template: str
    chat_template_kwargs: dict
    system_prompt: str | None
    shuffle: bool
    max_prompt_tokens: int | None
    long_prompts: str


@dataclass(frozen=True)
class SamplingSection:
    """``sampling``: Phase 1, sample: G completions per prompt."""

    group_size: int
    max_new_tokens: int
    temperature: float | None
    top_p: float | None
    top_k: int | None
    min_p: float | None
    repetition_penalty: float | None
    stop: list
    generation_batch_size: int | None
    max_staleness: int
    generation: str
    generation_timeout: float


@dataclass(frozen=True)
class RewardSection:
    """``reward``: Phase 2, score: the reward plugin."""

    name: str
    options: dict
    failure: str
    timeout: float | None
    isolation: str
    memory_mb: int | None
    overlong: dict | None


@dataclass(frozen=True)
class GroupsSection:
    """``groups``: Phase 2-3: groups with no learning signal (DAPO dynamic sampling)."""

    drop_zero_std: bool
    resample_zero_std_max: int
    adaptive_first: int | None
    dynamic_sampling: bool
    min_std: float
    max_rounds: int


@dataclass(frozen=True)
class BaselineSection:
    """``baseline``: Phase 3: rewards to advantages."""

    name: str
    options: dict


@dataclass(frozen=True)
class CriticSection:
    """``critic``: Phase 3: a learned value function (PPO); null: group baselines."""

    name: str
    options: dict


@dataclass(frozen=True)
class KlSection:
    """``kl``: Phase 3: the KL coefficient controller."""

    name: str
    options: dict
    estimator: str
    placement: str


@dataclass(frozen=True)
class ObjectiveSection:
    """``objective``: Phase 4, update: the policy objective."""

    name: str
    options: dict
    aggregation: None | str
    entropy_coef: float
    top_entropy_quantile: float
    mask_truncated_completions: bool
    tis: dict | None


@dataclass(frozen=True)
class OptimizerSection:
    """``optimizer``: Phase 4: the optimizer and its learning-rate schedule."""

    name: str
    lr: float
    weight_decay: float
    momentum: float
    betas: list
    lr_schedule: str
    scheduler_options: dict
    warmup_steps: int
    warmup_ratio: float | None
    max_grad_norm: float | None
    fused: bool


@dataclass(frozen=True)
class TrainSection:
    """``train``: The loop: steps, batch and micro-batch sizes, seed."""

    steps: int
    prompts_per_step: int
    inner_iterations: int
    mini_batches: int
    micro_batch_groups: int
    max_nonfinite_steps: int
    seed: int


@dataclass(frozen=True)
class GeneratorSection:
    """``generator``: Phase 1: the rollout backend."""

    name: str
    options: dict


@dataclass(frozen=True)
class EnvironmentSection:
    """``environment``: Phase 1 with several turns (null: one completion per rollout)."""

    name: str
    options: dict
    max_turns: int
    max_total_tokens: int
    timeout: float | None
    failure: str


@dataclass(frozen=True)
class RuntimeSection:
    """``runtime``: Where and how the numbers are computed."""

    device: str
    threads: int | None
    logprob_chunk: int
    packing: str


@dataclass(frozen=True)
class DistributedSection:
    """``distributed``: How the run is spread over processes (torchrun starts them)."""

    strategy: str
    reshard_after_forward: bool
    cpu_offload: bool
    mixed_precision: bool


@dataclass(frozen=True)
class OutputSection:
    """``output``: Phase 6, save: the run directory."""

    dir: str
    save_dtype: str
    save_model: bool
    push_to_hub: bool
    hub_model_id: str | None
    hub_private: bool
    checkpoint_every: int
    keep_last: int
    samples_every: int
    progress: bool
    loggers: list | None
    metric_names: str
    tensorboard: str
    wandb_project: str | None


@dataclass(frozen=True)
class EvalSection:
    """``eval``: Phase 5, observe: validation on held-out problems."""

    data: str | None
    split: str
    every_n_steps: int
    n: int
    batch_prompts: int
    temperature: float
    max_problems: int | None
    pass_threshold: float
    correct_dimension: str | None
    keep_best: str | None


@dataclass(frozen=True)
class HealthSection:
    """``health``: Phase 5: the health monitor."""

    enabled: bool
    window: int
    memory_limit_mb: float | None
    solved_reward: float | None


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
