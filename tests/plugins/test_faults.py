"""A plugin's bug keeps its traceback: the innermost plugin, its distribution and the user's
file:line are named in the one-line error (from the reward's worker process too), --debug
shows every frame, and a third-party plugin's crash shows its frames and is not called ours."""

from __future__ import annotations

import os

import pytest
from helpers import make_config, run_grpo, write_config

from grpo_core.faults import describe

REWARDS = """
def needs_solution(prompts, completions, **columns):
    solutions = columns["solution"]  # the data has no such column
    return [1.0 for _ in solutions]
"""

BASELINE = """
from grpo_core.hookspecs import Baseline, hookimpl

GRPO_CORE_API = (2,)


class Broken(Baseline):
    def advantages(self, rewards, greedy_rewards=None):
        return {}["center"]


@hookimpl
def baseline(register):
    register("broken", Broken)
"""


def weighted_with_bug(tiny_model, addition_data, tmp_path) -> str:
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    cfg = make_config(
        tiny_model,
        addition_data,
        str(tmp_path / "run"),
        train={"steps": 1, "prompts_per_step": 2},
        reward={
            "name": "weighted",
            "options": {"components": [{"name": "math"}, {"name": "my_rewards.py:needs_solution"}]},
        },
    )
    return write_config(tmp_path / "c.json", cfg)


def test_a_function_reward_bug_in_the_worker_names_the_function_and_line(
    tiny_model, addition_data, tmp_path
):
    p = run_grpo("train", weighted_with_bug(tiny_model, addition_data, tmp_path), cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    where = f"{tmp_path / 'my_rewards.py'}:3"
    assert (
        "error: reward 'weighted' raised KeyError: 'solution' in reward "
        "'my_rewards.py:needs_solution' (from python function my_rewards.py) at " + where
    ) in p.stderr, p.stderr
    assert p.stderr.count("error: ") == 1 and "Traceback" not in p.stderr  # one line
    assert "internal error" not in p.stderr


def test_debug_shows_every_frame(tiny_model, addition_data, tmp_path):
    p = run_grpo(
        "train", weighted_with_bug(tiny_model, addition_data, tmp_path), "--debug", cwd=tmp_path
    )
    assert p.returncode == 2
    assert 'my_rewards.py", line 3, in needs_solution' in p.stderr  # the user's frames
    assert "isolation.py" in p.stderr and "weighted.py" in p.stderr  # the worker's frames


def test_inline_reward_bug_is_described_the_same_way(tiny_model, addition_data, tmp_path):
    path = weighted_with_bug(tiny_model, addition_data, tmp_path)
    p = run_grpo("train", path, "--set", "reward.isolation=inline", cwd=tmp_path)
    assert p.returncode == 2
    assert (
        "in reward 'my_rewards.py:needs_solution' (from python function my_rewards.py) "
        f"at {tmp_path / 'my_rewards.py'}:3" in p.stderr
    ), p.stderr


@pytest.fixture
def broken_baseline(tmp_path):
    """A third-party distribution (dist-info on the path) whose baseline has a bug."""
    site = tmp_path / "site"
    info = site / "broken_baseline-2.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-baseline\nVersion: 2.0\n")
    (info / "entry_points.txt").write_text("[grpo_core]\nbroken = broken_baseline\n")
    (site / "broken_baseline.py").write_text(BASELINE)
    return {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}


def test_a_third_party_bug_is_not_called_an_internal_error(
    tiny_model, addition_data, tmp_path, broken_baseline
):
    cfg = make_config(
        tiny_model,
        addition_data,
        str(tmp_path / "run"),
        train={"steps": 1, "prompts_per_step": 2},
        baseline={"name": "broken"},
    )
    p = run_grpo("train", write_config(tmp_path / "c.json", cfg), env=broken_baseline)
    assert p.returncode == 1
    assert "internal error" not in p.stderr, p.stderr
    assert (
        "error: baseline 'broken' (from broken-baseline) raised KeyError: 'center' at "
        f"{tmp_path / 'site' / 'broken_baseline.py'}:9; a bug in that plugin, not in "
        "grpo-core"
    ) in p.stderr, p.stderr
    assert "phases.py" not in p.stderr  # only the plugin's frames without --debug


def test_a_failure_outside_plugins_names_none():
    try:
        {}["x"]
    except KeyError as exc:
        fault = describe(exc)
    assert fault.plugin == "" and not fault.third_party and "KeyError" in fault.full
