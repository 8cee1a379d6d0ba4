"""The typed view's sections: one frozen dataclass per section of the config, one
field per key, each with its description. GENERATED from grpo_core/config/schema.py by
``python -m grpo_core.config.codegen``: edit the schema, then run that (see
grpo_core.config.view for the whole config and the values derived from several keys).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelLoraSection:
    """``model.lora``: LoRA adapters through peft; the reference is the base model"""

    #: adapter rank
    r: int
    #: adapter scale numerator (scale alpha / r)
    alpha: float
    #: dropout on the adapter input
    dropout: float
    #: module names (or a regex) given adapters
    target_modules: list | str
    #: also write merged weights at the end
    save_merged: bool


@dataclass(frozen=True)
class ModelSection:
    """``model``: The policy to train."""

    #: hub id or local directory
    name_or_path: str
    #: GGUF file (in name_or_path, or a path): model and tokenizer, float, converted once
    gguf_file: str | None
    #: auto: float32 weights, bf16 autocast on GPU
    dtype: str
    #: run the model repository's own Python code
    trust_remote_code: bool
    #: allow pickle (.bin) weights
    allow_unsafe_weights: bool
    #: recompute activations in backward (less memory)
    gradient_checkpointing: bool
    #: LoRA adapters through peft; the reference is the base model
    lora: ModelLoraSection | None
    #: QLoRA base weights (needs bitsandbytes and CUDA)
    quantization: str | None
    #: attention kernel from_pretrained gets (null: transformers' choice); flash_attention_2
    #: needs flash-attn and CUDA
    attn_implementation: str | None
    #: where the frozen reference model lives
    reference_device: str


@dataclass(frozen=True)
class DataSection:
    """``data``: The prompts, and the fields rewards read."""

    #: JSONL/JSON/parquet file; a directory of <split> files or one written by datasets'
    #: save_to_disk; a datasets hub id or local dataset directory
    path: str
    #: the dataset's configuration name (openai/gsm8k: main)
    name: str | None
    #: files for datasets to build from (path: json, csv, ... or a dataset directory), as
    #: load_dataset takes them
    data_files: str | list | dict | None
    #: split, optionally sliced: train, train[:1000], train[:10%]
    split: str
    #: read rows as needed, never all at once (needs datasets); order from a shuffle buffer
    streaming: bool
    #: rows the streamed order is shuffled within
    shuffle_buffer: int
    #: field holding the prompt: text or chat messages
    prompt_field: str
    #: dataset fields passed to rewards: a list, or {field: argument} to rename ({solution:
    #: answer})
    columns: list | dict
    #: auto: when the tokenizer has one
    chat_template: str
    #: chat template arguments: {enable_thinking: false}
    chat_template_kwargs: dict
    #: system message put before each prompt
    system_prompt: str | None
    #: epoch-wise shuffled order, fixed by train.seed
    shuffle: bool
    #: longest prompt (null: context - max_new_tokens)
    max_prompt_tokens: int | None
    #: what a longer prompt gets, checked before training
    long_prompts: str


@dataclass(frozen=True)
class SamplingSection:
    """``sampling``: Phase 1, sample: G completions per prompt."""

    #: G: completions per prompt
    group_size: int
    #: longest completion, in tokens
    max_new_tokens: int
    #: sampling temperature, log-probs use the same (null: the model's generation_config
    #: value, else 1.0)
    temperature: float | None
    #: nucleus sampling mass (null: the model's generation_config value, else 1.0)
    top_p: float | None
    #: sample among the k likeliest tokens, 0: all (null: the model's generation_config value,
    #: else 0)
    top_k: int | None
    #: keep tokens at least min_p times as likely as the likeliest (null: the model's
    #: generation_config value, else 0.0)
    min_p: float | None
    #: tokens already in the prompt or completion get positive logits divided by it, negative
    #: ones multiplied (null: the model's generation_config value, else 1.0)
    repetition_penalty: float | None
    #: strings that end a completion (the token completing one is kept)
    stop: list
    #: most completions generated at once
    generation_batch_size: int | None
    #: k: step t's completions come from the weights of k updates before (generation beside
    #: training, in its own process; 0: the synchronous loop)
    max_staleness: int
    #: inline: in the trainer's process; process: in its own process (hf generator, one
    #: trainer process); auto: process when max_staleness >= 1
    generation: str
    #: seconds the trainer and the generator process wait for each other before the run ends
    #: with an error
    generation_timeout: float


@dataclass(frozen=True)
class RewardOverlongSection:
    """``reward.overlong``: DAPO's soft overlong punishment added to the reward: 0 up to
    max_tokens - buffer tokens, then down to -factor at max_tokens (null: off)
    """

    #: L_cache: tokens before max_tokens over which the penalty grows
    buffer: int
    #: L_max (null: the completion budget, sampling.max_new_tokens)
    max_tokens: int | None
    #: the penalty at L_max
    factor: float


@dataclass(frozen=True)
class RewardSection:
    """``reward``: Phase 2, score: the reward plugin."""

    #: an installed reward plugin
    name: str
    #: checked against the plugin's own schema
    options: dict
    #: what a reward that raises or returns NaN does to the run
    failure: str
    #: seconds before a reward call counts as failed (null: wait forever)
    timeout: float | None
    #: process: the reward runs in a worker process that is killed past the timeout; inline:
    #: in the trainer's process
    isolation: str
    #: address-space limit of the reward's worker process
    memory_mb: int | None
    #: DAPO's soft overlong punishment added to the reward: 0 up to max_tokens - buffer
    #: tokens, then down to -factor at max_tokens (null: off)
    overlong: RewardOverlongSection | None


@dataclass(frozen=True)
class GroupsSection:
    """``groups``: Phase 2-3: groups with no learning signal (DAPO dynamic sampling)."""

    #: leave groups with equal rewards out of the loss
    drop_zero_std: bool
    #: extra completions per zero-std group
    resample_zero_std_max: int
    #: std-driven group sizes: draw this many completions per prompt first, then share the
    #: rest of the step's tokens (P x G completions' worth) among the prompts, the most to
    #: those whose first rewards agree (the smallest std) (null: every group G)
    adaptive_first: int | None
    #: replace groups with no signal by groups of new prompts until the step has
    #: prompts_per_step groups with signal (DAPO)
    dynamic_sampling: bool
    #: dynamic sampling: a group whose reward std (population) is at most this has no signal
    min_std: float
    #: dynamic sampling: generation rounds per step at most; then the batch is completed with
    #: groups without signal, left out of the loss
    max_rounds: int


@dataclass(frozen=True)
class BaselineSection:
    """``baseline``: Phase 3: rewards to advantages."""

    #: an installed baseline plugin
    name: str
    #: checked against the plugin's own schema
    options: dict


@dataclass(frozen=True)
class CriticSection:
    """``critic``: Phase 3: a learned value function whose estimates give the advantages (PPO);
    null: the baseline's group statistics.
    """

    #: an installed critic plugin
    name: str
    #: checked against the plugin's own schema
    options: dict


@dataclass(frozen=True)
class KlSection:
    """``kl``: Phase 3: the KL coefficient controller."""

    #: an installed kl plugin
    name: str
    #: checked against the plugin's own schema
    options: dict
    #: per-token estimator of KL(pi || pi_ref)
    estimator: str
    #: KL in the per-token loss, or subtracted from the reward
    placement: str


@dataclass(frozen=True)
class ObjectiveTisSection:
    """``objective.tis``: truncated importance sampling: the trainer recomputes the log-probs
    of the policy before the update and weights the policy term by min(pi_old / pi_sampler,
    cap) (null: off; see docs/algorithms.md)
    """

    #: C: importance weights above it are cut to it
    cap: float
    #: one weight per token, or one per completion (the product of its tokens' ratios)
    level: str


@dataclass(frozen=True)
class ObjectiveSection:
    """``objective``: Phase 4, update: the policy objective."""

    #: an installed objective plugin
    name: str
    #: checked against the plugin's own schema
    options: dict
    #: per-token losses to one number (null: the objective's own choice)
    aggregation: str | None
    #: entropy bonus weight
    entropy_coef: float
    #: policy loss on this share of each micro-batch's tokens, those of highest entropy (1:
    #: all; KL and entropy terms keep all)
    top_entropy_quantile: float
    #: completions cut by the token budget (no EOS) leave the loss; the baseline still sees
    #: their rewards
    mask_truncated_completions: bool
    #: truncated importance sampling: the trainer recomputes the log-probs of the policy
    #: before the update and weights the policy term by min(pi_old / pi_sampler, cap) (null:
    #: off; see docs/algorithms.md)
    tis: ObjectiveTisSection | None


@dataclass(frozen=True)
class OptimizerSection:
    """``optimizer``: Phase 4: the optimizer and its learning-rate schedule."""

    #: adamw; sgd (momentum below, no state); adafactor (transformers', factored moments: less
    #: memory)
    name: str
    #: peak learning rate
    lr: float
    #: weight decay (adamw, adafactor: decoupled; sgd: L2)
    weight_decay: float
    #: sgd: momentum
    momentum: float
    #: adamw: moment decay rates
    betas: list
    #: transformers.get_scheduler's schedule of that name (constant: after warm-up, if any)
    lr_schedule: str
    #: the schedule's own arguments (cosine_with_min_lr: min_lr_rate; warmup_stable_decay:
    #: num_decay_steps)
    scheduler_options: dict
    #: linear warm-up from 0, in optimizer updates
    warmup_steps: int
    #: warm-up as a share of all updates, instead of steps
    warmup_ratio: float | None
    #: clip the gradient norm (null: no clipping)
    max_grad_norm: float | None
    #: one process: AdamW's fused kernel (faster; equal to the default kernel up to rounding).
    #: false: the default kernel, which sharded runs (ddp, fsdp, deepspeed) always use
    fused: bool


@dataclass(frozen=True)
class TrainSection:
    """``train``: The loop: steps, batch and micro-batch sizes, seed."""

    #: training steps (rollouts)
    steps: int
    #: P: prompts per step, over all processes
    prompts_per_step: int
    #: mu: passes over each rollout
    inner_iterations: int
    #: optimizer updates per pass, each on prompts_per_step / mini_batches whole groups (TRL's
    #: steps_per_generation)
    mini_batches: int
    #: groups per forward/backward (whole groups)
    micro_batch_groups: int
    #: steps in a row with a skipped update that stop the run
    max_nonfinite_steps: int
    #: data order, sampling noise and initial RNG state
    seed: int


@dataclass(frozen=True)
class GeneratorSection:
    """``generator``: Phase 1: the rollout backend."""

    #: an installed generator plugin
    name: str
    #: checked against the plugin's own schema
    options: dict


@dataclass(frozen=True)
class EnvironmentSection:
    """``environment``: Phase 1 with several turns: an environment the model talks to (a tool,
    a game); null: one completion per rollout.
    """

    #: an installed environment plugin
    name: str
    #: checked against the plugin's own schema
    options: dict
    #: model turns per episode
    max_turns: int
    #: tokens after the prompt per episode, the model's and the environment's
    #: (sampling.max_new_tokens caps each turn)
    max_total_tokens: int
    #: seconds an environment call may take (null: forever); one past it is abandoned, not
    #: killed
    timeout: float | None
    #: an environment call that raises or hangs: stop the run, end the episode there (scored
    #: as it is), or end it and leave its reward out
    failure: str


@dataclass(frozen=True)
class RuntimeSection:
    """``runtime``: Where and how the numbers are computed."""

    #: auto: CUDA when available
    device: str
    #: CPU threads for torch, at most one per CPU the process may use (null: torch's default)
    threads: int | None
    #: tokens per LM-head chunk in log-prob passes
    logprob_chunk: int
    #: padding-free log-prob passes (policy, reference, old log-probs): real tokens only, with
    #: per-sequence positions; with SDPA or eager attention, rows of a prompt and some of its
    #: completions under a tree mask; with flash-attention, one varlen row; auto: packed where
    #: that counts less work than padded (always with flash-attention); same numbers as padded
    packing: str


@dataclass(frozen=True)
class DistributedSection:
    """``distributed``: How the run is spread over processes (torchrun starts them)."""

    #: auto: deepspeed when configured, ddp on several processes, else none; fsdp shards
    #: parameters, gradients and optimizer state (FSDP2)
    strategy: str
    #: fsdp: free gathered layers after forward (ZeRO-3 memory); false keeps them to backward
    #: (ZeRO-2)
    reshard_after_forward: bool
    #: fsdp: keep parameter shards and optimizer state in CPU memory
    cpu_offload: bool
    #: ddp/fsdp on GPU: compute in bfloat16, reduce gradients in float32
    mixed_precision: bool


@dataclass(frozen=True)
class OutputSection:
    """``output``: Phase 6, save: the run directory."""

    #: the run directory (new, empty, or an earlier run's with --resume or --overwrite)
    dir: str
    #: dtype of saved weights (auto: the base model's own)
    save_dtype: str
    #: write final/ (model and tokenizer) at the end
    save_model: bool
    #: upload final/ to output.hub_model_id at the end (token: HF_TOKEN or hf auth login)
    push_to_hub: bool
    #: the hub repository pushed to: user/name
    hub_model_id: str | None
    #: a repository push_to_hub creates is private
    hub_private: bool
    #: steps between checkpoints (0: none)
    checkpoint_every: int
    #: checkpoints kept
    keep_last: int
    #: steps between sample dumps (0: never)
    samples_every: int
    #: a tqdm progress bar on a terminal; in a log, a line every twentieth of the run
    progress: bool
    #: experiment trackers beside metrics.jsonl, e.g. [{name: tensorboard}, {name: wandb,
    #: options: {project: p}}] (null: tensorboard and wandb_project below)
    loggers: list | None
    #: names trackers get: ours, TRL's, or TRL's under train/ (docs/training.md);
    #: metrics.jsonl keeps ours
    metric_names: str
    #: with loggers null: auto logs to <dir>/tensorboard when installed
    tensorboard: str
    #: with loggers null: log to this Weights & Biases project
    wandb_project: str | None


@dataclass(frozen=True)
class EvalSection:
    """``eval``: Phase 5, observe: validation on held-out problems."""

    #: held-out data (file, or directory with <split>.jsonl)
    data: str | None
    #: split of the held-out data
    split: str
    #: steps between validations (0: none)
    every_n_steps: int
    #: samples per problem
    n: int
    #: problems generated as one batch (larger: fewer, fuller decode steps, more memory)
    batch_prompts: int
    #: 0: greedy
    temperature: float
    #: first N problems only (null: all)
    max_problems: int | None
    #: a completion is correct at this reward
    pass_threshold: float
    #: judge correctness on this reward dimension
    correct_dimension: str | None
    #: eval metric whose best value keeps a model in best/
    keep_best: str | None


@dataclass(frozen=True)
class HealthSection:
    """``health``: Phase 5: the health monitor."""

    #: watch the metrics and warn
    enabled: bool
    #: steps the monitor looks back
    window: int
    #: memory the run may use (null: the device's, or the container's limit); warn near it
    memory_limit_mb: float | None
    #: reward at which a completion solves its prompt (null: the reward plugin's declared
    #: best, if any)
    solved_reward: float | None
