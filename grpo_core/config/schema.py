"""The run configuration's JSON Schema: one section per phase of a step, plugins by name.

A value whose schema carries ``"x-plugin": KIND`` is a plugin reference ``{name, options}``
(plus any keys the core reads beside them, such as ``kl.placement``); its options are checked
against that plugin's own schema (see grpo_core.config).
"""

from __future__ import annotations

from typing import Any

from grpo_core.rollout import MODEL_SETTINGS


def plugin_ref(
    kind: str, default: str | None = None, description: str = "", extra: dict | None = None
) -> dict:
    """Schema of a reference to a plugin of ``kind``: ``{name, options}`` and ``extra`` keys
    that the core reads itself."""
    ref: dict[str, Any] = {
        "type": "object",
        "x-plugin": kind,
        "description": description or f"a {kind} plugin, by name, with its options",
        "properties": {
            "name": {"type": "string", "description": f"an installed {kind} plugin"},
            "options": {
                "type": "object",
                "default": {},
                "description": "checked against the plugin's own schema",
            },
            **(extra or {}),
        },
        "required": ["name"],
        "additionalProperties": False,
    }
    if default is not None:
        ref["default"] = {"name": default}
    return ref


def _obj(props: dict, required: tuple = (), description: str = "") -> dict:
    out = {
        "type": "object",
        "properties": props,
        "required": list(required),
        "additionalProperties": False,
        "default": {},
    }
    return {**out, "description": description} if description else out


NUM = {"type": "number"}
POS_INT = {"type": "integer", "minimum": 1}

MODEL = _obj(
    {
        "name_or_path": {"type": "string", "description": "hub id or local directory"},
        "gguf_file": {
            "type": ["string", "null"],
            "default": None,
            "description": "GGUF file (in "
            "name_or_path, or a path): model and tokenizer, float, converted once",
        },
        "dtype": {
            "enum": ["auto", "float32", "bfloat16", "float16"],
            "default": "auto",
            "description": "auto: float32 weights, bf16 autocast on GPU",
        },
        "trust_remote_code": {
            "type": "boolean",
            "default": False,
            "description": "run the model repository's own Python code",
        },
        "allow_unsafe_weights": {
            "type": "boolean",
            "default": False,
            "description": "allow pickle (.bin) weights",
        },
        "gradient_checkpointing": {
            "type": "boolean",
            "default": False,
            "description": "recompute activations in backward (less memory)",
        },
        "lora": {
            "type": ["object", "null"],
            "default": None,
            "description": "LoRA adapters through peft; the reference is the base model",
            "additionalProperties": False,
            "properties": {
                "r": {**POS_INT, "default": 16, "description": "adapter rank"},
                "alpha": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "default": 32,
                    "description": "adapter scale numerator (scale alpha / r)",
                },
                "dropout": {
                    "type": "number",
                    "minimum": 0,
                    "maximum": 1,
                    "default": 0.0,
                    "description": "dropout on the adapter input",
                },
                "target_modules": {
                    "type": ["array", "string"],
                    "items": {"type": "string"},
                    "default": ["q_proj", "k_proj", "v_proj", "o_proj"],
                    "description": "module names (or a regex) given adapters",
                },
                "save_merged": {
                    "type": "boolean",
                    "default": False,
                    "description": "also write merged weights at the end",
                },
            },
        },
        "quantization": {
            "enum": [None, "4bit", "8bit"],
            "default": None,
            "description": "QLoRA base weights (needs bitsandbytes and CUDA)",
        },
        "attn_implementation": {
            "enum": [None, "eager", "sdpa", "flash_attention_2"],
            "default": None,
            "description": "attention kernel from_pretrained gets (null: "
            "transformers' choice); flash_attention_2 needs flash-attn and CUDA",
        },
        "reference_device": {
            "enum": ["same", "cpu"],
            "default": "same",
            "description": "where the frozen reference model lives",
        },
    },
    required=("name_or_path",),
    description="The policy to train.",
)

DATA = _obj(
    {
        "path": {
            "type": "string",
            "description": "JSONL/JSON/parquet file; a directory of <split> files or one "
            "written by datasets' save_to_disk; a datasets hub id or local "
            "dataset directory",
        },
        "name": {
            "type": ["string", "null"],
            "default": None,
            "description": "the dataset's configuration name (openai/gsm8k: main)",
        },
        "data_files": {
            "type": ["string", "array", "object", "null"],
            "default": None,
            "description": "files for datasets to build from (path: json, csv, ... "
            "or a dataset directory), as load_dataset takes them",
        },
        "split": {
            "type": "string",
            "default": "train",
            "description": "split, optionally sliced: train, train[:1000], train[:10%]",
        },
        "streaming": {
            "type": "boolean",
            "default": False,
            "description": "read rows as needed, never all at once (needs datasets); "
            "order from a shuffle buffer",
        },
        "shuffle_buffer": {
            **POS_INT,
            "default": 10000,
            "description": "rows the streamed order is shuffled within",
        },
        "prompt_field": {
            "type": "string",
            "default": "prompt",
            "description": "field holding the prompt: text or chat messages",
        },
        "columns": {
            "type": ["array", "object"],
            "items": {"type": "string"},
            "additionalProperties": {"type": "string"},
            "default": [],
            "description": "dataset fields passed to rewards: a list, or {field: "
            "argument} to rename ({solution: answer})",
        },
        "chat_template": {
            "enum": ["auto", "always", "never"],
            "default": "auto",
            "description": "auto: when the tokenizer has one",
        },
        "chat_template_kwargs": {
            "type": "object",
            "default": {},
            "description": "chat template arguments: {enable_thinking: false}",
        },
        "system_prompt": {
            "type": ["string", "null"],
            "default": None,
            "description": "system message put before each prompt",
        },
        "shuffle": {
            "type": "boolean",
            "default": True,
            "description": "epoch-wise shuffled order, fixed by train.seed",
        },
        "max_prompt_tokens": {
            "type": ["integer", "null"],
            "minimum": 1,
            "default": None,
            "description": "longest prompt (null: context - max_new_tokens)",
        },
        "long_prompts": {
            "enum": ["drop", "truncate_left", "error"],
            "default": "drop",
            "description": "what a longer prompt gets, checked before training",
        },
    },
    required=("path",),
    description="The prompts, and the fields rewards read.",
)

SAMPLING = _obj(
    {
        "group_size": {**POS_INT, "default": 8, "description": "G: completions per prompt"},
        "max_new_tokens": {
            **POS_INT,
            "default": 64,
            "description": "longest completion, in tokens",
        },
        **MODEL_SETTINGS,
        "stop": {
            "type": "array",
            "items": {"type": "string", "minLength": 1},
            "default": [],
            "description": "strings that end a completion (the token completing one is kept)",
        },
        "generation_batch_size": {
            "type": ["integer", "null"],
            "minimum": 1,
            "default": None,
            "description": "most completions generated at once",
        },
        "max_staleness": {
            "type": "integer",
            "minimum": 0,
            "default": 0,
            "description": "k: step t's completions come from the weights of k updates "
            "before (generation beside training, in its own process; 0: the synchronous loop)",
        },
        "generation": {
            "enum": ["auto", "inline", "process"],
            "default": "auto",
            "description": "inline: in the trainer's process; process: in its own process "
            "(hf generator, one trainer process); auto: process when max_staleness >= 1",
        },
        "generation_timeout": {
            "type": "number",
            "exclusiveMinimum": 0,
            "default": 600,
            "description": "seconds the trainer and the generator process wait for each "
            "other before the run ends with an error",
        },
    },
    description="Phase 1, sample: G completions per prompt.",
)

REWARD = plugin_ref(
    "reward",
    description="Phase 2, score: the reward plugin.",
    extra={
        "failure": {
            "enum": ["raise", "zero", "drop_group"],
            "default": "raise",
            "description": "what a reward that raises or returns NaN does to the run",
        },
        "timeout": {
            "type": ["number", "null"],
            "exclusiveMinimum": 0,
            "default": 600,
            "description": "seconds before a reward call counts as failed (null: wait forever)",
        },
        "isolation": {
            "enum": ["process", "inline"],
            "default": "process",
            "description": "process: the reward runs in a worker process that is "
            "killed past the timeout; inline: in the trainer's process",
        },
        "memory_mb": {
            "type": ["integer", "null"],
            "minimum": 64,
            "default": None,
            "description": "address-space limit of the reward's worker process",
        },
        "overlong": {
            "type": ["object", "null"],
            "default": None,
            "additionalProperties": False,
            "description": "DAPO's soft overlong punishment added to the reward: 0 up "
            "to max_tokens - buffer tokens, then down to -factor at "
            "max_tokens (null: off)",
            "required": ["buffer"],
            "properties": {
                "buffer": {
                    **POS_INT,
                    "description": "L_cache: tokens before max_tokens over which the penalty grows",
                },
                "max_tokens": {
                    "type": ["integer", "null"],
                    "minimum": 1,
                    "default": None,
                    "description": "L_max (null: the completion budget, sampling.max_new_tokens)",
                },
                "factor": {
                    "type": "number",
                    "minimum": 0,
                    "default": 1.0,
                    "description": "the penalty at L_max",
                },
            },
        },
    },
)

GROUPS = _obj(
    {
        "drop_zero_std": {
            "type": "boolean",
            "default": False,
            "description": "leave groups with equal rewards out of the loss",
        },
        "resample_zero_std_max": {
            "type": "integer",
            "minimum": 0,
            "default": 0,
            "description": "extra completions per zero-std group",
        },
        "adaptive_first": {
            "type": ["integer", "null"],
            "minimum": 1,
            "default": None,
            "description": "std-driven group sizes: draw this many completions per "
            "prompt first, then share the rest of the step's tokens (P x G "
            "completions' worth) among the prompts, the most to those whose "
            "first rewards agree (the smallest std) (null: every group G)",
        },
        "dynamic_sampling": {
            "type": "boolean",
            "default": False,
            "description": "replace groups with no signal by groups of new "
            "prompts until the step has prompts_per_step groups "
            "with signal (DAPO)",
        },
        "min_std": {
            "type": "number",
            "minimum": 0,
            "default": 0.0,
            "description": "dynamic sampling: a group whose reward std (population) is "
            "at most this has no signal",
        },
        "max_rounds": {
            **POS_INT,
            "default": 4,
            "description": "dynamic sampling: generation rounds per step at most; "
            "then the batch is completed with groups without signal, "
            "left out of the loss",
        },
    },
    description="Phase 2-3: groups with no learning signal (DAPO dynamic sampling).",
)

KL = plugin_ref(
    "kl",
    default="fixed",
    description="Phase 3: the KL coefficient controller.",
    extra={
        "estimator": {
            "enum": ["k1", "k2", "k3"],
            "default": "k3",
            "description": "per-token estimator of KL(pi || pi_ref)",
        },
        "placement": {
            "enum": ["loss", "reward"],
            "default": "loss",
            "description": "KL in the per-token loss, or subtracted from the reward",
        },
    },
)

OBJECTIVE = plugin_ref(
    "objective",
    default="grpo",
    description="Phase 4, update: the policy objective.",
    extra={
        "aggregation": {
            "enum": [None, "token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"],
            "default": None,
            "description": "per-token losses to one number (null: the objective's own choice)",
        },
        "entropy_coef": {"type": "number", "default": 0.0, "description": "entropy bonus weight"},
        "top_entropy_quantile": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": 1,
            "default": 1.0,
            "description": "policy loss on this share of each micro-batch's tokens, "
            "those of highest entropy (1: all; KL and entropy terms keep all)",
        },
        "mask_truncated_completions": {
            "type": "boolean",
            "default": False,
            "description": "completions cut by the token budget (no "
            "EOS) leave the loss; the baseline still "
            "sees their rewards",
        },
        "tis": {
            "type": ["object", "null"],
            "default": None,
            "properties": {
                "cap": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "default": 2.0,
                    "description": "C: importance weights above it are cut to it",
                },
                "level": {
                    "enum": ["token", "sequence"],
                    "default": "token",
                    "description": "one weight per token, or one per completion "
                    "(the product of its tokens' ratios)",
                },
            },
            "additionalProperties": False,
            "description": "truncated importance sampling: the trainer recomputes the "
            "log-probs of the policy before the update and weights the policy term by "
            "min(pi_old / pi_sampler, cap) (null: off; see docs/algorithms.md)",
        },
    },
)

#: optimizer.lr_schedule: names transformers.get_scheduler knows (see grpo_core.engine.schedules)
SCHEDULES = (
    "constant",
    "linear",
    "cosine",
    "cosine_with_min_lr",
    "cosine_with_restarts",
    "constant_with_warmup",
    "warmup_stable_decay",
    "polynomial",
    "inverse_sqrt",
)

OPTIMIZER = _obj(
    {
        "name": {
            "enum": ["adamw", "sgd", "adafactor"],
            "default": "adamw",
            "description": "adamw; sgd (momentum below, no state); adafactor "
            "(transformers', factored moments: less memory)",
        },
        "lr": {
            "type": "number",
            "exclusiveMinimum": 0,
            "default": 1e-6,
            "description": "peak learning rate",
        },
        "weight_decay": {
            "type": "number",
            "minimum": 0,
            "default": 0.0,
            "description": "weight decay (adamw, adafactor: decoupled; sgd: L2)",
        },
        "momentum": {
            "type": "number",
            "minimum": 0,
            "maximum": 1,
            "default": 0.0,
            "description": "sgd: momentum",
        },
        "betas": {
            "type": "array",
            "items": NUM,
            "minItems": 2,
            "maxItems": 2,
            "default": [0.9, 0.99],
            "description": "adamw: moment decay rates",
        },
        "lr_schedule": {
            "enum": list(SCHEDULES),
            "default": "constant",
            "description": "transformers.get_scheduler's schedule of that name "
            "(constant: after warm-up, if any)",
        },
        "scheduler_options": {
            "type": "object",
            "default": {},
            "description": "the schedule's own arguments (cosine_with_min_lr: "
            "min_lr_rate; warmup_stable_decay: num_decay_steps)",
        },
        "warmup_steps": {
            "type": "integer",
            "minimum": 0,
            "default": 0,
            "description": "linear warm-up from 0, in optimizer updates",
        },
        "warmup_ratio": {
            "type": ["number", "null"],
            "minimum": 0,
            "maximum": 1,
            "default": None,
            "description": "warm-up as a share of all updates, instead of steps",
        },
        "max_grad_norm": {
            "type": ["number", "null"],
            "exclusiveMinimum": 0,
            "default": 1.0,
            "description": "clip the gradient norm (null: no clipping)",
        },
        "fused": {
            "type": "boolean",
            "default": True,
            "description": "one process: AdamW's fused kernel (faster; equal to the default "
            "kernel up to rounding). false: the default kernel, which sharded "
            "runs (ddp, fsdp, deepspeed) always use",
        },
    },
    description="Phase 4: the optimizer and its learning-rate schedule.",
)

TRAIN = _obj(
    {
        "steps": {**POS_INT, "default": 100, "description": "training steps (rollouts)"},
        "prompts_per_step": {
            **POS_INT,
            "default": 8,
            "description": "P: prompts per step, over all processes",
        },
        "inner_iterations": {
            **POS_INT,
            "default": 1,
            "description": "mu: passes over each rollout",
        },
        "mini_batches": {
            **POS_INT,
            "default": 1,
            "description": "optimizer updates per pass, each on prompts_per_step / "
            "mini_batches whole groups (TRL's steps_per_generation)",
        },
        "micro_batch_groups": {
            **POS_INT,
            "default": 8,
            "description": "groups per forward/backward (whole groups)",
        },
        "max_nonfinite_steps": {
            **POS_INT,
            "default": 3,
            "description": "steps in a row with a skipped update that stop the run",
        },
        "seed": {
            "type": "integer",
            "minimum": -(2**63),
            "maximum": 2**63 - 1,  # what torch's generators take (int64)
            "default": 0,
            "description": "data order, sampling noise and initial RNG state",
        },
    },
    description="The loop: steps, batch and micro-batch sizes, seed.",
)

ENVIRONMENT = {
    **plugin_ref(
        "environment",
        description="Phase 1 with several turns: an environment the model talks "
        "to (a tool, a game); null: one completion per rollout.",
        extra={
            "max_turns": {**POS_INT, "default": 4, "description": "model turns per episode"},
            "max_total_tokens": {
                **POS_INT,
                "default": 1024,
                "description": "tokens after the prompt per episode, the model's "
                "and the environment's (sampling.max_new_tokens caps "
                "each turn)",
            },
            "timeout": {
                "type": ["number", "null"],
                "exclusiveMinimum": 0,
                "default": 30,
                "description": "seconds an environment call may take (null: forever); "
                "one past it is abandoned, not killed",
            },
            "failure": {
                "enum": ["raise", "end", "drop"],
                "default": "raise",
                "description": "an environment call that raises or hangs: stop the run, "
                "end the episode there (scored as it is), or end it and "
                "leave its reward out",
            },
        },
    ),
    "type": ["object", "null"],
    "default": None,
}

RUNTIME = _obj(
    {
        "device": {
            "enum": ["auto", "cpu", "cuda"],
            "default": "auto",
            "description": "auto: CUDA when available",
        },
        "threads": {
            "type": ["integer", "null"],
            "minimum": 1,
            "default": None,
            "description": "CPU threads for torch, at most one per CPU the process may use "
            "(null: torch's default)",
        },
        "logprob_chunk": {
            **POS_INT,
            "default": 1024,
            "description": "tokens per LM-head chunk in log-prob passes",
        },
        "packing": {
            "enum": ["off", "on", "auto"],
            "default": "off",
            "description": "padding-free log-prob passes (policy, reference, old "
            "log-probs): real tokens only, with per-sequence positions; with SDPA or "
            "eager attention, rows of a prompt and some of its completions under a tree "
            "mask; with flash-attention, one varlen row; auto: packed where that counts "
            "less work than padded (always with flash-attention); same numbers as padded",
        },
    },
    description="Where and how the numbers are computed.",
)

DISTRIBUTED = _obj(
    {
        "strategy": {
            "enum": ["auto", "none", "ddp", "fsdp", "deepspeed"],
            "default": "auto",
            "description": "auto: deepspeed when configured, ddp on several processes, "
            "else none; fsdp shards parameters, gradients and optimizer "
            "state (FSDP2)",
        },
        "reshard_after_forward": {
            "type": "boolean",
            "default": True,
            "description": "fsdp: free gathered layers after forward (ZeRO-3 "
            "memory); false keeps them to backward (ZeRO-2)",
        },
        "cpu_offload": {
            "type": "boolean",
            "default": False,
            "description": "fsdp: keep parameter shards and optimizer state in CPU memory",
        },
        "mixed_precision": {
            "type": "boolean",
            "default": True,
            "description": "ddp/fsdp on GPU: compute in bfloat16, reduce gradients in float32",
        },
    },
    description="How the run is spread over processes (torchrun starts them).",
)

OUTPUT = _obj(
    {
        "dir": {
            "type": "string",
            "minLength": 1,
            "default": "runs/latest",
            "description": "the run directory (new, empty, or an earlier run's with --resume "
            "or --overwrite)",
        },
        "save_dtype": {
            "enum": ["auto", "float32", "bfloat16", "float16"],
            "default": "auto",
            "description": "dtype of saved weights (auto: the base model's own)",
        },
        "save_model": {
            "type": "boolean",
            "default": True,
            "description": "write final/ (model and tokenizer) at the end",
        },
        "push_to_hub": {
            "type": "boolean",
            "default": False,
            "description": "upload final/ to output.hub_model_id at the end (token: HF_TOKEN "
            "or hf auth login)",
        },
        "hub_model_id": {
            "type": ["string", "null"],
            "pattern": "^([A-Za-z0-9][A-Za-z0-9_.-]*/)?[A-Za-z0-9][A-Za-z0-9_.-]*$",
            "default": None,
            "description": "the hub repository pushed to: user/name",
        },
        "hub_private": {
            "type": "boolean",
            "default": True,
            "description": "a repository push_to_hub creates is private",
        },
        "checkpoint_every": {
            "type": "integer",
            "minimum": 0,
            "default": 0,
            "description": "steps between checkpoints (0: none)",
        },
        "keep_last": {**POS_INT, "default": 2, "description": "checkpoints kept"},
        "samples_every": {
            "type": "integer",
            "minimum": 0,
            "default": 10,
            "description": "steps between sample dumps (0: never)",
        },
        "progress": {
            "type": "boolean",
            "default": True,
            "description": "a tqdm progress bar on a terminal; in a log, a line every "
            "twentieth of the run",
        },
        "loggers": {
            "type": ["array", "null"],
            "default": None,
            "items": plugin_ref("logger", description="a logger plugin by name"),
            "description": "experiment trackers beside metrics.jsonl, e.g. [{name: "
            "tensorboard}, {name: wandb, options: {project: p}}] (null: "
            "tensorboard and wandb_project below)",
        },
        "metric_names": {
            "enum": ["native", "trl", "trl_train"],
            "default": "native",
            "description": "names trackers get: ours, TRL's, or TRL's under train/ "
            "(docs/training.md); metrics.jsonl keeps ours",
        },
        "tensorboard": {
            "enum": ["auto", "off"],
            "default": "auto",
            "description": "with loggers null: auto logs to <dir>/tensorboard when installed",
        },
        "wandb_project": {
            "type": ["string", "null"],
            "default": None,
            "description": "with loggers null: log to this Weights & Biases project",
        },
    },
    description="Phase 6, save: the run directory.",
)

EVAL = _obj(
    {
        "data": {
            "type": ["string", "null"],
            "default": None,
            "description": "held-out data (file, or directory with <split>.jsonl)",
        },
        "split": {"type": "string", "default": "test", "description": "split of the held-out data"},
        "every_n_steps": {
            "type": "integer",
            "minimum": 0,
            "default": 0,
            "description": "steps between validations (0: none)",
        },
        "n": {**POS_INT, "default": 1, "description": "samples per problem"},
        "batch_prompts": {
            **POS_INT,
            "default": 16,
            "description": "problems generated as one batch (larger: fewer, fuller decode "
            "steps, more memory)",
        },
        "temperature": {"type": "number", "minimum": 0, "default": 0.0, "description": "0: greedy"},
        "max_problems": {
            "type": ["integer", "null"],
            "minimum": 1,
            "default": None,
            "description": "first N problems only (null: all)",
        },
        "pass_threshold": {
            "type": "number",
            "default": 1.0,
            "description": "a completion is correct at this reward",
        },
        "correct_dimension": {
            "type": ["string", "null"],
            "default": None,
            "description": "judge correctness on this reward dimension",
        },
        "keep_best": {
            "type": ["string", "null"],
            "default": None,
            "description": "eval metric whose best value keeps a model in best/",
        },
    },
    description="Phase 5, observe: validation on held-out problems.",
)

HEALTH = _obj(
    {
        "enabled": {
            "type": "boolean",
            "default": True,
            "description": "watch the metrics and warn",
        },
        "window": {**POS_INT, "default": 10, "description": "steps the monitor looks back"},
        "memory_limit_mb": {
            "type": ["number", "null"],
            "exclusiveMinimum": 0,
            "default": None,
            "description": "memory the run may use (null: the device's, or the "
            "container's limit); warn near it",
        },
        "solved_reward": {
            "type": ["number", "null"],
            "default": None,
            "description": "reward at which a completion solves its prompt (null: "
            "the reward plugin's declared best, if any)",
        },
    },
    description="Phase 5: the health monitor.",
)

CORE_SCHEMA: dict = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "grpo-core run configuration",
    **_obj(
        {
            "model": MODEL,
            "data": DATA,
            "sampling": SAMPLING,
            "reward": REWARD,
            "groups": GROUPS,
            "baseline": plugin_ref(
                "baseline", default="grpo", description="Phase 3: rewards to advantages."
            ),
            "critic": {
                **plugin_ref(
                    "critic",
                    description="Phase 3: a learned value function whose estimates give "
                    "the advantages (PPO); null: the baseline's group statistics.",
                ),
                "type": ["object", "null"],
                "default": None,
            },
            "kl": KL,
            "objective": OBJECTIVE,
            "optimizer": OPTIMIZER,
            "train": TRAIN,
            "generator": plugin_ref(
                "generator", default="hf", description="Phase 1: the rollout backend."
            ),
            "environment": ENVIRONMENT,
            "runtime": RUNTIME,
            "distributed": DISTRIBUTED,
            "output": OUTPUT,
            "eval": EVAL,
            "health": HEALTH,
            "callbacks": {
                "type": "array",
                "items": plugin_ref("callback", description="a callback plugin by name"),
                "default": [],
                "description": "callback plugins run at step boundaries (main process), in "
                "this order: [{name: my_callback, options: {...}}]",
            },
            "deepspeed": {
                "type": ["object", "string", "null"],
                "default": None,
                "description": "DeepSpeed config (ZeRO stage 0 to 3) or a path to its "
                "JSON; see docs/scaling.md",
            },
        },
        required=("model", "data", "reward"),
    ),
}
