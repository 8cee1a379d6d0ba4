"""Peak memory of one GRPO step on a 4-layer model, with and without each memory switch.

    python bench/memory_switches.py

Each configuration runs in its own process on the CPU; the figure is the growth of resident
memory from just before training to the step's peak (weights, reference, gradients, AdamW
state, KV cache, logits, activations), next to ``grpo plan-memory``'s estimate for it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

SWITCHES = {
    "baseline (full fine-tune, KL 0.04)": {},
    "LoRA r=16 (q,k,v,o)": {"model": {"lora": {"r": 16}}},
    "gradient checkpointing": {"model": {"gradient_checkpointing": True}},
    "generation_batch_size 8 (of 64)": {"sampling": {"generation_batch_size": 8}},
    "KL 0 (no reference model)": {"kl": {"name": "fixed", "options": {"coef": 0.0}}},
    "all of the above": {
        "model": {"lora": {"r": 16}, "gradient_checkpointing": True},
        "sampling": {"generation_batch_size": 8},
        "kl": {"name": "fixed", "options": {"coef": 0.0}},
    },
}

CHILD = r"""
import json, sys
import torch
from grpo_core import config
from grpo_core.cli.memory import load_shape, plan
from grpo_core.observe.metrics import peak_rss_bytes, reset_peak_rss
from grpo_core.trainer import train
torch.set_num_threads(1)
cfg = config.validate(json.loads(sys.argv[1]))
base = reset_peak_rss()
train(cfg)
peak = peak_rss_bytes()
m, s, t = cfg["model"], cfg["sampling"], cfg["train"]
est = plan(load_shape(m["name_or_path"]), s["group_size"], t["prompts_per_step"], 6,
           s["max_new_tokens"], dtype="float32", lora_rank=(m["lora"] or {}).get("r", 0),
           gradient_checkpointing=m["gradient_checkpointing"],
           reference=cfg["kl"]["options"].get("coef", 0) > 0,
           generation_batch=s["generation_batch_size"],
           logprob_chunk=cfg["runtime"]["logprob_chunk"])
print(json.dumps({"measured": peak - base, "estimated": est["total"]}))
"""


def merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def main() -> int:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo_core.tiny import addition_rows, build_tokenizer, write_jsonl

    work = tempfile.mkdtemp(prefix="memsw_")
    tok = build_tokenizer()
    Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=len(tok),
            hidden_size=512,
            intermediate_size=2048,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=2,
            tie_word_embeddings=True,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
    ).save_pretrained(os.path.join(work, "m"))
    tok.save_pretrained(os.path.join(work, "m"))
    write_jsonl(os.path.join(work, "train.jsonl"), addition_rows()[0])
    base = {
        "model": {"name_or_path": os.path.join(work, "m")},
        "data": {"path": os.path.join(work, "train.jsonl"), "columns": ["answer"]},
        "sampling": {"group_size": 16, "max_new_tokens": 64},
        "train": {"steps": 1, "prompts_per_step": 4},
        "runtime": {"device": "cpu", "threads": 1},
        "reward": {"name": "format", "options": {"tags": [], "patterns": ["[0-9]"]}},
        "kl": {"name": "fixed", "options": {"coef": 0.04}},
        "output": {
            "dir": os.path.join(work, "run"),
            "progress": False,
            "save_model": False,
            "samples_every": 0,
        },
        "health": {"enabled": False},
    }
    print(
        "4-layer Qwen2-shaped model, hidden 512, float32 on CPU; 4 prompts x G=16, 64 new "
        "tokens; one step"
    )
    print(f"| {'switch':36} | measured peak (MiB) | vs baseline | plan-memory estimate (MiB) |")
    print(f"|{'-' * 38}|---|---|---|")
    first = None
    for name, change in SWITCHES.items():
        cfg = merge(base, change)
        cfg["output"]["dir"] = os.path.join(work, name.split()[0])
        out = subprocess.run(
            [sys.executable, "-c", CHILD, json.dumps(cfg)], capture_output=True, text=True
        )
        if out.returncode != 0:
            print(f"| {name:36} | failed: {out.stderr.strip().splitlines()[-1]} |")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        mb, est = r["measured"] / 2**20, r["estimated"] / 2**20
        first = first or mb
        print(f"| {name:36} | {mb:8.0f} | {mb / first:5.2f}x | {est:8.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
