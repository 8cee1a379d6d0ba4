"""User errors that ended in a traceback, a raw exception, a silent exit 0 or the wrong reason
(issue #53's held-out campaign): each is one line naming what was wrong, exit 2, with the
real ``grpo`` entry point."""

from __future__ import annotations

import os

import pytest
from helpers import ROOT, make_config, run_grpo, write_config


def one_line(p, *needles: str) -> str:
    lines = [x for x in p.stderr.splitlines() if x.startswith("error:")]
    assert p.returncode == 2 and len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def config(tiny_model, data, tmp_path, reward_name: str) -> str:
    cfg = make_config(
        tiny_model,
        data,
        str(tmp_path / "run"),
        reward={"name": reward_name},
        train={"steps": 1, "prompts_per_step": 2},
    )
    return write_config(tmp_path / "c.json", cfg)


@pytest.mark.parametrize(
    "source,needles",
    [
        ("import sys\nsys.exit(0)\n", ["importing", "it called sys.exit(0) while being imported"]),
        ("raise RuntimeError('no GPU here')\n", ["importing", "RuntimeError: no GPU here"]),
        ("import no_such_module_xyz\n", ["ModuleNotFoundError", "no_such_module_xyz"]),
    ],
)
@pytest.mark.parametrize("command", ["validate", "train"])
def test_a_reward_file_that_fails_or_exits_at_import(
    tiny_model, addition_data, tmp_path, source, needles, command
):
    (tmp_path / "bad_reward.py").write_text(source + "def fn(prompts, completions, **k):\n    0\n")
    path = config(tiny_model, addition_data, tmp_path, str(tmp_path / "bad_reward.py") + ":fn")
    p = run_grpo(command, path, cwd=ROOT)
    one_line(p, "bad_reward.py:fn", *needles)
    assert not os.path.exists(tmp_path / "run")  # train wrote nothing


def test_a_relative_module_reference(tiny_model, addition_data, tmp_path):
    p = run_grpo("validate", config(tiny_model, addition_data, tmp_path, "..mod:fn"), cwd=ROOT)
    one_line(p, "'..mod:fn'", "relative module name", "expected an absolute one")
