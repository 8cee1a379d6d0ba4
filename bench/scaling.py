"""How a GRPO step scales with group size G and with completion length, and what the prompt's
prefill costs as G grows.

    python bench/scaling.py [--steps 3]

4-layer 256-wide Qwen2-shaped model on the CPU, one thread, 2 prompts of about 200 tokens.
Step time is the median ``time/step`` after one warm-up step; per-token cost divides it by
the completion tokens generated. Prefill: our generator prefills each prompt once and shares
its KV cache with the G completions; the peer in the same run is the usual approach of
repeating the prompt G times in the batch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch


def step_times(model: str, data: str, out: str, group: int, new_tokens: int,
               steps: int) -> tuple[float, float]:
    from grpo_core import config
    from grpo_core.trainer import train

    cfg = config.validate({
        "model": {"name_or_path": model}, "data": {"path": data, "columns": ["answer"]},
        "sampling": {"group_size": group, "max_new_tokens": new_tokens},
        "train": {"steps": steps + 1, "prompts_per_step": 2, "micro_batch_groups": 1},
        "optimizer": {"lr": 1e-5}, "runtime": {"device": "cpu", "threads": 1},
        "reward": {"name": "format", "options": {"tags": [], "patterns": ["[0-9]"]}},
        "kl": {"name": "fixed", "options": {"coef": 0.04}},
        "output": {"dir": out, "progress": False, "save_model": False, "samples_every": 0,
                   "tensorboard": "off"},
        "health": {"enabled": False}})
    train(cfg)
    rows = [json.loads(x) for x in open(os.path.join(out, "metrics.jsonl"))][1:]
    t = statistics.median(r["time/step"] for r in rows)
    tokens = statistics.median(r["samples"] * r["completion_len"] for r in rows)
    return t, t / max(tokens, 1)


@torch.no_grad()
def prefill(model_dir: str, prompt_ids: list[list[int]], group: int, reps: int = 3):
    """(ours: each prompt once, cache shared; peer: prompts repeated G times) seconds."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import grpo_core
    from grpo_core.rollout import SamplingParams

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    gen = grpo_core.create("generator", "hf")
    gen.setup(model, AutoTokenizer.from_pretrained(model_dir), torch.device("cpu"))
    one = SamplingParams(max_new_tokens=1)  # prefill, cache sharing, one sampled token
    ours, peer = [], []
    repeated = torch.tensor([p for p in prompt_ids for _ in range(group)])
    for _ in range(reps + 1):
        t = time.perf_counter()
        gen.generate(prompt_ids, group, one)
        ours.append(time.perf_counter() - t)
        t = time.perf_counter()
        model(input_ids=repeated, logits_to_keep=1)
        peer.append(time.perf_counter() - t)
    return statistics.median(ours[1:]), statistics.median(peer[1:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from grpo_core.cli.demo import build_model, write_jsonl

    work = tempfile.mkdtemp(prefix="scaling_")
    model = build_model(os.path.join(work, "model"), hidden=256, layers=4, max_positions=1024)
    text = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many "
            "clips in May. How many clips did Natalia sell altogether in April and May? ")
    rows = [{"prompt": (text * 2)[:200 - i], "answer": "72"} for i in range(2)]
    data = os.path.join(work, "data.jsonl")
    write_jsonl(data, rows)
    print("4-layer x 256 model, CPU, 1 thread, 2 prompts of ~200 tokens, KL 0.04")
    print("\n| G | new tokens | s/step | ms per completion token |\n|---|---|---|---|")
    for g in (4, 8, 16, 32, 64):
        t, per = step_times(model, data, os.path.join(work, f"g{g}"), g, 32, args.steps)
        print(f"| {g} | 32 | {t:.3f} | {per * 1000:.2f} |", flush=True)
    for n in (16, 32, 64, 128):
        t, per = step_times(model, data, os.path.join(work, f"t{n}"), 8, n, args.steps)
        print(f"| 8 | {n} | {t:.3f} | {per * 1000:.2f} |", flush=True)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    ids = [tok(r["prompt"], add_special_tokens=False)["input_ids"][:198] for r in rows]
    ids = [i[:min(map(len, ids))] for i in ids]
    print("\n| G | prefill, ours (s) | prefill, prompt repeated G times (s) | ratio |\n"
          "|---|---|---|---|")
    for g in (4, 8, 16, 32, 64):
        ours, peer = prefill(model, ids, g)
        print(f"| {g} | {ours:.4f} | {peer:.4f} | {ours / peer:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
