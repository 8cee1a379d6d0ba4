"""The tiny offline model, tokenizer and data that the CPU demo, the tests and the benchmarks
build: a byte-level tokenizer, a randomly initialised Qwen2-shaped causal LM, two-digit sums.
Nothing here reaches a model hub."""

from __future__ import annotations

import json
import os
import random
from typing import Any

import torch

SPECIALS = ["<|endoftext|>", "<|pad|>"]


def build_tokenizer():
    """A byte-level BPE with no merges: 256 byte tokens plus specials (no hub needed)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=SPECIALS[0], pad_token=SPECIALS[1]
    )


def build_model(
    path: str,
    hidden: int = 64,
    layers: int = 2,
    seed: int = 0,
    max_positions: int = 256,
    rope_theta: float | None = None,
) -> str:
    """Write a randomly initialised Qwen2-shaped causal LM and its tokenizer to ``path``
    (``rope_theta``: the rotary base, the model default when None)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tokenizer = build_tokenizer()
    torch.manual_seed(seed)
    rope: dict[str, Any] = {"rope_theta": rope_theta} if rope_theta is not None else {}
    cfg = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        **rope,
    )
    model = Qwen2ForCausalLM(cfg)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def addition_rows(seed: int = 0) -> tuple[list[dict], list[dict]]:
    """All 100 problems a+b (a, b in 0..9): 80 to train on, 20 held out."""
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(10)]
    random.Random(seed).shuffle(rows)
    return rows[:80], rows[80:]


def write_jsonl(path: str, rows: list[dict]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
