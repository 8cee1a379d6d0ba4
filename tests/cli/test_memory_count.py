"""`grpo plan-memory` prints a small model's size in a unit that shows it."""

from __future__ import annotations

import re

from helpers import run_grpo

from grpo_core.cli.memory import count


def test_parameter_counts_pick_their_unit():
    assert [count(n) for n in (7.62e9, 494e6, 19_300, 12)] == ["7.62 B", "494 M", "19.3 k", "12"]


def test_plan_memory_on_a_tiny_model(tiny_model):
    p = run_grpo("plan-memory", "--model", tiny_model)
    assert p.returncode == 0, p.stderr
    assert "0.00 B" not in p.stdout
    assert re.search(r"\(\d[\d.]* [kM] parameters\)", p.stdout), p.stdout


def test_the_optimizer_state_follows_the_configured_optimizer():
    from grpo_core.cli.memory import optimizer_moments, plan
    from grpo_core.config import section
    from grpo_core.observe.flops import Shape

    shape = Shape(64, 2, 4, 4, 128, 100, True)
    P = shape.params()
    sizes = {m: plan(shape, 4, 4, 16, 16, moments=m)["optimizer"] for m in (2.0, 1.0, 0.0)}
    # float32 weights (dtype auto): 4 bytes per moment per weight
    assert sizes == {2.0: 8.0 * P, 1.0: 4.0 * P, 0.0: 0.0}
    # DeepSpeed keeps an fp32 master copy besides the fp32 moments
    assert plan(shape, 4, 4, 16, 16, strategy="zero1", moments=0.0)["optimizer"] == 4.0 * P

    def oc(**kw):
        return section("optimizer", {"momentum": 0.0, **kw})

    assert optimizer_moments(oc(name="adamw")) == 2.0
    assert optimizer_moments(oc(name="sgd")) == 0.0
    assert optimizer_moments(oc(name="sgd", momentum=0.9)) == 1.0
    assert optimizer_moments(oc(name="adafactor")) == 0.0
