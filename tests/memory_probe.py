"""Run by test_memory.py in its own process: peak memory of one CPU step vs the plan."""

import json
import os
import resource
import sys
import tempfile

import torch

from grpo_core import config
from grpo_core.cli.memory import load_shape, plan
from grpo_core.tiny import addition_rows, build_tokenizer, write_jsonl
from grpo_core.trainer import train


def main() -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.set_num_threads(1)
    d = tempfile.mkdtemp()
    tok = build_tokenizer()
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=len(tok), hidden_size=512, intermediate_size=2048, num_hidden_layers=6,
        num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id))
    model.save_pretrained(d + "/m")
    tok.save_pretrained(d + "/m")
    del model
    write_jsonl(d + "/train.jsonl", addition_rows()[0])
    cfg = config.validate({
        "model": {"name_or_path": d + "/m"},
        "data": {"path": d + "/train.jsonl", "columns": ["answer"]},
        "sampling": {"group_size": 8, "max_new_tokens": 8},
        "train": {"steps": 1, "prompts_per_step": 2},
        "runtime": {"device": "cpu", "threads": 1, "logprob_chunk": 64},
        "reward": {"name": "format", "options": {"tags": [], "patterns": ["[0-9]"]}},
        "kl": {"name": "fixed", "options": {"coef": 0.1}},
        "output": {"dir": d + "/run", "progress": False, "save_model": False,
                   "samples_every": 0},
        "health": {"enabled": False}})
    base = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    train(cfg)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    est = plan(load_shape(d + "/m"), 8, 2, 5, 8, dtype="float32", logprob_chunk=64)
    json.dump({"measured": peak - base, "estimated": est["total"]}, sys.stdout)


if __name__ == "__main__":
    main()
