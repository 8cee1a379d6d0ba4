"""Strict JSON everywhere a run writes it (issue #53): a value that is not a number (every
reward of every step missing) is written null, which every JSON reader accepts; Python's own
reader takes a bare NaN, so each file is read with a reader that refuses one."""

from __future__ import annotations

import json
import os

from helpers import ROOT, make_config, run_grpo, write_config


def strict(text: str):
    def refuse(name):
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def test_summary_when_every_reward_is_missing(tiny_model, addition_data, tmp_path):
    (tmp_path / "missing.py").write_text(
        "def fn(prompts, completions, **k):\n    return [float('nan')] * len(completions)\n"
    )
    out = tmp_path / "run"
    cfg = make_config(
        tiny_model,
        addition_data,
        str(out),
        reward={"name": f"{tmp_path / 'missing.py'}:fn", "failure": "drop_group"},
        train={"steps": 2, "prompts_per_step": 2},
    )
    p = run_grpo("train", write_config(tmp_path / "c.json", cfg), cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    summary = strict((out / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["final_reward"] is None  # no reward: no mean
    for name in ("metrics.jsonl", "samples.jsonl"):
        for line in open(os.path.join(out, name)):
            strict(line)
