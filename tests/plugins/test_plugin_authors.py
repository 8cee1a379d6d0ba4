"""What a plugin author reads and runs: the Python samples in docs/plugins.md run as written,
and `grpo plugins check` feeds a reward the columns it declares."""

from __future__ import annotations

import os
import re
import types

import pytest
from helpers import ROOT

from grpo_core.cli import plugin_tools
from grpo_core.hookspecs import Reward, hookimpl
from grpo_core.registry import registry

with open(os.path.join(ROOT, "docs", "plugins.md"), encoding="utf-8") as f:
    SAMPLES = re.findall(r"```python\n(.*?)```", f.read(), re.S)
# a sample that elides TRL's own arguments (`...`) needs TRL's trainer: only imported here
ELIDED = re.compile(r"GRPOTrainer\(\s*\.\.\.,")
RUNNABLE = [s for s in SAMPLES if not ELIDED.search(s)]


def test_the_page_has_samples():
    assert len(RUNNABLE) >= 2


@pytest.mark.parametrize("sample", RUNNABLE, ids=[s.splitlines()[0][:40] for s in RUNNABLE])
def test_plugins_md_sample_runs(sample):
    exec(compile(sample, "docs/plugins.md", "exec"), {"__name__": "docs_sample"})


def test_the_trl_sample_imports():
    (sample,) = [s for s in SAMPLES if ELIDED.search(s)]
    exec(compile(sample.splitlines()[0], "docs/plugins.md", "exec"), {})


class NeedsSolution(Reward):
    max_value = 1.0

    @classmethod
    def columns_for(cls, options):
        return ("solution",)

    def __call__(self, prompts, completions, **columns):
        return [float(c == s) for c, s in zip(completions, columns["solution"])]


def test_plugins_check_passes_the_declared_columns(capsys):
    module = types.ModuleType("needs_solution_for_tests")
    module.reward = hookimpl(
        lambda register: register("needs_solution", NeedsSolution), specname="reward"
    )
    registry().add(module, "test-needs-solution")
    assert plugin_tools.check("reward", "needs_solution") == 0, capsys.readouterr().out
    assert "0 failed" in capsys.readouterr().out
