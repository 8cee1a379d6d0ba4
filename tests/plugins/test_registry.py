"""Plugins found by name through entry points: third-party, duplicates, allow-list, API."""

from __future__ import annotations

import json
import os
import textwrap

from helpers import run_grpo

import grpo_core
from grpo_core.hookspecs import KINDS

BUILTINS = {
    ("reward", "math"),
    ("reward", "format"),
    ("reward", "length"),
    ("reward", "json_schema"),
    ("reward", "reward_model"),
    ("reward", "http"),
    ("reward", "weighted"),
    ("baseline", "grpo"),
    ("baseline", "rloo"),
    ("baseline", "remax"),
    ("baseline", "dr_grpo"),
    ("baseline", "mixed"),
    ("baseline", "reinforce_pp"),
    ("critic", "ppo"),
    ("kl", "fixed"),
    ("kl", "adaptive"),
    ("kl", "schedule"),
    ("generator", "hf"),
    ("generator", "vllm"),
}


def make_dist(root, dist: str, module: str, body: str, version: str = "0.3.1") -> str:
    """A throw-away installed distribution: a module plus its .dist-info with entry points."""
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, f"{module}.py"), "w") as f:
        f.write(textwrap.dedent(body))
    info = os.path.join(root, f"{dist.replace('-', '_')}-{version}.dist-info")
    os.makedirs(info, exist_ok=True)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    with open(os.path.join(info, "entry_points.txt"), "w") as f:
        f.write(f"[grpo_core]\n{module} = {module}\n")
    return root


SHOUT = """
    from grpo_core.hookspecs import hookimpl

    class Shout:
        def __init__(self, bonus=1.0):
            self.bonus = bonus
        def __call__(self, prompts, completions, **columns):
            return [self.bonus if c.isupper() else 0.0 for c in completions]

    @hookimpl
    def reward(register):
        register("shout", Shout, schema={"type": "object", "additionalProperties": False,
                 "properties": {"bonus": {"type": "number", "default": 1.0}}},
                 description="upper-case completions score")
"""


def test_builtins_are_listed_with_distribution():
    result = run_grpo("plugins", "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert {(r["kind"], r["name"]) for r in rows} >= BUILTINS
    assert all(set(r) == {"kind", "name", "distribution", "version", "description"} for r in rows)
    assert all(r["distribution"] == "grpo-core" for r in rows if (r["kind"], r["name"]) in BUILTINS)
    assert {r["kind"] for r in rows} <= set(KINDS)


def test_third_party_plugin_found_and_created(tmp_path):
    site = make_dist(tmp_path / "site", "shout-reward", "shout_plugin", SHOUT)
    code = (
        "import grpo_core; r = grpo_core.create('reward', 'shout', {'bonus': 2.5}); "
        "print(r(['p', 'p'], ['HI', 'hi']))"
    )
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(site)},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[2.5, 0.0]"
    listed = run_grpo("plugins", "--json", env={"PYTHONPATH": str(site)})
    row = [r for r in json.loads(listed.stdout) if r["name"] == "shout"]
    assert row == [
        {
            "kind": "reward",
            "name": "shout",
            "distribution": "shout-reward",
            "version": "0.3.1",
            "description": "upper-case completions score",
        }
    ]


def test_duplicate_name_names_both_distributions(tmp_path):
    a = make_dist(tmp_path / "a", "first-dist", "first_mod", SHOUT)
    b = make_dist(tmp_path / "b", "second-dist", "second_mod", SHOUT)
    out = run_grpo("plugins", env={"PYTHONPATH": f"{a}{os.pathsep}{b}"})
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert "first-dist" in out.stderr and "second-dist" in out.stderr and "'shout'" in out.stderr


def test_environment_variable_excludes_external_plugins(tmp_path):
    site = make_dist(tmp_path / "site", "shout-reward", "shout_plugin", SHOUT)
    env = {"PYTHONPATH": str(site)}
    names = {r["name"] for r in json.loads(run_grpo("plugins", "--json", env=env).stdout)}
    assert "shout" in names
    env["GRPO_CORE_PLUGINS"] = ""
    rows = json.loads(run_grpo("plugins", "--json", env=env).stdout)
    assert "shout" not in {r["name"] for r in rows}
    assert {(r["kind"], r["name"]) for r in rows} >= BUILTINS  # built-ins always load
    env["GRPO_CORE_PLUGINS"] = "shout-reward"
    assert "shout" in {r["name"] for r in json.loads(run_grpo("plugins", "--json", env=env).stdout)}


def test_incompatible_api_version_is_refused(tmp_path):
    body = SHOUT + "\n    GRPO_CORE_API = (7, 8)\n"
    site = make_dist(tmp_path / "site", "future-plugin", "future_mod", body)
    out = run_grpo("plugins", env={"PYTHONPATH": str(site)})
    assert out.returncode == 2
    assert "future-plugin" in out.stderr and "[7, 8]" in out.stderr
    assert f"API {grpo_core.PLUGIN_API_VERSION}" in out.stderr


def test_create_validates_and_fills_defaults():
    baseline = grpo_core.create("baseline", "grpo")
    assert baseline.kw == {"eps": 1e-6, "std": "sample"}
    try:
        grpo_core.create("baseline", "grpo", {"std": "bogus"})
    except grpo_core.ConfigError as exc:
        assert "baseline.grpo.options.std" in str(exc) and "population" in str(exc)
    else:
        raise AssertionError("bad option accepted")
    try:
        grpo_core.create("baseline", "rlooo")
    except grpo_core.PluginError as exc:
        assert "did you mean 'rloo'" in str(exc)
    else:
        raise AssertionError("unknown name accepted")
