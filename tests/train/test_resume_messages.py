"""What a resumed run says: where it resumed, and that a changed train.steps re-spreads the
learning-rate schedule."""

from __future__ import annotations

import json

from helpers import make_config, run_grpo, write_config


def test_resume_says_where_and_that_more_steps_stretch_the_schedule(
    tiny_model, addition_data, tmp_path
):
    cfg = make_config(
        tiny_model,
        addition_data,
        str(tmp_path / "run"),
        train={"steps": 2, "prompts_per_step": 2},
        optimizer={"lr": 1e-3, "lr_schedule": "cosine"},
        output={
            "dir": str(tmp_path / "run"),
            "progress": False,
            "checkpoint_every": 2,
            "save_model": False,
        },
    )
    path = write_config(tmp_path / "c.json", cfg)
    assert run_grpo("train", path).returncode == 0
    p = run_grpo("train", path, "--resume", "--set", "train.steps=4")
    assert p.returncode == 0, p.stderr
    assert "step-00000002: 2 steps done; the next is step 2 in metrics.jsonl" in p.stderr
    # cosine over 2 steps ended at 0; over 4 steps, step 2 is half way: lr / 2
    assert (
        "notice: train.steps changed from 2 to 4 on resume: the cosine schedule now spans "
        "4 steps, so the learning rate goes from 0 (where the checkpoint left it) to "
        "0.0005 at step 2"
    ) in p.stderr, p.stderr
    steps = [
        json.loads(line)["step"]
        for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert steps == [0, 1, 2, 3]


def test_resume_with_the_same_steps_says_nothing_about_the_schedule(
    tiny_model, addition_data, tmp_path
):
    cfg = make_config(
        tiny_model,
        addition_data,
        str(tmp_path / "run"),
        train={"steps": 2, "prompts_per_step": 2},
        optimizer={"lr": 1e-3, "lr_schedule": "cosine"},
        output={
            "dir": str(tmp_path / "run"),
            "progress": False,
            "checkpoint_every": 1,
            "keep_last": 2,
            "save_model": False,
        },
    )
    path = write_config(tmp_path / "c.json", cfg)
    assert run_grpo("train", path, "--set", "train.steps=1").returncode == 0
    p = run_grpo("train", path, "--resume", "--set", "train.steps=1")
    assert p.returncode == 0, p.stderr
    assert "1 steps done" in p.stderr and "schedule now spans" not in p.stderr
