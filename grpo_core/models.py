"""Loading the policy and its tokenizer; safe defaults (safetensors, no remote code)."""

from __future__ import annotations

import os

import torch

from grpo_core.errors import UserError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def pick_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("train.device: 'cuda' requested but CUDA is not available")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def load_tokenizer(model_cfg: dict):
    from transformers import AutoTokenizer

    path = model_cfg["name_or_path"]
    try:
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=model_cfg["trust_remote_code"])
    except (OSError, ValueError) as exc:
        raise UserError(f"model.name_or_path: cannot load a tokenizer from {path!r}: "
                        f"{str(exc).splitlines()[0]}") from exc
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(model_cfg: dict, device: torch.device):
    """The causal LM, in float32 on CPU (and as master weights on GPU) unless a dtype is set."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    path = model_cfg["name_or_path"]
    dtype = DTYPES.get(model_cfg["dtype"], torch.float32)
    if os.path.isdir(path) and not model_cfg["allow_unsafe_weights"]:
        files = os.listdir(path)
        if not any(f.endswith(".safetensors") for f in files) and any(
                f.endswith((".bin", ".pt", ".pth")) for f in files):
            raise UserError(f"model.name_or_path: {path} has only pickle weights (.bin); "
                            f"convert to safetensors or set model.allow_unsafe_weights: true")
    extra = {}
    if model_cfg.get("quantization"):
        extra["quantization_config"] = _quantization(model_cfg["quantization"], device)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, trust_remote_code=model_cfg["trust_remote_code"],
            use_safetensors=None if model_cfg["allow_unsafe_weights"] else True, **extra)
    except (OSError, ValueError) as exc:
        raise UserError(f"model.name_or_path: cannot load a model from {path!r}: "
                        f"{str(exc).splitlines()[0]}") from exc
    if not extra:
        model = model.to(device)
    if model_cfg.get("gradient_checkpointing"):
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x name
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if model_cfg.get("lora"):
        model = add_lora(model, model_cfg["lora"])
    return model


def _quantization(kind: str, device: torch.device):
    if device.type != "cuda":
        raise UserError(f"model.quantization: {kind} base weights need CUDA (bitsandbytes)")
    try:
        import bitsandbytes  # noqa: F401
        from transformers import BitsAndBytesConfig
    except ImportError as exc:
        raise UserError("model.quantization: needs bitsandbytes (pip install bitsandbytes)") \
            from exc
    if kind == "4bit":
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                  bnb_4bit_compute_dtype=torch.bfloat16)
    return BitsAndBytesConfig(load_in_8bit=True)


def add_lora(model, lora: dict):
    """Wrap ``model`` with LoRA adapters; only they train, the base stays frozen."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:
        raise UserError("model.lora: needs peft (pip install 'grpo-core[lora]')") from exc
    cfg = LoraConfig(r=lora["r"], lora_alpha=lora["alpha"], lora_dropout=lora["dropout"],
                     target_modules=lora["target_modules"], task_type="CAUSAL_LM")
    try:
        return get_peft_model(model, cfg)
    except ValueError as exc:
        raise UserError(f"model.lora.target_modules: {exc}") from exc


def is_peft(model) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "get_base_model")
