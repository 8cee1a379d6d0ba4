"""The CPU demo: a tiny model, built offline, learns two-digit sums with GRPO.

The task is ``a+b=`` with a, b in 0..9; the ``math`` reward checks the answer. A short
supervised warm start (``WARM_STEPS`` steps, stopped long before it converges) teaches the
format and a weak prior, as SFT before RL does in real pipelines: sampled accuracy starts
near 0.2 and RL does the climb to 0.9 and above.
"""

from __future__ import annotations

import os
import random
import time

import torch

from grpo_core import config as config_mod
from grpo_core.errors import UserError
from grpo_core.tiny import addition_rows, build_model, write_jsonl

WARM_STEPS = 60


def warm_start(path: str, rows: list[dict], steps: int = WARM_STEPS, seed: int = 0) -> None:
    """A few supervised steps on ``prompt -> answer + EOS`` (batches of 32, AdamW 3e-3)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rng = random.Random(seed)
    model.train()
    for _ in range(steps):
        batch = rng.sample(rows, 32)
        texts = [(r["prompt"], r["answer"] + tok.eos_token) for r in batch]
        ids, labels = [], []
        for p, c in texts:
            pi = tok(p, add_special_tokens=False)["input_ids"]
            ci = tok(c, add_special_tokens=False)["input_ids"]
            ids.append(pi + ci)
            labels.append([-100] * len(pi) + ci)
        width = max(map(len, ids))
        x = torch.tensor([i + [tok.pad_token_id] * (width - len(i)) for i in ids])
        y = torch.tensor([la + [-100] * (width - len(la)) for la in labels])
        att = (torch.arange(width)[None, :] < torch.tensor([len(i) for i in ids])[:, None]).long()
        loss = model(input_ids=x, attention_mask=att, labels=y).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(path)


def demo_config(out: str, steps: int, baseline: str) -> dict:
    return {
        "model": {"name_or_path": os.path.join(out, "model")},
        "data": {"path": os.path.join(out, "data", "train.jsonl"), "columns": ["answer"]},
        "sampling": {"group_size": 16, "max_new_tokens": 4, "temperature": 1.0},
        "train": {"steps": steps, "prompts_per_step": 16, "micro_batch_groups": 16, "seed": 0},
        "optimizer": {"lr": 1.5e-3, "lr_schedule": "cosine", "max_grad_norm": 1.0},
        "runtime": {"device": "cpu", "threads": 2},
        "reward": {"name": "math", "options": {"strict": True}},
        "baseline": {"name": baseline},
        "kl": {"name": "fixed", "options": {"coef": 0.0}},
        "output": {"dir": os.path.join(out, "run"), "samples_every": 20},
        "health": {"window": 20},
    }


def prepare(out: str, seed: int = 0) -> None:
    """Model, data and the format warm start under ``out`` (skipped if already there)."""
    model_dir = os.path.join(out, "model")
    if os.path.exists(os.path.join(model_dir, "config.json")):
        return
    train_rows, test_rows = addition_rows(seed)
    write_jsonl(os.path.join(out, "data", "train.jsonl"), train_rows)
    write_jsonl(os.path.join(out, "data", "test.jsonl"), test_rows)
    build_model(model_dir, seed=seed)
    warm_start(model_dir, train_rows, seed=seed)


def run(
    out: str, steps: int | None = None, baseline: str = "grpo", overrides: list[str] | None = None
) -> int:
    t0 = time.time()
    print(f"building the tiny model and data under {out} ...", flush=True)
    prepare(out)
    cfg_path = os.path.join(out, "config.yaml")
    import yaml

    with open(cfg_path, "w", encoding="utf-8") as f:
        yaml.safe_dump(demo_config(out, steps or 2000, baseline), f, sort_keys=False)
    cfg = config_mod.load(cfg_path, overrides)
    from grpo_core.trainer import train

    summary = train(cfg, overwrite=True)  # the demo's run directory is the demo's own
    first, final = summary["first_reward"], summary["final_reward"]
    if first is None:
        raise UserError("demo ran no steps")
    from grpo_core.observe.metrics import read

    rewards = [r["reward"] for r in read(summary["run_dir"])]
    k = min(50, len(rewards))
    start, end = sum(rewards[:k]) / k, sum(rewards[-k:]) / k
    print(
        f"\nGRPO demo: mean reward {first:.3f} at the first RL step -> {final:.3f} at the last; "
        f"mean over the first {k} steps {start:.3f}, over the last {k} steps {end:.3f}; "
        f"{len(rewards)} steps, {time.time() - t0:.0f} s in all ({summary['seconds']:.0f} s of "
        f"RL)"
    )
    print(f"run directory: {summary['run_dir']} (config.yaml in {out})")
    return 0
