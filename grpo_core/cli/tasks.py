"""CPU tasks for baseline comparisons: the demo's one-digit sums and a harder one.

One toy task can decide a ranking by accident, so ``docs/baselines.md`` runs every comparison
on two. ``sums2x1`` asks ``a+b=`` with a in 0..99 and b in 0..9: 1,000 problems (800 to
train on, 10x the demo's), answers of one to three digits, a carry in 45% of them; after its
warm start the sampled accuracy is about 0.1 (the demo's: 0.2), so most groups start with
all-zero rewards, where baselines differ most. Two-digit plus two-digit sums were tried
first: with the demo's 2-layer, 64-wide model and 300 warm-start steps, 150 GRPO steps
stayed at 0.02. Both tasks reuse the demo's model builder and supervised warm start
(grpo_core/cli/demo.py).

    python -m grpo_core.cli.tasks sums2x1 /tmp/study/sums2x1 --steps 400

writes the model, the data and ``config.yaml`` under the directory (skipping what exists).
"""

from __future__ import annotations

import argparse
import os
import random
import sys

import yaml

from grpo_core import tiny
from grpo_core.cli import demo
from grpo_core.config.file import with_values

#: task -> (largest a, largest b, training rows, held-out rows, warm-start steps)
TASKS: dict[str, tuple[int, int, int, int, int]] = {
    "demo": (9, 9, 80, 20, demo.WARM_STEPS),
    "sums2x1": (99, 9, 800, 200, 400),
}


def sum_rows(
    largest_a: int, largest_b: int, n_train: int, n_test: int, seed: int = 0
) -> tuple[list[dict], list[dict]]:
    """``a+b=`` problems, a in 0..largest_a and b in 0..largest_b, without repeats:
    (train, held out)."""
    pairs = [(a, b) for a in range(largest_a + 1) for b in range(largest_b + 1)]
    if n_train + n_test > len(pairs):
        raise ValueError(f"only {len(pairs)} distinct problems, asked for {n_train + n_test}")
    rng = random.Random(seed)
    picked = rng.sample(pairs, n_train + n_test)
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in picked]
    return rows[:n_train], rows[n_train:]


def prepare(task: str, out: str, seed: int = 0) -> None:
    """Model, data and warm start of ``task`` under ``out`` (skipped when the model exists)."""
    if task == "demo":
        demo.prepare(out, seed)
        return
    largest_a, largest_b, n_train, n_test, warm = TASKS[task]
    model_dir = os.path.join(out, "model")
    if os.path.exists(os.path.join(model_dir, "config.json")):
        return
    train_rows, test_rows = sum_rows(largest_a, largest_b, n_train, n_test, seed)
    tiny.write_jsonl(os.path.join(out, "data", "train.jsonl"), train_rows)
    tiny.write_jsonl(os.path.join(out, "data", "test.jsonl"), test_rows)
    tiny.build_model(model_dir, seed=seed)
    demo.warm_start(model_dir, train_rows, steps=warm, seed=seed)


def task_config(task: str, out: str, steps: int, baseline: str = "grpo") -> dict:
    """The demo's config for ``task``, set for studies: one torch thread, no progress line,
    no checkpoints, no final model, one reward worker; for ``sums2x1`` a greedy validation
    on its 200 held-out problems after the last step (``eval/accuracy``)."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; known: {', '.join(TASKS)}")
    values: dict = {
        "runtime.threads": 1,
        "reward.options.workers": 1,
        "output.progress": False,
        "output.checkpoint_every": 0,
        "output.save_model": False,
    }
    if task != "demo":  # greedy accuracy on the held-out problems, once, after the last step
        values["eval"] = {
            "data": os.path.join(out, "data"),
            "split": "test",
            "every_n_steps": steps,
            "temperature": 0.0,
        }
    return with_values(demo.demo_config(out, steps, baseline), values)


def main(argv: list[str] | None = None) -> int:
    """Prepare a task and write its ``config.yaml``; prints the config's path."""
    p = argparse.ArgumentParser(prog="python -m grpo_core.cli.tasks", description=__doc__)
    p.add_argument("task", choices=sorted(TASKS))
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--seed", type=int, default=0, help="data split, model init, warm start")
    args = p.parse_args(argv)
    prepare(args.task, args.out, args.seed)
    path = os.path.join(args.out, "config.yaml")
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(task_config(args.task, args.out, args.steps), f, sort_keys=False)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
