"""Other trainers' setting names, and where each lives here.

Users coming from TRL's ``GRPOConfig`` (or verl's trainer config) write the names they know;
an unknown key that is one of them gets "did you mean sampling.group_size (TRL's name)?"
instead of a bare "unknown key". :func:`from_trl` reads a whole flat TRL-style mapping into
a grpo-core config. The table is also docs/trl.md's migration table.
"""

from __future__ import annotations

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
        "grpo: seq_mean_token_mean; bnpo, dapo: token_mean; dr_grpo: seq_mean_token_sum_norm",
    ),
    "importance_sampling_level": ("objective.name", "token: grpo; sequence: gspo"),
    "scale_rewards": ("baseline.name", "true or group: grpo; false or none: dr_grpo"),
    "reward_weights": (
        "reward.options.components",
        "reward: {name: weighted}, a weight per component",
    ),
    "num_iterations": ("train.inner_iterations", ""),
    "steps_per_generation": ("train.mini_batches", "optimizer updates per pass over a rollout"),
    "max_steps": ("train.steps", "a step is one rollout of train.prompts_per_step prompts"),
    "num_train_epochs": (
        "train.steps",
        "steps, not epochs: steps x prompts_per_step / rows is the number of epochs",
    ),
    "per_device_train_batch_size": (
        "train.prompts_per_step",
        "counts prompts over all processes, not completions per "
        "device: P = batch x accumulation x devices / G",
    ),
    "gradient_accumulation_steps": (
        "train.micro_batch_groups",
        "micro-batches are whole groups; accumulation follows "
        "from prompts_per_step / micro_batch_groups",
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


#: TRL settings with no counterpart here, and what to do instead
MISSING: dict[str, str] = {
    "use_liger_loss": "the log-probs are computed in chunks (runtime.logprob_chunk)",
}


def hint(key: str) -> str | None:
    """What an unknown ``key`` probably meant when it is another trainer's name for one of
    ours (or one we do not have); None otherwise."""
    for table, whose in ((TRL, "TRL"), (VERL, "verl")):
        if key in table:
            path, note = table[key]
            return f"did you mean {path} ({whose}'s name{'; ' + note if note else ''})?"
    if key in MISSING:
        return f"a TRL setting grpo-core does not have: {MISSING[key]} (docs/trl.md)"
    return None


def from_trl(flat: dict[str, Any]) -> dict:
    """A grpo-core config from a flat TRL-style mapping (``GRPOConfig`` names plus
    ``model_name_or_path`` and ``dataset_name``). Names that map to one of our keys one to
    one are moved there; the rest (``loss_type``, ``scale_rewards``, batch sizes, ...) need a
    decision and are refused together, each with its place here. Keys already in our form
    (sections such as ``reward``) are kept."""
    config: dict[str, Any] = {}
    problems = []
    for key, value in flat.items():
        if key == "generation_kwargs":
            problems += _generation(config, value or {})
        elif key not in TRL:
            config[key] = value
        elif TRL[key][1] and key not in _DIRECT:
            problems.append(f"{key}: set {TRL[key][0]} instead ({TRL[key][1]})")
        else:
            _put(config, TRL[key][0], _VALUES.get(key, lambda v: v)(value))
    if problems:
        raise ConfigError(problems)
    for section, name in (("kl", "fixed"), ("objective", "grpo")):  # options need a plugin
        if section in config:
            config[section].setdefault("name", name)
    return config


#: TRL names with a note that still map one to one, and how their values read here
_DIRECT = {
    "generation_batch_size",
    "max_prompt_length",
    "beta",
    "use_vllm",
    "max_steps",
    "steps_per_generation",
    "optim",
    "top_entropy_quantile",
    "hub_private_repo",
}
_OPTIMIZERS = {"adamw_torch": "adamw", "adamw_torch_fused": "adamw", "adamw_hf": "adamw"}
_VALUES = {"use_vllm": lambda v: "vllm" if v else "hf", "optim": lambda v: _OPTIMIZERS.get(v, v)}


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
