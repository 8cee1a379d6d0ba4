"""Run by test_memory.py in its own process: the peak memory of a real two-step training (the
second step holds the optimizer's moments from the first) next to ``grpo plan-memory``'s
estimate, for the same settings.

    python tests/memory_probe.py [--gradient-checkpointing] [--lora-rank R] [--new-tokens N]
                                 [--critic] [--model DIR] [--device cpu|cuda]

Without ``--model`` a randomly initialised Qwen2-shaped model (6 layers, 512 wide) is built.
On the CPU the measure is the process's peak resident size over what it held before training
(the interpreter, torch and the libraries are not the run's); on a GPU, the allocator's peak.
The CPU peak is the high-water mark of this address space (``peak_rss_bytes``), reset just
before training, so neither the model build before it nor the test worker that started this
process counts.
``--critic``: PPO's (``critic: ppo``), measured against the plan's PPO peak.
Prints one JSON object: measured and estimated bytes, and the plan's components.
"""

import argparse
import json
import sys
import tempfile

import torch

from grpo_core import config
from grpo_core.cli.memory import load_shape, plan
from grpo_core.data.prompts import render_prompt
from grpo_core.observe.metrics import peak_rss_bytes, reset_peak_rss
from grpo_core.tiny import addition_rows, build_tokenizer, write_jsonl
from grpo_core.trainer import train

G, PROMPTS = 8, 2


def tiny_model(d: str) -> str:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = build_tokenizer()
    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=len(tok),
            hidden_size=512,
            intermediate_size=2048,
            num_hidden_layers=6,
            num_attention_heads=8,
            num_key_value_heads=2,
            tie_word_embeddings=True,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
    )
    model.save_pretrained(d + "/m")
    tok.save_pretrained(d + "/m")
    return d + "/m"


def settings(d: str, model: str, args) -> dict:
    """A two-step run of G x 2 completions of up to ``--new-tokens`` (an untrained model
    rarely ends one early)."""
    write_jsonl(d + "/train.jsonl", addition_rows()[0])
    lora = {"r": args.lora_rank} if args.lora_rank else None
    return config.validate(
        {
            "model": {
                "name_or_path": model,
                "gradient_checkpointing": args.gradient_checkpointing,
                "lora": lora,
            },
            "data": {"path": d + "/train.jsonl", "columns": ["answer"]},
            "sampling": {"group_size": G, "max_new_tokens": args.new_tokens},
            "train": {"steps": 2, "prompts_per_step": PROMPTS},
            "runtime": {"device": args.device, "threads": 1, "logprob_chunk": 64},
            "reward": {"name": "format", "options": {"tags": [], "patterns": ["[0-9]"]}},
            "kl": {"name": "fixed", "options": {"coef": 0.1}},
            "output": {
                "dir": d + "/run",
                "progress": False,
                "save_model": False,
                "samples_every": 0,
            },
            "health": {"enabled": False},
            **({"critic": {"name": "ppo"}} if args.critic else {}),
        }
    )


def prompt_tokens(model: str) -> int:
    """The longest prompt as the trainer renders it (a chat template, if the model has one)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    return max(
        len(tok(render_prompt(tok, r["prompt"]), add_special_tokens=False)["input_ids"])
        for r in addition_rows()[0]
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--lora-rank", type=int, default=0)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--critic", action="store_true")
    p.add_argument("--model", default=None)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    torch.set_num_threads(1)
    d = tempfile.mkdtemp()
    model = args.model or tiny_model(d)
    cfg = settings(d, model, args)
    cuda = args.device == "cuda"
    base = torch.cuda.memory_allocated() if cuda else reset_peak_rss()
    train(cfg)
    peak = torch.cuda.max_memory_allocated() if cuda else peak_rss_bytes()
    est = plan(
        load_shape(model),
        G,
        PROMPTS,
        prompt_tokens(model),
        args.new_tokens,
        dtype="auto" if cuda else "float32",
        lora_rank=args.lora_rank,
        gradient_checkpointing=args.gradient_checkpointing,
        logprob_chunk=64,
    )
    estimated = est["ppo_total" if args.critic else "total"]
    json.dump({"measured": peak - base, "estimated": estimated, "plan": est}, sys.stdout)


if __name__ == "__main__":
    main()
