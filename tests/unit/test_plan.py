"""The plan (grpo_core/plan.py): which sampler and source of targets a config chooses, and
that each strategy's refusals are reported whichever strategy serves the run, with an
environment included (docs/architecture.md, "Strategies and what each refuses")."""

from __future__ import annotations

from helpers import make_config

from grpo_core import config, plan
from grpo_core.config.view import view
from grpo_core.samplers.inline import Inline
from grpo_core.samplers.resample import Resample
from grpo_core.targets.baselines import GreedyBaseline, GroupBaseline

ENV = {"name": "calculator"}


def _plan(**sections) -> plan.Plan:
    return plan.make(view(config.validate(make_config("m", "d.jsonl", "out", **sections))))


def test_the_default_run_is_inline_with_a_group_baseline_and_no_problem():
    p = _plan()
    assert (p.sampler, p.targets, p.problems) == (Inline, GroupBaseline, [])


def test_remax_with_an_environment_is_refused_by_its_strategy():
    assert _plan(baseline={"name": "remax"}).problems == []
    p = _plan(baseline={"name": "remax"}, environment=ENV)
    assert p.targets is GreedyBaseline
    assert p.problems == [
        "baseline.name: remax needs greedy completions, not yet drawn for environment episodes"
    ]


def test_resampling_flat_groups_with_an_environment_is_refused_by_its_strategy():
    assert _plan(groups={"resample_zero_std_max": 2}).problems == []
    p = _plan(groups={"resample_zero_std_max": 2}, environment=ENV)
    assert p.sampler is Resample
    assert [line.split(":")[0] for line in p.problems] == ["groups.resample_zero_std_max"]
    assert "environment" in p.problems[0]


def test_a_refusal_counts_when_another_strategy_serves():
    """Dynamic sampling serves before resampling, yet resampling's refusals still count."""
    p = _plan(groups={"resample_zero_std_max": 2, "dynamic_sampling": True}, environment=ENV)
    assert p.sampler is not Resample
    assert any("environment" in line for line in p.problems)
    assert any("dynamic_sampling" in line for line in p.problems)
