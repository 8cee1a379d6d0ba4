"""How a GRPO step scales with group size G and with completion length, and what the prompt's
prefill costs as G grows.

    python bench/scaling.py [--steps 3] [--parts steps,prefill,train]

4-layer 256-wide Qwen2-shaped model on the CPU, one thread, 2 prompts of about 200 tokens.
Step time: the median wall ``time/step`` and CPU seconds (this process's, which other jobs
on the machine disturb less) after one warm-up step; per-token cost divides the CPU time by
the completion tokens generated. Prefill (CPU seconds): our generator prefills each prompt
once and shares its KV cache with the G completions; the peer in the same run is the usual
approach of repeating the prompt G times in the batch. Training pass: the policy's log-prob
forward and backward (and the no-grad reference forward) with each prompt run once and its
KV cache expanded to the G completions, against the prompt repeated G times, at several G
and prompt lengths, in CPU seconds (median of interleaved repeats); it shows where
``grpo_core.model.logprobs.SHARE_MIN_SAVED_TOKENS`` switches sharing on.
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


def step_times(
    model: str, data: str, out: str, group: int, new_tokens: int, steps: int
) -> tuple[float, float, float]:
    """Median (wall s, CPU s, CPU s per completion token) per step after a warm-up step; CPU
    time is this process's, which other jobs on the machine disturb less than wall time."""
    from grpo_core import config, phases
    from grpo_core.trainer import train

    cfg = config.validate(
        {
            "model": {"name_or_path": model},
            "data": {"path": data, "columns": ["answer"]},
            "sampling": {"group_size": group, "max_new_tokens": new_tokens},
            "train": {"steps": steps + 1, "prompts_per_step": 2, "micro_batch_groups": 1},
            "optimizer": {"lr": 1e-5},
            "runtime": {"device": "cpu", "threads": 1},
            "reward": {"name": "format", "options": {"tags": [], "patterns": ["[0-9]"]}},
            "kl": {"name": "fixed", "options": {"coef": 0.04}},
            "output": {
                "dir": out,
                "progress": False,
                "save_model": False,
                "samples_every": 0,
                "tensorboard": "off",
            },
            "health": {"enabled": False},
        }
    )
    cpu: list[float] = []
    sample, observe = phases.generate, phases.observe

    def first(*a, **kw):
        cpu.append(time.process_time())
        return sample(*a, **kw)

    def last(*a, **kw):
        try:
            return observe(*a, **kw)
        finally:
            cpu[-1] = time.process_time() - cpu[-1]

    phases.generate, phases.observe = first, last
    try:
        train(cfg)
    finally:
        phases.generate, phases.observe = sample, observe
    rows = [json.loads(x) for x in open(os.path.join(out, "metrics.jsonl"))][1:]
    c = statistics.median(cpu[1:])
    tokens = statistics.median(r["samples"] * r["completion_len"] for r in rows)
    return statistics.median(r["time/step"] for r in rows), c, c / max(tokens, 1)


@torch.no_grad()
def prefill(model_dir: str, prompt_ids: list[list[int]], group: int, reps: int = 3):
    """(ours: each prompt once, cache shared; peer: prompts repeated G times) CPU seconds."""
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
        t = time.process_time()
        gen.generate(prompt_ids, group, one)
        ours.append(time.process_time() - t)
        t = time.process_time()
        model(input_ids=repeated, logits_to_keep=1)
        peer.append(time.process_time() - t)
    return statistics.median(ours[1:]), statistics.median(peer[1:])


def train_pass(
    model_dir: str,
    group: int,
    prompt_len: int,
    new_tokens: int = 32,
    prompts: int = 2,
    reps: int = 5,
) -> dict[str, float]:
    """CPU seconds of the log-prob pass: {grad,nograd} x {shared,repeated}."""
    from transformers import AutoModelForCausalLM

    from grpo_core.model import logprobs
    from grpo_core.rollout import Rollout

    model = AutoModelForCausalLM.from_pretrained(model_dir).train()
    g = torch.Generator().manual_seed(0)
    B = prompts * group
    pmask = torch.ones(prompts, prompt_len, dtype=torch.long)
    pmask[0, : prompt_len // 4] = 0  # one left-padded prompt
    ro = Rollout(
        torch.randint(0, 256, (prompts, prompt_len), generator=g),
        pmask,
        torch.randint(0, 256, (B, new_tokens), generator=g),
        torch.ones(B, new_tokens, dtype=torch.long),
        torch.zeros(B, new_tokens),
        torch.zeros(B, dtype=torch.bool),
        torch.arange(B) // group,
    )
    saved = logprobs.SHARE_MIN_SAVED_TOKENS

    def once(share: bool, grad: bool) -> float:
        logprobs.SHARE_MIN_SAVED_TOKENS = 0 if share else 1 << 60
        t = time.process_time()
        if grad:
            lp, _ = logprobs.completion_logprobs(model, ro, 1.0, 1024, entropy=True)
            lp.sum().backward()
            model.zero_grad(set_to_none=True)
        else:
            with torch.inference_mode():
                logprobs.completion_logprobs(model, ro, 1.0, 1024)
        return time.process_time() - t

    out: dict[str, list[float]] = {}
    try:
        for i in range(reps + 1):
            for share in (True, False) if i % 2 else (False, True):
                for grad in (True, False):
                    t = once(share, grad)
                    if i:  # the first round warms up
                        key = f"{'grad' if grad else 'nograd'}_{'shared' if share else 'rep'}"
                        out.setdefault(key, []).append(t)
    finally:
        logprobs.SHARE_MIN_SAVED_TOKENS = saved
    return {k: statistics.median(v) for k, v in out.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument(
        "--parts",
        default="steps,prefill,train",
        help="which tables: steps, prefill, train (comma-separated)",
    )
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    torch.set_num_threads(1)
    from grpo_core.tiny import build_model, write_jsonl

    work = tempfile.mkdtemp(prefix="scaling_")
    model = build_model(os.path.join(work, "model"), hidden=256, layers=4, max_positions=1024)
    text = (
        "Natalia sold clips to 48 of her friends in April, and then she sold half as many "
        "clips in May. How many clips did Natalia sell altogether in April and May? "
    )
    rows = [{"prompt": (text * 2)[: 200 - i], "answer": "72"} for i in range(2)]
    data = os.path.join(work, "data.jsonl")
    write_jsonl(data, rows)
    print("4-layer x 256 model, CPU, 1 thread, 2 prompts of ~200 tokens, KL 0.04")
    if "steps" in parts:
        print(
            "\n| G | new tokens | wall s/step | CPU s/step | CPU ms per completion token |\n"
            "|---|---|---|---|---|"
        )
        for g, n in ((4, 32), (8, 32), (16, 32), (32, 32), (64, 32), (8, 16), (8, 64), (8, 128)):
            t, c, per = step_times(model, data, os.path.join(work, f"g{g}t{n}"), g, n, args.steps)
            print(f"| {g} | {n} | {t:.3f} | {c:.3f} | {per * 1000:.2f} |", flush=True)
    if "prefill" in parts:
        prefill_table(model, rows)
    if "train" in parts:
        train_table(model)
    return 0


def prefill_table(model: str, rows: list[dict]) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    ids = [tok(r["prompt"], add_special_tokens=False)["input_ids"][:198] for r in rows]
    ids = [i[: min(map(len, ids))] for i in ids]
    print(
        "\n| G | prefill, ours (CPU s) | prefill, prompt repeated G times (CPU s) | ratio |\n"
        "|---|---|---|---|"
    )
    for g in (4, 8, 16, 32, 64):
        ours, peer = prefill(model, ids, g)
        print(f"| {g} | {ours:.4f} | {peer:.4f} | {ours / peer:.2f} |", flush=True)


def train_table(model: str) -> None:
    from grpo_core.model.logprobs import SHARE_MIN_SAVED_TOKENS

    print(
        f"\nTraining pass, 2 prompts x G, 32 completion tokens, CPU s (median of 5); "
        f"sharing is on when (G - 1) x 2 x prompt tokens >= {SHARE_MIN_SAVED_TOKENS}\n\n"
        "| G | prompt tokens | tokens saved | policy fwd+bwd shared | repeated | ratio | "
        "reference fwd shared | repeated | ratio |\n|---|---|---|---|---|---|---|---|---|"
    )
    for g, lp in (
        (8, 4),
        (8, 8),
        (8, 16),
        (8, 32),
        (4, 200),
        (8, 200),
        (16, 200),
        (32, 200),
        (64, 200),
    ):
        r = train_pass(model, g, lp)
        print(
            f"| {g} | {lp} | {(g - 1) * 2 * lp} | {r['grad_shared']:.3f} | "
            f"{r['grad_rep']:.3f} | {r['grad_shared'] / r['grad_rep']:.2f} | "
            f"{r['nograd_shared']:.3f} | {r['nograd_rep']:.3f} | "
            f"{r['nograd_shared'] / r['nograd_rep']:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
