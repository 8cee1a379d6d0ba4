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
