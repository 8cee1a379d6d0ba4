"""``grpo plugins``: each action is a subcommand with its own --help; no action lists."""

from __future__ import annotations

import json

import pytest

from grpo_core.cli.main import main


def _help(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


def test_each_action_has_its_own_help(capsys):
    new = _help(capsys, "plugins", "new")
    assert new.startswith("usage: grpo plugins new [-h] [--kind KIND] [--out OUT] name")
    assert "callback" in new and "--options" not in new and "--json" not in new
    check = _help(capsys, "plugins", "check")
    assert check.startswith("usage: grpo plugins check [-h] [--options OPTIONS] kind name")
    assert "--kind" not in check
    top = _help(capsys, "plugins")
    assert all(action in top for action in ("list", "check", "new"))


def test_no_action_and_list_both_list(capsys):
    assert main(["plugins", "--json"]) == 0
    bare = json.loads(capsys.readouterr().out)
    assert main(["plugins", "list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == bare
    assert {"kind": "reward", "name": "math"}.items() <= next(
        r for r in bare if r["name"] == "math"
    ).items()


def test_check_without_a_name_is_refused(capsys):
    with pytest.raises(SystemExit) as done:
        main(["plugins", "check", "reward"])
    assert done.value.code == 2
    assert "the following arguments are required: name" in capsys.readouterr().err
