"""Loading the policy and its tokenizer; safe defaults (safetensors, no remote code)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import sys
from typing import Any

import torch

from grpo_core.config.sections import ModelLoraSection, ModelSection, SamplingSection
from grpo_core.errors import UserError
from grpo_core.rollout import MODEL_DEFAULTED, NEUTRAL
from grpo_core.store.gguf import model_dir

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def pick_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("runtime.device: 'cuda' requested but CUDA is not available")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def load_tokenizer(model: ModelSection):
    from transformers import AutoTokenizer

    path = model_dir(model)
    try:
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=model.trust_remote_code)
    except Exception as exc:  # whatever a broken directory raises, it is the input's fault
        raise UserError(
            f"model.name_or_path: cannot load a tokenizer from {path!r}: {str(exc).splitlines()[0]}"
        ) from exc
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(section: ModelSection, device: torch.device):
    """The causal LM, in float32 on CPU (and as master weights on GPU) unless a dtype is set."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    path = model_dir(section)
    dtype = DTYPES.get(section.dtype, torch.float32)
    if os.path.isdir(path) and not section.allow_unsafe_weights:
        files = os.listdir(path)
        if not any(f.endswith(".safetensors") for f in files) and any(
            f.endswith((".bin", ".pt", ".pth")) for f in files
        ):
            raise UserError(
                f"model.name_or_path: {path} has only pickle weights (.bin); "
                f"convert to safetensors or set model.allow_unsafe_weights: true"
            )
    extra: dict = {}
    attention = section.attn_implementation
    if attention:
        problem = attention_problem(attention, device.type)
        if problem:
            raise UserError(problem)
        extra["attn_implementation"] = attention
    if section.quantization:
        extra["quantization_config"] = _quantization(section.quantization, device)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path,
            dtype=dtype,
            trust_remote_code=section.trust_remote_code,
            use_safetensors=None if section.allow_unsafe_weights else True,
            **extra,
        )
    except Exception as exc:  # corrupt weights raise safetensors', torch's or OS errors
        raise UserError(
            f"model.name_or_path: cannot load a model from {path!r}: {str(exc).splitlines()[0]}"
        ) from exc
    if "quantization_config" not in extra:
        model = model.to(device)  # type: ignore[arg-type]  # transformers' wrapped .to misread
    if section.gradient_checkpointing:
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x name
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if section.lora:
        model = add_lora(model, section.lora)
    return model


def numerics(device: torch.device, dtype: str):
    """The autocast every forward of a run uses, training's and evaluation's alike: bfloat16
    autocast on a GPU when ``model.dtype`` is auto (float32 master weights), else none (the
    weights' own dtype). One definition, so a saved model is evaluated as training computed."""
    return torch.autocast(
        "cuda", dtype=torch.bfloat16, enabled=device.type == "cuda" and dtype == "auto"
    )


def attention_problem(attention: str, device_type: str) -> str | None:
    """Why ``model.attn_implementation`` cannot be used here (one line), or None:
    flash_attention_2 needs the flash-attn package and a CUDA device."""
    if attention != "flash_attention_2":
        return None
    if device_type != "cuda":
        return (
            f"model.attn_implementation: flash_attention_2 needs a CUDA device, not {device_type}"
        )
    if importlib.util.find_spec("flash_attn") is None:
        return (
            "model.attn_implementation: flash_attention_2 needs the flash-attn package "
            "(pip install flash-attn), or use sdpa"
        )
    return None


def _quantization(kind: str, device: torch.device):
    if device.type != "cuda":
        raise UserError(f"model.quantization: {kind} base weights need CUDA (bitsandbytes)")
    try:
        import bitsandbytes  # noqa: F401
        from transformers import BitsAndBytesConfig
    except ImportError as exc:
        raise UserError(
            "model.quantization: needs bitsandbytes (pip install bitsandbytes)"
        ) from exc
    if kind == "4bit":
        return BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16
        )
    return BitsAndBytesConfig(load_in_8bit=True)


def add_lora(model, lora: ModelLoraSection):
    """Wrap ``model`` with LoRA adapters; only they train, the base stays frozen."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:
        raise UserError("model.lora: needs peft (pip install 'grpo-core[lora]')") from exc
    cfg = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,  # type: ignore[arg-type]  # peft says int; it scales by alpha / r
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type="CAUSAL_LM",
    )
    try:
        return get_peft_model(model, cfg)
    except ValueError as exc:
        raise UserError(f"model.lora.target_modules: {exc}") from exc


def is_peft(model) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "get_base_model")


def saved_dtype(model: ModelSection, choice: str) -> torch.dtype:
    """The dtype weights are written in: ``auto`` keeps the base model's own (a bfloat16
    checkpoint stays bfloat16, though training keeps float32 master weights)."""
    if choice != "auto":
        return DTYPES[choice]
    from transformers import AutoConfig

    try:
        hf_config = AutoConfig.from_pretrained(
            model_dir(model), trust_remote_code=model.trust_remote_code
        )
    except (OSError, ValueError):
        return torch.float32
    dtype = getattr(hf_config, "dtype", None)
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else torch.float32


def save_model(model, tokenizer, path: str, dtype: torch.dtype, state: dict | None = None) -> None:
    """A directory ``from_pretrained`` loads: weights in ``dtype`` (each shared tensor once),
    config saying so, tokenizer (when given). A LoRA model writes its adapter. ``state``: the
    whole model's weights when the model itself holds only shards (FSDP)."""
    if is_peft(model):
        model.save_pretrained(path, **({"state_dict": state} if state is not None else {}))
    else:
        tied = _tied_names(model)
        whole = {
            k: v.detach().to(dtype) if v.is_floating_point() else v.detach()
            for k, v in (state if state is not None else model.state_dict()).items()
            if k not in tied
        }  # from_pretrained ties those again
        model.save_pretrained(path, state_dict=whole)
        config = os.path.join(path, "config.json")
        with open(config, encoding="utf-8") as f:
            written = json.load(f)
        written["dtype"] = str(dtype).removeprefix("torch.")
        # a sharded model's class is FSDP's subclass of the real one: name the real one
        written["architectures"] = [
            next(c.__name__ for c in type(model).__mro__ if not c.__name__.startswith("FSDP"))
        ]
        with open(config, "w", encoding="utf-8") as f:
            json.dump(written, f, indent=2)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)


def context_length(model) -> int | None:
    """The longest sequence the model was built for (None when its config does not say)."""
    config = model.get_base_model().config if is_peft(model) else model.config
    n = getattr(config, "max_position_embeddings", None)
    return n if isinstance(n, int) and n > 0 else None


#: the range a generation_config value must be in to be taken (as the config schema's)
_VALID = {
    "temperature": lambda v: v > 0,
    "top_p": lambda v: 0 < v <= 1,
    "top_k": lambda v: v >= 0 and v == int(v),
    "min_p": lambda v: 0 <= v <= 1,
    "repetition_penalty": lambda v: v > 0,
}


def sampling_defaults(model, sampling: SamplingSection) -> dict[str, float | int]:
    """The values of the model's generation_config for the sampling settings the config
    leaves null: only those the model sets (differing from transformers' own defaults, as
    vLLM reads them) and in range; a config value always wins."""
    gen = getattr(model, "generation_config", None)
    given = gen.to_diff_dict() if gen is not None else {}
    taken = {}
    for key in MODEL_DEFAULTED:
        value = given.get(key)
        if (
            getattr(sampling, key) is None
            and isinstance(value, (int, float))
            and not isinstance(value, bool)
            and _VALID[key](value)
        ):
            taken[key] = int(value) if key == "top_k" else float(value)
    return taken


def resolve_sampling(model, sampling: SamplingSection, announce: bool) -> SamplingSection:
    """The sampling section with its null settings filled, once the model is loaded: the
    model's generation_config value when it sets one, else the neutral value. With
    ``announce`` (rank 0), one ``note:`` line on stderr names the values taken from the model."""
    taken = sampling_defaults(model, sampling)
    filled: dict[str, Any] = {
        key: taken.get(key, NEUTRAL[key])
        for key in MODEL_DEFAULTED
        if getattr(sampling, key) is None
    }
    if taken and announce:
        said = ", ".join(f"{k}={v}" for k, v in taken.items())
        print(
            f"note: sampling settings from the model's generation_config: {said} (set them "
            f"in the config's sampling section to override)",
            file=sys.stderr,
        )
    return dataclasses.replace(sampling, **filled)


def _tied_names(model) -> set[str]:
    """Names under which an already-named parameter appears again (a tied LM head)."""
    seen: dict[int, str] = {}
    tied = set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            tied.add(name)
        seen.setdefault(id(p), name)
    return tied
