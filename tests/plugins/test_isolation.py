"""Reward time limits that hold: an installed reward runs in a worker process that is killed
past ``reward.timeout``, even when it is stuck in C code holding the GIL."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
from helpers import ROOT, make_config, write_config

PLUGIN = '''
import re, sys, time
from grpo_core.hookspecs import Reward, hookimpl

GRPO_CORE_API = (2,)


class Stuck(Reward):
    """Python's backtracking regex on a hostile text, on its second call: years in C with the
    GIL held. (A replacement worker builds a fresh instance, which answers again.)"""
    max_value = 1.0
    calls = 0

    def __call__(self, prompts, completions, **columns):
        self.calls += 1
        if self.calls == 2:
            re.match(r"^(\\w+\\s?)*$", "a" * 40 + "!")
        return [1.0 if "1" in c else 0.0 for c in completions]


class Exits(Reward):
    def __call__(self, prompts, completions, **columns):
        sys.exit(3)


@hookimpl
def reward(register):
    register("stuck", Stuck, description="hangs in C on some batches")
    register("exits", Exits, description="calls sys.exit")
'''


@pytest.fixture
def installed(tmp_path):
    """A reward package installed as a distribution (dist-info on the path, as pip leaves)."""
    site = tmp_path / "site"
    info = site / "stuck_rewards-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: stuck-rewards\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[grpo_core]\nstuck = stuck_rewards\n")
    (site / "stuck_rewards.py").write_text(PLUGIN)
    path = [str(site)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


def train(env, cfg_path, timeout=600):  # a hang guard (ten minutes), not a bound on speed
    return subprocess.run(
        [sys.executable, "-m", "grpo_core.cli", "train", cfg_path],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=timeout,
    )


def test_a_reward_stuck_in_c_is_killed_at_its_budget(
    installed, tiny_model, addition_data, tmp_path
):
    cfg = make_config(
        tiny_model,
        addition_data,
        str(tmp_path / "run"),
        reward={"name": "stuck", "timeout": 3, "failure": "zero"},
        sampling={"group_size": 4, "max_new_tokens": 6},
        train={"steps": 3, "prompts_per_step": 4},
    )
    p = train(installed, write_config(tmp_path / "c.json", cfg))  # inline: stuck for years
    assert p.returncode == 0, p.stderr
    assert "did not return within 3 s (reward.timeout); its worker process was killed" in p.stderr
    assert p.stderr.count("did not return within") == 1  # step 1 only; steps 0 and 2 scored
    assert p.stderr.count("did not return within") == 1  # step 1 only; steps 0 and 2 scored
    rows = [json.loads(x) for x in open(tmp_path / "run" / "metrics.jsonl")]
    assert len(rows) == 3


def test_a_reward_that_exits_its_process_fails_under_the_policy(
    installed, tiny_model, addition_data, tmp_path
):
    cfg = make_config(
        tiny_model,
        addition_data,
        str(tmp_path / "run"),
        reward={"name": "exits", "failure": "raise"},
        train={"steps": 1, "prompts_per_step": 2},
    )
    p = train(installed, write_config(tmp_path / "c.json", cfg))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "reward 'exits' raised RuntimeError: its worker process died" in p.stderr


def test_declarations_cross_the_process_boundary(tiny_model, addition_data, tmp_path):
    """The isolated math reward still declares its best score: solved groups are counted."""
    from grpo_core import config
    from grpo_core.config.view import view
    from grpo_core.reward.isolation import IsolatedReward, build_reward

    cfg = view(config.validate(make_config(tiny_model, addition_data, str(tmp_path / "run"))))
    reward = build_reward(cfg.reward)
    try:
        assert isinstance(reward, IsolatedReward) and reward.max_value == 1.0
        out = reward(
            ["1+1="], ["2", "3"], answer=["2", "2"], completion_tokens=[1, 1], group_ids=[0, 0]
        )
        assert list(out) == [1.0, 0.0] and out.extras["extracted"] == ["2", "3"]
    finally:
        reward.close()
    inline = build_reward(dataclasses.replace(cfg.reward, isolation="inline"))
    assert not isinstance(inline, IsolatedReward)
    inline.close()
