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


@pytest.mark.parametrize(
    "override,needles",
    [
        ("a" + ".a" * 9_999 + "=1", ["--set a.a.a", "nesting deeper than 64 levels"]),
        ("output.dir=/tmp/a\x00b", ["output.dir:", "contains a NUL character"]),
        ("output.dir=/tmp/a\udcffb", ["output.dir:", "lone surrogate", "expected a UTF-8 path"]),
        ("train.seed=" + "9" * 20, ["train.seed: found 9999", "expected a number <= 92233"]),
    ],
)
@pytest.mark.parametrize("command", ["validate", "train"])
def test_bad_overrides_are_one_line(
    tiny_model, addition_data, tmp_path, capsys, override, needles, command
):
    """In-process (``main``), so a NUL and a lone surrogate reach it as they are: a command
    line cannot carry a NUL, and a surrogate comes from an undecodable byte."""
    from grpo_core.cli.main import main

    cfg = make_config(tiny_model, addition_data, str(tmp_path / "run"), train={"steps": 1})
    code = main([command, write_config(tmp_path / "c.json", cfg), "--set", override])
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert not os.path.exists(tmp_path / "run")
