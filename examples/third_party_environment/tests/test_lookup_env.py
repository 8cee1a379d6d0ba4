import subprocess
import sys

from grpo_lookup_env import Lookup, LookupErrors


def test_lookups_and_errors():
    env = Lookup()
    state = env.reset({"facts": {"Capital of France": "Paris"}})
    assert env.step(state, "<lookup>capital of france</lookup>").text == "Paris"
    assert env.step(state, "<lookup>capital of Spain</lookup>").tool_error
    assert env.step(state, "Paris").done


def test_the_reward_reads_the_trajectory():
    good = [{"role": "tool", "content": "Paris", "tool_error": False}]
    bad = [{"role": "tool", "content": "error", "tool_error": True}] * 2
    assert LookupErrors()(["p", "p"], ["Paris", "Paris"], messages=[good, bad]) == [1.0, 0.5]


def test_conformance():
    for kind, name in (("environment", "lookup"), ("reward", "lookup_errors")):
        out = subprocess.run(
            [sys.executable, "-m", "grpo_core.cli", "plugins", "check", kind, name],
            capture_output=True,
            text=True,
        )
        assert out.returncode == 0, out.stdout + out.stderr
