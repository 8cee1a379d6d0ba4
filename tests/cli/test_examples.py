"""The example configs validate, and the GSM8K one matches the shared data's layout."""

from __future__ import annotations

import json
import os

import yaml
from helpers import ROOT, gsm8k_or_stand_in, needs_shared, run_grpo

import grpo_core
from grpo_core import config

EXAMPLE = os.path.join(ROOT, "examples", "gsm8k_qwen.yaml")


def test_gsm8k_example_validates(tmp_path):
    out = run_grpo("validate", EXAMPLE, *gsm8k_or_stand_in(tmp_path), cwd=ROOT)
    assert out.returncode == 0, out.stderr
    eff = yaml.safe_load(out.stdout)
    assert eff["reward"]["options"]["components"][1]["requires"] == ["format"]
    assert eff["model"]["trust_remote_code"] is False


def test_gsm8k_example_fits_the_data_and_scores_a_real_solution():
    path = needs_shared("gsm8k/train.jsonl")
    cfg = config.load(EXAMPLE)
    row = json.loads(open(path).readline())
    assert cfg["data"]["prompt_field"] in row and all(c in row for c in cfg["data"]["columns"])
    reward = grpo_core.create("reward", cfg["reward"]["name"], cfg["reward"]["options"])
    final = row["answer"].rsplit("####", 1)[1].strip()
    good = f"<think>{row['answer'].split('####')[0]}</think><answer>{final}</answer>"
    out = reward(
        [row["question"]] * 2,
        [good, f"<answer>{final}</answer>"],
        answer=[row["answer"]] * 2,
        completion_tokens=[100, 5],
        group_ids=[0, 0],
    )
    assert list(out) == [1.2, 0.0]  # format + math; the second fails the format gate
