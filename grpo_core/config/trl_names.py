"""Other trainers' setting names, and where each lives here.

The single source for TRL's ``GRPOConfig``: every field is mapped (:data:`TRL`), refused with
what to use instead (:data:`MISSING`) or ignored with why (:data:`IGNORED`); a test fails
when TRL gains a field none of them holds. Users write the names they know (verl's too): an
unknown key that is one of them gets "did you mean sampling.group_size (TRL's name)?" instead
of a bare "unknown key". :func:`from_trl` reads a ``GRPOConfig`` (its changed fields) or a
flat mapping of its names into a grpo-core config; :func:`markdown` writes docs/trl.md's
tables from the same dictionaries.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from grpo_core.errors import ConfigError

#: keys of TRL's generation_kwargs (transformers' / vLLM's names) -> our sampling keys
GENERATION = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_new_tokens",
    "max_tokens": "max_new_tokens",
    "stop": "stop",
    "stop_strings": "stop",
}

#: TRL GRPOConfig (and ModelConfig / ScriptArguments) name -> (our key path, how it differs)
TRL: dict[str, tuple[str, str]] = {
    "num_generations": ("sampling.group_size", ""),
    "max_completion_length": ("sampling.max_new_tokens", ""),
    "temperature": ("sampling.temperature", ""),
    "top_p": ("sampling.top_p", ""),
    "top_k": ("sampling.top_k", ""),
    "min_p": ("sampling.min_p", ""),
    "repetition_penalty": ("sampling.repetition_penalty", ""),
    "generation_batch_size": ("sampling.generation_batch_size", "counts completions"),
    "generation_kwargs": (
        "sampling",
        "its keys: top_p, top_k, min_p, repetition_penalty, temperature, max_new_tokens, stop",
    ),
    "max_prompt_length": ("data.max_prompt_tokens", "with data.long_prompts: truncate_left"),
    "shuffle_dataset": ("data.shuffle", ""),
    "chat_template_kwargs": ("data.chat_template_kwargs", ""),
    "beta": ("kl.options.coef", "with kl.name: fixed; 0 loads no reference model"),
    "epsilon": ("objective.options.clip_low", ""),
    "epsilon_high": ("objective.options.clip_high", ""),
    "top_entropy_quantile": (
        "objective.top_entropy_quantile",
        "the threshold over each micro-batch on each process",
    ),
    "mask_truncated_completions": ("objective.mask_truncated_completions", ""),
    "delta": ("objective.options.dual_clip", "a bound on the ratio of negative advantages"),
    "loss_type": (
        "objective.aggregation",
        "grpo: seq_mean_token_mean; bnpo, dapo: token_mean; dr_grpo: seq_mean_token_sum_norm; "
        "cispo: objective cispo, clip_high = epsilon_high - 1; sapo, vespo, luspo: refused",
    ),
    "importance_sampling_level": ("objective.name", "token: grpo; sequence: gspo"),
    "scale_rewards": (
        "baseline.name",
        "true or group: grpo (eps 1e-4); batch: batch_std (eps 1e-4); false or none: dr_grpo",
    ),
    "reward_weights": (
        "reward.options.components",
        "reward: {name: weighted}, a weight per component",
    ),
    "num_iterations": ("train.inner_iterations", ""),
    "steps_per_generation": (
        "train.mini_batches",
        "steps_per_generation / gradient_accumulation_steps optimizer updates per rollout",
    ),
    "max_steps": ("train.steps", "a step is one rollout of train.prompts_per_step prompts"),
    "num_train_epochs": (
        "train.steps",
        "steps, not epochs: steps x prompts_per_step / rows is the number of epochs",
    ),
    "per_device_train_batch_size": (
        "train.prompts_per_step",
        "counts prompts over all processes, not completions per device: "
        "P = batch x processes x steps_per_generation / G",
    ),
    "gradient_accumulation_steps": (
        "train.micro_batch_groups",
        "micro-batches are whole groups (per_device_train_batch_size / G); with "
        "steps_per_generation it sets train.mini_batches",
    ),
    "seed": ("train.seed", ""),
    "learning_rate": ("optimizer.lr", ""),
    "lr_scheduler_type": ("optimizer.lr_schedule", ""),
    "lr_scheduler_kwargs": ("optimizer.scheduler_options", ""),
    "warmup_steps": ("optimizer.warmup_steps", ""),
    "warmup_ratio": ("optimizer.warmup_ratio", ""),
    "weight_decay": ("optimizer.weight_decay", ""),
    "optim": ("optimizer.name", "adamw_torch, adamw_torch_fused: adamw; sgd; adafactor"),
    "adam_beta1": ("optimizer.betas", "[beta1, beta2]"),
    "adam_beta2": ("optimizer.betas", "[beta1, beta2]"),
    "max_grad_norm": ("optimizer.max_grad_norm", ""),
    "gradient_checkpointing": ("model.gradient_checkpointing", ""),
    "activation_checkpointing": ("model.gradient_checkpointing", ""),
    "entropy_coef": ("objective.entropy_coef", "loss - coef x mean token entropy, as TRL's"),
    "num_generations_eval": ("eval.n", "completions per eval problem"),
    "use_cpu": ("runtime.device", "true: cpu"),
    "disable_tqdm": ("output.progress", "inverted"),
    "model_name_or_path": ("model.name_or_path", ""),
    "torch_dtype": ("model.dtype", ""),
    "dtype": ("model.dtype", ""),
    "bf16": ("model.dtype", "auto: bfloat16 autocast on a GPU"),
    "use_peft": ("model.lora", "a mapping of LoRA settings"),
    "lora_r": ("model.lora.r", ""),
    "lora_alpha": ("model.lora.alpha", ""),
    "lora_dropout": ("model.lora.dropout", ""),
    "lora_target_modules": ("model.lora.target_modules", ""),
    "load_in_4bit": ("model.quantization", "4bit"),
    "load_in_8bit": ("model.quantization", "8bit"),
    "trust_remote_code": ("model.trust_remote_code", ""),
    "attn_implementation": ("model.attn_implementation", ""),
    "dataset_name": ("data.path", ""),
    "dataset_config": ("data.name", ""),
    "dataset_train_split": ("data.split", ""),
    "dataset_test_split": ("eval.split", ""),
    "use_vllm": ("generator.name", "vllm"),
    "output_dir": ("output.dir", ""),
    "save_steps": ("output.checkpoint_every", ""),
    "save_total_limit": ("output.keep_last", ""),
    "push_to_hub": ("output.push_to_hub", ""),
    "hub_model_id": ("output.hub_model_id", ""),
    "hub_private_repo": ("output.hub_private", "private unless false (TRL: the hub's default)"),
    "report_to": ("output.loggers", "a list of {name: tensorboard} and the like"),
    "log_completions": ("output.samples_every", "a step interval"),
    "eval_steps": ("eval.every_n_steps", ""),
}

#: verl names with one meaning here (its dotted paths end in these)
VERL: dict[str, tuple[str, str]] = {
    "ppo_epochs": ("train.inner_iterations", ""),
    "ppo_mini_batch_size": (
        "train.mini_batches",
        "a count here: train_batch_size / ppo_mini_batch_size",
    ),
    "train_batch_size": ("train.prompts_per_step", "prompts, as in verl"),
    "max_response_length": ("sampling.max_new_tokens", ""),
    "total_training_steps": ("train.steps", ""),
    "clip_ratio_low": ("objective.options.clip_low", ""),
    "clip_ratio_high": ("objective.options.clip_high", ""),
    "clip_ratio_c": ("objective.options.dual_clip", ""),
    "kl_loss_coef": ("kl.options.coef", "with kl.placement: loss"),
    "kl_loss_type": ("kl.estimator", "kl: k1, mse: k2, low_var_kl: k3"),
    "entropy_coeff": ("objective.entropy_coef", ""),
    "loss_agg_mode": ("objective.aggregation", "the same modes, with _ for -"),
    "adv_estimator": ("baseline.name", "grpo, rloo, remax, reinforce_plus_plus: reinforce_pp"),
    "n": ("sampling.group_size", "rollout.n"),
}


#: TRL settings with no counterpart here, and what to do instead (refused when set)
MISSING: dict[str, str] = {
    "use_liger_loss": "the log-probs are computed in chunks (runtime.logprob_chunk)",
    "use_liger_kernel": "the log-probs are computed in chunks (runtime.logprob_chunk)",
    "reward_funcs": "grpo_core.train(rewards=[...]), or a function named in reward.name",
    "model_init_kwargs": "set model.dtype, model.attn_implementation, model.trust_remote_code",
    "cast_lm_head_to_fp32": "set model.dtype: float32 (the whole model in float32)",
    "multi_objective_aggregation": "reward: {name: weighted, options: {normalize: group}} "
    "normalises each function within its group (TRL then also standardises the sum over the "
    "batch)",
    "sync_ref_model": "no reference-model sync: the reference stays the initial policy",
    "ref_model_mixup_alpha": "no reference-model sync: the reference stays the initial policy",
    "ref_model_sync_steps": "no reference-model sync: the reference stays the initial policy",
    "use_adaptive_entropy": "a fixed entropy bonus: objective.entropy_coef",
    "max_tool_calling_iterations": "tools run in an environment plugin (environment.max_turns)",
    "off_policy_mask_threshold": "no off-policy sequence mask; objective.tis bounds stale tokens",
    "use_bias_correction_kl": "the KL term is not reweighted by the ratio (kl.estimator)",
    "vllm_mode": "generator: {name: vllm, options: {...}} (docs/scaling.md)",
    "vllm_server_base_url": "generator: {name: vllm, options: {...}} (docs/scaling.md)",
    "vllm_server_host": "generator: {name: vllm, options: {...}} (docs/scaling.md)",
    "vllm_server_port": "generator: {name: vllm, options: {...}} (docs/scaling.md)",
    "vllm_server_timeout": "generator: {name: vllm, options: {...}} (docs/scaling.md)",
    "vllm_group_port": "generator: {name: vllm, options: {...}} (docs/scaling.md)",
    "vllm_gpu_memory_utilization": "generator: {name: vllm, options: {...}} (docs/scaling.md)",
    "vllm_max_model_length": "generator: {name: vllm, options: {...}} (docs/scaling.md)",
    "vllm_tensor_parallel_size": "generator: {name: vllm, options: {...}} (docs/scaling.md)",
    "vllm_model_impl": "generator: {name: vllm, options: {...}} (docs/scaling.md)",
    "vllm_enable_sleep_mode": "generator: {name: vllm, options: {...}} (docs/scaling.md)",
    "vllm_structured_outputs_regex": "no constrained decoding; score the format in a reward",
    "vllm_importance_sampling_correction": "objective.tis (truncated importance sampling)",
    "vllm_importance_sampling_mode": "objective.tis (truncated importance sampling)",
    "vllm_importance_sampling_cap": "objective.tis (truncated importance sampling)",
    "vllm_importance_sampling_clip_max": "objective.tis (truncated importance sampling)",
    "vllm_importance_sampling_clip_min": "objective.tis (truncated importance sampling)",
    "optim_args": "the optimizer section (betas, weight_decay, momentum)",
    "adam_epsilon": "AdamW's eps is fixed at 1e-8 (TRL's default)",
    "optim_target_modules": "no GaLore-style optimizers: optimizer.name",
    "fp16": "model.dtype: float16 (float16 weights, not autocast)",
    "neftune_noise_alpha": "no embedding noise",
    "auto_find_batch_size": "train.micro_batch_groups sets the micro-batch",
    "hub_token": "HF_TOKEN in the environment or `hf auth login`",
    "load_best_model_at_end": "eval.keep_best keeps the best model in best/",
    "metric_for_best_model": "eval.keep_best names the eval metric",
    "fsdp": "distributed.strategy: fsdp",
    "fsdp_config": "distributed (strategy, cpu_offload, reshard_after_forward)",
    "deepspeed": "the config's deepspeed section (a dict or a JSON path)",
    "resume_from_checkpoint": "grpo_core.train(..., resume=True) or grpo train --resume",
    "torch_compile": "no torch.compile",
    "log_completions_hub_repo": "completions are written to the run's samples.jsonl",
}

_TQDM = "progress: output.progress"
_LOGS = "every step's metrics are logged (metrics.jsonl and output.loggers)"
_EVAL = "evaluation follows the eval section (eval.every_n_steps, eval.n, eval.batch_prompts)"
_SAVE = "checkpoints follow output.checkpoint_every and output.keep_last"
_LAUNCH = "processes and devices come from the launcher (torchrun) and the distributed section"
_LOADER = "prompts are read by grpo-core's own data reader, not a DataLoader"
_NEEDS = "only read with a TRL setting refused here"

#: TRL settings accepted and ignored, with why (a changed one gets a notice)
IGNORED: dict[str, str] = {
    "router_aux_loss_coef": "a mixture-of-experts router's auxiliary loss is not added",
    "disable_dropout": "the model's own dropout settings apply (TRL zeroes them by default)",
    "ds3_gather_for_generation": "ZeRO-3 generation follows the deepspeed section",
    "pad_to_multiple_of": "padding is internal",
    "cache_implementation": "the hf generator runs its own decode loop with its own cache",
    "use_transformers_continuous_batching": "the hf generator runs its own decode loop",
    "transformers_continuous_batching_config": "the hf generator runs its own decode loop",
    "use_transformers_paged": "the hf generator runs its own decode loop",
    "sapo_temperature_neg": _NEEDS + " (loss_type: sapo)",
    "sapo_temperature_pos": _NEEDS + " (loss_type: sapo)",
    "vespo_k_pos": _NEEDS + " (loss_type: vespo)",
    "vespo_lambda_pos": _NEEDS + " (loss_type: vespo)",
    "vespo_k_neg": _NEEDS + " (loss_type: vespo)",
    "vespo_lambda_neg": _NEEDS + " (loss_type: vespo)",
    "entropy_coef_min": _NEEDS + " (use_adaptive_entropy)",
    "entropy_coef_max": _NEEDS + " (use_adaptive_entropy)",
    "entropy_coef_delta": _NEEDS + " (use_adaptive_entropy)",
    "entropy_target": _NEEDS + " (use_adaptive_entropy)",
    "log_multimodal": "no images are logged",
    "num_completions_to_print": "completions are written to samples.jsonl (output.samples_every)",
    "log_unique_prompts": "completions are written to samples.jsonl (output.samples_every)",
    "average_tokens_across_devices": "the token_mean denominator is always the whole step's",
    "label_smoothing_factor": "no labels in GRPO",
    "bf16_full_eval": "evaluation runs in model.dtype",
    "fp16_full_eval": "evaluation runs in model.dtype",
    "tf32": "matmul precision is torch's default",
    "activation_checkpointing_kwargs": "checkpointing options are grpo-core's own",
    "gradient_checkpointing_kwargs": "checkpointing options are grpo-core's own",
    "torch_compile_backend": _NEEDS + " (torch_compile)",
    "torch_compile_mode": _NEEDS + " (torch_compile)",
    "liger_kernel_config": _NEEDS + " (use_liger_kernel)",
    "use_cache": "the hf generator keeps its own cache",
    "torch_empty_cache_steps": "the CUDA cache is not emptied on a schedule",
    "logging_strategy": _LOGS,
    "logging_steps": _LOGS,
    "logging_first_step": _LOGS,
    "log_on_each_node": _LOGS,
    "logging_nan_inf_filter": _LOGS,
    "include_num_input_tokens_seen": "tokens seen are always logged (tokens_seen)",
    "log_level": "messages go to stderr",
    "log_level_replica": "messages go to stderr",
    "run_name": "the run is named by output.dir",
    "project": "trackers: output.loggers",
    "trackio_space_id": "trackers: output.loggers",
    "trackio_bucket_id": "trackers: output.loggers",
    "trackio_static_space_id": "trackers: output.loggers",
    "eval_strategy": _EVAL,
    "eval_delay": _EVAL,
    "per_device_eval_batch_size": _EVAL,
    "prediction_loss_only": _EVAL,
    "eval_on_start": _EVAL,
    "eval_do_concat_batches": _EVAL,
    "eval_use_gather_object": _EVAL,
    "eval_accumulation_steps": _EVAL,
    "include_for_metrics": _EVAL,
    "batch_eval_metrics": _EVAL,
    "greater_is_better": "eval.keep_best knows each metric's direction",
    "save_only_model": _SAVE,
    "save_strategy": _SAVE,
    "save_on_each_node": _SAVE,
    "enable_jit_checkpoint": _SAVE,
    "hub_strategy": "final/ is pushed once, at the end (output.push_to_hub)",
    "hub_always_push": "final/ is pushed once, at the end (output.push_to_hub)",
    "hub_revision": "final/ is pushed to the main branch",
    "ignore_data_skip": "a resumed run continues the data where it stopped",
    "restore_callback_states_from_checkpoint": "callbacks keep no state in checkpoints",
    "full_determinism": "runs are seeded by train.seed",
    "data_seed": "the data order follows train.seed",
    "accelerator_config": _LAUNCH,
    "parallelism_config": _LAUNCH,
    "ddp_find_unused_parameters": _LAUNCH,
    "ddp_bucket_cap_mb": _LAUNCH,
    "ddp_broadcast_buffers": _LAUNCH,
    "ddp_static_graph": _LAUNCH,
    "ddp_backend": _LAUNCH,
    "ddp_timeout": _LAUNCH,
    "local_rank": _LAUNCH,
    "dataloader_drop_last": _LOADER,
    "dataloader_num_workers": _LOADER,
    "dataloader_pin_memory": _LOADER,
    "dataloader_persistent_workers": _LOADER,
    "dataloader_prefetch_factor": _LOADER,
    "dataloader_multiprocessing_context": _LOADER,
    "dataloader_in_order": _LOADER,
    "remove_unused_columns": "rewards get the fields in data.columns",
    "label_names": "no labels in GRPO",
    "train_sampling_strategy": _LOADER,
    "length_column_name": _LOADER,
    "debug": "--debug prints every frame of an error",
    "skip_memory_metrics": "peak memory is always logged",
    "do_train": "grpo_core.train trains",
    "do_eval": _EVAL,
    "do_predict": "no prediction step",
}

#: our setting -> the TRL field that means the same, for docs/trl.md's table of defaults
#: that differ (both read from the schemas when the page is made)
SAME_MEANING: dict[str, str] = {
    "sampling.max_new_tokens": "max_completion_length",
    "sampling.temperature": "temperature",
    "sampling.top_p": "top_p",
    "sampling.top_k": "top_k",
    "sampling.min_p": "min_p",
    "sampling.repetition_penalty": "repetition_penalty",
    "optimizer.lr": "learning_rate",
    "optimizer.lr_schedule": "lr_scheduler_type",
    "optimizer.weight_decay": "weight_decay",
    "optimizer.max_grad_norm": "max_grad_norm",
    "optimizer.warmup_steps": "warmup_steps",
    "model.gradient_checkpointing": "gradient_checkpointing",
    "train.inner_iterations": "num_iterations",
    "train.seed": "seed",
    "data.shuffle": "shuffle_dataset",
    "objective.mask_truncated_completions": "mask_truncated_completions",
    "objective.top_entropy_quantile": "top_entropy_quantile",
    "objective.entropy_coef": "entropy_coef",
    "sampling.group_size": "num_generations",
}

#: defaults that differ in ways the schemas cannot show (our setting, ours, TRL's)
OTHER_DEFAULTS: list[tuple[str, str, str]] = [
    ("optimizer.betas", "[0.9, 0.99]", "adam_beta1 0.9, adam_beta2 0.999"),
    ("objective.aggregation", "the objective's own (grpo: token_mean)", "loss_type dapo"),
    ("baseline.options.eps", "1e-6", "1e-4, in (r - mean) / (std + 1e-4)"),
    ("train.prompts_per_step", "counts prompts", "per_device_train_batch_size counts completions"),
    ("model dropout", "the model's own", "disable_dropout true (zeroed)"),
]


def hint(key: str) -> str | None:
    """What an unknown ``key`` probably meant when it is another trainer's name for one of
    ours (or one we do not have); None otherwise."""
    for table, whose in ((TRL, "TRL"), (VERL, "verl")):
        if key in table:
            path, note = table[key]
            return f"did you mean {path} ({whose}'s name{'; ' + note if note else ''})?"
    if key in MISSING:
        return f"a TRL setting grpo-core does not have: {MISSING[key]} (docs/trl.md)"
    if key in IGNORED:
        return f"a TRL setting with no counterpart here: {IGNORED[key]} (docs/trl.md)"
    return None


def from_trl(args: Any, rewards: list[str] | None = None) -> dict:
    """A grpo-core config from TRL's settings: a ``trl.GRPOConfig`` (only the fields set to
    something other than TRL's default count) or a flat mapping of its names (every key
    counts; ``model_name_or_path`` and ``dataset_name`` too). Each is mapped (docs/trl.md),
    refused (one line saying what to use instead; all refusals together, as a ConfigError)
    or ignored (a notice on stderr names it, with why). Keys already in our form (sections
    such as ``reward``) are kept. ``rewards``: the reward plugins TRL's ``reward_funcs``
    became, for ``reward_weights``."""
    flat = dict(args) if isinstance(args, Mapping) else changed_fields(args)
    config: dict[str, Any] = {}
    problems, ignored = [], []
    for key, value in flat.items():
        if key in _SPECIAL:
            continue
        if key == "generation_kwargs":
            problems += _generation(config, value or {})
        elif key in MISSING:
            problems.append(f"{key}: no counterpart in grpo-core; instead: {MISSING[key]}")
        elif key in IGNORED:
            ignored.append(f"{key} ({IGNORED[key]})")
        elif key in TRL:
            _put(config, TRL[key][0], _VALUES.get(key, lambda v: v)(value))
        else:
            config[key] = value
    for special in (_loss, _advantages, _batches, _steps, _betas, _weights):
        problems += special(config, flat, rewards)
    if problems:
        raise ConfigError(problems)
    if ignored:
        print(f"notice: TRL settings with no effect here: {'; '.join(ignored)}", file=sys.stderr)
    for section, name in (("kl", "fixed"), ("objective", "grpo"), ("baseline", "grpo")):
        if section in config:  # options need a plugin
            config[section].setdefault("name", name)
    return config


def changed_fields(args: Any) -> dict[str, Any]:
    """The fields of a TRL config (a dataclass) that differ from what TRL's defaults give:
    compared with a config TRL builds from the same few fields its defaults are derived from
    (batch sizes, devices, precision), which are compared with the declared defaults."""
    declared = {
        # default_factory is set where default is not (the condition below)
        f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[operator]
        for f in dataclasses.fields(args)
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    }
    base = {k: getattr(args, k) for k in _BASE if hasattr(args, k)}
    reference = type(args)(**base)
    out = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(args)
        if f.name not in base and not _same(getattr(args, f.name), getattr(reference, f.name))
    }
    derived: dict[str, Any] = {"bf16": not base.get("fp16", False)}
    derived["steps_per_generation"] = base.get("gradient_accumulation_steps")
    for key, value in base.items():
        default = derived.get(key, declared.get(key))
        if key == "steps_per_generation" and value is None:
            continue
        if not _same(value, default):
            out[key] = value
    return out


#: fields TRL derives other defaults from (passed on to the reference config as they are)
_BASE = (
    "output_dir",
    "use_cpu",
    "fp16",
    "bf16",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "num_generations",
    "steps_per_generation",
)


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # values that do not compare (arrays): treat as changed
        return False


#: TRL names read together by the special mappings below, not one by one
_SPECIAL = {
    "loss_type",
    "scale_rewards",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "steps_per_generation",
    "num_train_epochs",
    "adam_beta1",
    "adam_beta2",
    "reward_weights",
}

#: TRL's loss_type -> (objective, aggregation); others are refused with what to use
LOSS_TYPES = {
    "grpo": ("grpo", "seq_mean_token_mean"),
    "bnpo": ("grpo", "token_mean"),
    "dapo": ("grpo", "token_mean"),
    "dr_grpo": ("grpo", "seq_mean_token_sum_norm"),
    "cispo": ("cispo", "token_mean"),
}
#: TRL's scale_rewards -> our baseline (TRL's eps, 1e-4, where it has one)
SCALE_REWARDS = {
    "group": {"name": "grpo", "options": {"eps": 1e-4}},
    "batch": {"name": "batch_std", "options": {"eps": 1e-4}},
    "none": {"name": "dr_grpo"},
}
#: TRL's defaults for the names the special mappings combine
_TRL_DEFAULTS = {
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 1,
    "num_generations": 8,
    "adam_beta1": 0.9,
    "adam_beta2": 0.999,
}


def _loss(config: dict, flat: dict, rewards: list[str] | None) -> list[str]:
    """``loss_type``: our objective and aggregation (docs/trl.md: which match TRL's loss)."""
    if "loss_type" not in flat:
        return []
    kind = flat["loss_type"]
    if kind not in LOSS_TYPES:
        return [
            f"loss_type: {kind!r} has no counterpart in grpo-core; instead: one of "
            f"{sorted(LOSS_TYPES)} (objective.name grpo, gspo or cispo)"
        ]
    name, aggregation = LOSS_TYPES[kind]
    objective = config.setdefault("objective", {})
    objective["aggregation"] = aggregation
    if name == "cispo":  # TRL caps the weight at epsilon_high itself; no lower bound
        objective["name"] = "cispo"
        options = objective.setdefault("options", {})
        options.pop("clip_low", None)
        if "epsilon_high" in flat:
            options["clip_high"] = flat["epsilon_high"] - 1.0
    return []


def _advantages(config: dict, flat: dict, rewards: list[str] | None) -> list[str]:
    """``scale_rewards``: the baseline that computes TRL's advantages."""
    if "scale_rewards" not in flat:
        return []
    value = {True: "group", False: "none"}.get(flat["scale_rewards"], flat["scale_rewards"])
    if value not in SCALE_REWARDS:
        return [f"scale_rewards: {value!r}; expected group, batch, none, true or false"]
    config["baseline"] = copy.deepcopy(SCALE_REWARDS[value])
    return []


def _batches(config: dict, flat: dict, rewards: list[str] | None) -> list[str]:
    """TRL's batch sizes count completions per device; ours count prompts over all
    processes: P = per_device_train_batch_size x processes x steps_per_generation / G, cut
    into steps_per_generation / gradient_accumulation_steps optimizer updates, micro-batches
    of per_device_train_batch_size / G groups (at least one)."""
    names = (
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "steps_per_generation",
        "num_generations",
    )
    if not any(n in flat for n in names):
        return []
    value = {**_TRL_DEFAULTS, **flat}
    bs, ga, g = (
        value["per_device_train_batch_size"],
        value["gradient_accumulation_steps"],
        value["num_generations"],
    )
    spg = value.get("steps_per_generation") or ga
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if (bs * world * spg) % g or spg % ga:
        return [
            f"per_device_train_batch_size: {bs} completions x {world} process(es) x "
            f"{spg} steps per generation is not a whole number of groups of {g} cut into "
            f"{ga}-step accumulations; set train.prompts_per_step (prompts per step) and "
            f"train.mini_batches instead"
        ]
    train = config.setdefault("train", {})
    train["prompts_per_step"] = bs * world * spg // g
    train["mini_batches"] = spg // ga
    train["micro_batch_groups"] = max(1, bs // g)
    return []


def _steps(config: dict, flat: dict, rewards: list[str] | None) -> list[str]:
    """``num_train_epochs`` counts passes over the data, which only TRL's loader knows;
    ``max_steps`` (which TRL lets win) is kept."""
    if "num_train_epochs" not in flat or "max_steps" in flat:
        return []
    return [
        "num_train_epochs: set max_steps (train.steps) instead: steps x prompts_per_step / "
        "rows is the number of epochs"
    ]


def _betas(config: dict, flat: dict, rewards: list[str] | None) -> list[str]:
    """``adam_beta1`` / ``adam_beta2``: optimizer.betas, the other one TRL's default."""
    if "adam_beta1" in flat or "adam_beta2" in flat:
        value = {**_TRL_DEFAULTS, **flat}
        _put(config, "optimizer.betas", [value["adam_beta1"], value["adam_beta2"]])
    return []


def _weights(config: dict, flat: dict, rewards: list[str] | None) -> list[str]:
    """``reward_weights``: a weighted reward of the functions, one weight each."""
    weights = flat.get("reward_weights")
    if weights is None:
        return []
    if not rewards or len(rewards) != len(weights):
        return [
            f"reward_weights: {len(weights)} weights for {len(rewards or [])} reward "
            f"functions; pass as many functions in rewards=[...] (or set each component's "
            f"weight in reward: {{name: weighted}})"
        ]
    config["reward"] = {
        "name": "weighted",
        "options": {"components": [{"name": n, "weight": w} for n, w in zip(rewards, weights)]},
    }
    return []


#: how TRL's values read here, for the names mapped one to one
_OPTIMIZERS = {"adamw_torch": "adamw", "adamw_torch_fused": "adamw", "adamw_hf": "adamw"}
_VALUES: dict[str, Callable[[Any], Any]] = {
    "use_vllm": lambda v: "vllm" if v else "hf",
    "optim": lambda v: _OPTIMIZERS.get(str(v), str(v)),
    "lr_scheduler_type": str,
    "bf16": lambda v: "auto" if v else "float32",
    "use_cpu": lambda v: "cpu" if v else "auto",
    "disable_tqdm": lambda v: not v,
    "importance_sampling_level": lambda v: "gspo" if v == "sequence" else "grpo",
    "report_to": lambda v: [{"name": n} for n in ([v] if isinstance(v, str) else v) if n != "none"],
    "log_completions": lambda v: 1 if v else 0,
    "use_peft": lambda v: {} if v else None,
    "load_in_4bit": lambda v: "4bit" if v else None,
    "load_in_8bit": lambda v: "8bit" if v else None,
}


def _generation(config: dict, kwargs: dict) -> list[str]:
    """TRL's ``generation_kwargs`` into ``sampling`` keys (the schema then checks the
    values); a name with no sampling key here is a problem line naming it."""
    problems = []
    for name, value in kwargs.items():
        if name in GENERATION:
            _put(config, f"sampling.{GENERATION[name]}", value)
        else:
            problems.append(
                f"generation_kwargs.{name}: not a sampling setting here; the generator "
                f"takes {sorted(set(GENERATION.values()))}"
            )
    return problems


def _put(config: dict, path: str, value: Any) -> None:
    *parents, last = path.split(".")
    node = config
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


#: the lines of docs/trl.md between which :func:`markdown` writes
BEGIN = "<!-- generated by grpo_core.config.trl_names.markdown(); do not edit by hand -->"
END = "<!-- end of generated tables -->"


def markdown(trl_fields: dict[str, Any], trl_version: str, schema: dict) -> str:
    """docs/trl.md's tables: every TRL name's fate (mapped, refused with what to use instead,
    ignored with why), the defaults that differ, and verl's names. ``trl_fields``: TRL's
    GRPOConfig fields with their defaults; ``schema``: our config schema (for our defaults)."""
    fates = {"mapped": 0, "refused": 0, "ignored": 0}
    for name in trl_fields:
        fates["mapped" if name in TRL else "refused" if name in MISSING else "ignored"] += 1
    lines = [
        BEGIN,
        "",
        f"TRL {trl_version}'s `GRPOConfig` has {len(trl_fields)} fields: {fates['mapped']} "
        f"mapped, {fates['refused']} refused (an error saying what to use instead), "
        f"{fates['ignored']} ignored (a notice when set). Only the fields set away from "
        f"TRL's defaults count. The mapped table also holds `ModelConfig` and "
        f"`ScriptArguments` names.",
        "",
        "### Mapped",
        "",
        *_table(
            ("theirs", "grpo-core", "note"), [(f"`{k}`", f"`{p}`", n) for k, (p, n) in TRL.items()]
        ),
        "",
        "### Refused: what to use instead",
        "",
        *_table(("TRL", "instead"), [(f"`{k}`", v) for k, v in MISSING.items()]),
        "",
        "### Ignored, and why",
        "",
        *_table(("TRL", "why"), [(f"`{k}`", v) for k, v in IGNORED.items()]),
        "",
        "### Defaults that differ",
        "",
        *_table(("grpo-core", "ours", "TRL's"), _defaults(trl_fields, schema)),
        "",
        "### verl names",
        "",
        "An unknown key that is the last part of one of verl's settings, where its meaning is",
        "unambiguous:",
        "",
        *_table(
            ("theirs", "grpo-core", "note"), [(f"`{k}`", f"`{p}`", n) for k, (p, n) in VERL.items()]
        ),
        "",
        END,
    ]
    return "\n".join(lines) + "\n"


def _defaults(trl_fields: dict[str, Any], schema: dict) -> list[tuple[str, str, str]]:
    """Rows (our key, our default, TRL's) where the same setting has different defaults."""
    rows = []
    for ours, theirs in SAME_MEANING.items():
        section, key = ours.split(".")
        node = schema["properties"][section]["properties"][key]
        mine = node.get("default")
        if mine != trl_fields.get(theirs):
            why = f" ({node['description']})" if mine is None and node.get("description") else ""
            rows.append(
                (f"`{ours}`", _shown(mine) + why, f"`{theirs}` {_shown(trl_fields[theirs])}")
            )
    return rows + [(f"`{a}`", b, c) for a, b, c in OTHER_DEFAULTS]


def _shown(value: Any) -> str:
    """A default as YAML writes it."""
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)


def _table(head: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> list[str]:
    return [
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
        *("| " + " | ".join(str(c) for c in row) + " |" for row in rows),
    ]


def trl_defaults() -> tuple[dict[str, Any], str]:
    """TRL's GRPOConfig fields and their declared defaults, and TRL's version (TRL must be
    installed: it is in the dev extra)."""
    import trl

    fields = {}
    for f in dataclasses.fields(trl.GRPOConfig):
        if f.default is not dataclasses.MISSING:
            fields[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            fields[f.name] = f.default_factory()
        else:
            fields[f.name] = None
    return fields, trl.__version__


def write_docs(path: str) -> None:
    """Rewrite the generated part of docs/trl.md (``python -m grpo_core.config.trl_names``)."""
    from grpo_core.config.schema import CORE_SCHEMA

    with open(path, encoding="utf-8") as f:
        text = f.read()
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    fields, version = trl_defaults()
    body = markdown(fields, version, CORE_SCHEMA)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(head + body.rstrip("\n") + tail)
    os.replace(tmp, path)


if __name__ == "__main__":
    write_docs(sys.argv[1] if len(sys.argv) > 1 else "docs/trl.md")
