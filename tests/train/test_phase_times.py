"""``time/generate`` and ``time/reward`` mean what their names say when a sampler draws more
than one generation a step: the extra completions of std-driven group sizes and of flat-group
resampling count as generation, and every round of dynamic sampling counts, kept or filtered.

A fake clock replaces the phases' ``time.time``: it stands still except that each generation
call advances it by 1 and each reward call by 1000, so each step's figures are exact counts
of the calls that step made (no wall time is measured or asserted)."""

from __future__ import annotations

import json
import os
import types

import pytest
from grpo_core_plugins.generators.hf import HFGenerator
from test_group_sizes import run_cfg

from grpo_core import phases
from grpo_core.samplers import resample
from grpo_core.trainer import train

GENERATE, REWARD = 1.0, 1000.0


@pytest.fixture
def calls(monkeypatch):
    """[generation calls, reward calls] per step, with the fake clock installed."""
    now, seen = [0.0], {}
    clock = types.SimpleNamespace(time=lambda: now[0])
    for module in (phases, resample):
        monkeypatch.setattr(module, "time", clock)
    generate, rewards = HFGenerator.generate, phases.rewards
    step = [0]

    def counted(kind, cost, inner):
        def wrapper(*args, **kwargs):
            now[0] += cost
            seen.setdefault(step[0], [0, 0])[kind] += 1
            return inner(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(HFGenerator, "generate", counted(0, GENERATE, generate))
    monkeypatch.setattr(phases, "rewards", counted(1, REWARD, rewards))
    original = phases.generate

    def at_step(run, s, *args, **kwargs):
        step[0] = s
        return original(run, s, *args, **kwargs)

    monkeypatch.setattr(phases, "generate", at_step)
    return seen


def run(model, data, out, **groups) -> list[dict]:
    train(run_cfg(model, data, out, **groups))
    return [json.loads(x) for x in open(os.path.join(out, "metrics.jsonl"))]


@pytest.mark.parametrize(
    "groups",
    [
        {"adaptive_first": 2},
        {"resample_zero_std_max": 2},
        {"dynamic_sampling": True, "max_rounds": 3, "min_std": 0.45},
    ],
    ids=["adaptive_first", "resample_zero_std_max", "dynamic_sampling"],
)
def test_each_phase_counts_its_own_calls(tiny_model, addition_data, tmp_path, calls, groups):
    rows = run(tiny_model, addition_data, tmp_path / "run", **groups)
    assert len(rows) == 2 and sorted(calls) == [0, 1]
    for r in rows:
        n_generate, n_reward = calls[r["step"]]
        assert r["time/generate"] == n_generate * GENERATE
        assert r["time/reward"] == n_reward * REWARD
    # the sampler drew more than one generation on some step: the case being checked
    assert max(calls[s][0] for s in calls) > 1
