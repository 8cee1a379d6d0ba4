"""Two-step word problems by a curriculum on SmolLM2-135M-Instruct (issue #49 item 2; the
figures in docs/recipes.md, the ninth round).

    python bench/two_step_curriculum.py OUT [--seed 0] [--stage3-steps 20]

Stage 1 is the pretrained demo's recipe (one-step training problems; ``--seed``, the
demo's ``train.seed``, which every later stage keeps) at one thread;
stage 2 continues from its final weights on two-step problems only, under a system prompt
whose worked example takes two calculations; stage 3 continues from stage 2 on problems half
one-step and half two-step, under a prompt with both worked examples. Each stage's final
model is then judged greedily on the demo's 100 held-out problems under each of the three
prompts, by kind (``OUT/report.json``). Micro-batches of two groups keep a stage's memory
near 6 GB, so it can run beside another job; about 30 minutes a 30-step stage on one core.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace

import yaml

from grpo_core import config as config_mod
from grpo_core.cli import demo_pretrained, word_problems
from grpo_core.config.view import view
from grpo_core.tiny import write_jsonl

HEAD = (
    "You solve math word problems. Reply in one line: the calculations, then the answer in "
    "\\boxed{}.\n"
)
TWO_STEP_EXAMPLE = (
    "Example question: A bag holds 6 pears. Ann buys 4 bags and already had 5 pears. "
    "How many pears does Ann have now?\n"
    "Example reply: 6 * 4 = 24. 24 + 5 = 29. \\boxed{29}"
)
ONE_STEP_EXAMPLE = (
    "Example question: A bag holds 6 pears. Ann buys 4 bags. How many pears does Ann buy?\n"
    "Example reply: 6 * 4 = 24. \\boxed{24}\n"
)
PROMPTS = {
    "one-step example": demo_pretrained.SYSTEM_PROMPT,
    "two-step example": HEAD + TWO_STEP_EXAMPLE,
    "both examples": HEAD + ONE_STEP_EXAMPLE + TWO_STEP_EXAMPLE,
}
ONE_THREAD = ["runtime.threads=1", "train.micro_batch_groups=2"]


def next_stage(prev: str, out: str, prompt: str, rows: list[dict], steps: int) -> str:
    """The config of a stage that starts from ``prev``'s final weights: ``prev``'s recipe
    with these training rows, this system prompt and the same held-out problems."""
    os.makedirs(os.path.join(out, "data"), exist_ok=True)
    with open(os.path.join(prev, "data", "test.jsonl"), encoding="utf-8") as f:
        held = [json.loads(line) for line in f]
    write_jsonl(os.path.join(out, "data", "train.jsonl"), rows)
    write_jsonl(os.path.join(out, "data", "test.jsonl"), held)
    with open(os.path.join(prev, "config.yaml"), encoding="utf-8") as f:
        cfg = yaml.safe_load(f)
    cfg["model"] = {"name_or_path": os.path.join(prev, "run", "final")}
    cfg["data"].update(path=os.path.join(out, "data", "train.jsonl"), system_prompt=prompt)
    cfg["eval"]["data"] = os.path.join(out, "data")
    cfg["output"]["dir"] = os.path.join(out, "run")
    cfg["train"]["steps"] = steps
    path = os.path.join(out, "config.yaml")
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)
    return path


def held_out(stage: str) -> set[str]:
    with open(os.path.join(stage, "data", "test.jsonl"), encoding="utf-8") as f:
        return {json.loads(line)["prompt"] for line in f}


def by_kind(stage: str, prompt: str) -> dict:
    """Greedy held-out accuracy of ``stage``'s final model under ``prompt``, by kind."""
    cfg = view(config_mod.load(os.path.join(stage, "config.yaml"), []))
    cfg = replace(cfg, data=replace(cfg.data, system_prompt=prompt))
    with open(os.path.join(cfg.eval.data, "test.jsonl"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    ((acc, records),) = demo_pretrained.accuracies(cfg, os.path.join(stage, "run", "final"), rows)
    return {"all": acc, **demo_pretrained.by_kind(rows, records)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stage3-steps", type=int, default=20)
    args = p.parse_args()
    from grpo_core.trainer import train

    s1, s2, s3 = (os.path.join(args.out, f"stage{i}") for i in (1, 2, 3))
    demo_pretrained.run(s1, overrides=[*ONE_THREAD, f"train.seed={args.seed}"], gsm8k_n=0)
    exclude = frozenset(held_out(s1))
    two = word_problems.problems(2000, 7, word_problems.TWO_STEP, exclude)
    train(config_mod.load(next_stage(s1, s2, PROMPTS["two-step example"], two, 30)))
    mixed = word_problems.problems(2000, 11, None, exclude)
    train(config_mod.load(next_stage(s2, s3, PROMPTS["both examples"], mixed, args.stage3_steps)))
    report = {s: {name: by_kind(s, text) for name, text in PROMPTS.items()} for s in (s1, s2, s3)}
    with open(os.path.join(args.out, "report.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
