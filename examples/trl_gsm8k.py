"""TRL's conversational GSM8K recipe for GRPOTrainer (its documentation's reasoning example:
a system prompt asking for <think> reasoning, TRL's own think_format_reward and
accuracy_reward, a GRPOConfig), run by grpo-core. Only the trainer line differs from TRL's
script; TRL's line is kept beside it (docs/trl.md).

It runs offline: the model is the tiny random one grpo-core builds unless --model names
another (a hub id or a directory), the data GSM8K's training file from ../shared/data (or
--data), else a few rows written here. TRL (with math_verify, for accuracy_reward) must be
installed: pip install trl math-verify.

    python examples/trl_gsm8k.py --steps 2 --rows 16
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch
from datasets import Dataset, load_dataset
from trl import GRPOConfig
from trl.rewards import accuracy_reward, think_format_reward

import grpo_core
from grpo_core.tiny import build_model

HERE = os.path.dirname(os.path.abspath(__file__))
GSM8K = os.path.join(HERE, "..", "..", "shared", "data", "gsm8k", "train.jsonl")

SYSTEM_PROMPT = (
    "A conversation between user and assistant. The user asks a question, and the assistant "
    "solves it. The assistant first thinks about the reasoning process in the mind and then "
    "provides the user with the answer. The reasoning process and answer are enclosed within "
    "<think></think> tags, i.e., <think>\nThis is my reasoning.\n</think>\nThis is my answer."
)

#: when no GSM8K file is at hand: rows of the same form
FEW = [
    {
        "question": f"Tom has {a} apples and buys {b} more. How many apples does he have?",
        "answer": f"{a} + {b} = {a + b}\n#### {a + b}",
    }
    for a in range(3, 9)
    for b in range(2, 5)
]


def make_conversation(example):
    return {
        "prompt": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": example["question"]},
        ],
        "solution": example["answer"].split("####")[-1].strip(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="hub id or directory (default: a tiny random model)")
    parser.add_argument("--data", default=GSM8K, help="GSM8K's train.jsonl")
    parser.add_argument("--rows", type=int, default=64, help="training rows used")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--output-dir", default=os.path.join(tempfile.gettempdir(), "trl_gsm8k"))
    args = parser.parse_args()

    # byte-level tokens: the system prompt alone is ~330 of them
    model = args.model or build_model(args.output_dir + "-model", hidden=32, max_positions=1024)
    if os.path.isfile(args.data):
        dataset = load_dataset("json", data_files=args.data, split="train")
    else:
        dataset = Dataset.from_list(FEW)
    train_dataset = dataset.select(range(min(args.rows, len(dataset)))).map(make_conversation)

    training_args = GRPOConfig(
        output_dir=args.output_dir,
        learning_rate=1e-5,
        num_generations=4,
        per_device_train_batch_size=8,
        max_completion_length=32,
        max_steps=args.steps,
        logging_steps=1,
        report_to="none",
        use_cpu=not torch.cuda.is_available(),
        bf16=torch.cuda.is_available(),
    )
    # TRL:
    # trainer = GRPOTrainer(
    #     model=model, reward_funcs=[think_format_reward, accuracy_reward], args=training_args,
    #     train_dataset=train_dataset,
    # )
    # trainer.train()
    grpo_core.train(
        training_args,
        rewards=[think_format_reward, accuracy_reward],
        dataset=train_dataset,
        model=model,
        overwrite=True,
    )


if __name__ == "__main__":
    main()
