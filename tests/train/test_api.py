"""`grpo_core.train` from Python: plain reward functions (also inside `weighted`, also in the
reward's worker process), in-memory data, preflight, references from a config file."""

from __future__ import annotations

import json
import os
import threading

import pytest
from helpers import ROOT, make_config, run_grpo, write_config

import grpo_core
from grpo_core import config
from grpo_core.errors import ConfigError, UserError
from grpo_core.tiny import addition_rows


def small(tiny_model, out, reward=None, steps=2):
    """A config without data (the test passes rows) and with ``reward`` only when given."""
    cfg = make_config(tiny_model, "unused", str(out), train={"steps": steps, "prompts_per_step": 2})
    del cfg["data"], cfg["reward"]
    return {**cfg, "reward": reward} if reward else cfg


def metric_keys(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
        return set().union(*(json.loads(line) for line in f))


def test_plain_function_inside_weighted_runs_in_the_worker_process(tiny_model, tmp_path):
    pids = tmp_path / "pids"

    def starts_with_digit(prompts, completions, answer, **columns):
        with open(pids, "a") as f:  # which process scored
            f.write(f"{os.getpid()}\n")
        return [1.0 if c[:1].isdigit() else 0.0 for c in completions]

    cfg = small(
        tiny_model,
        tmp_path / "run",
        reward={
            "name": "weighted",
            "options": {
                "components": [
                    {"name": "starts_with_digit", "weight": 1.0},
                    {"name": "math", "weight": 1.0},
                ]
            },
        },
    )
    rows = addition_rows(0)[0][:8]
    summary = grpo_core.train(cfg, rewards=[starts_with_digit], dataset=rows)
    assert summary["steps"] == 2
    assert os.path.isfile(tmp_path / "run" / "final" / "model.safetensors")
    scored_in = {int(p) for p in pids.read_text().split()}
    assert scored_in and os.getpid() not in scored_in  # reward.isolation: process, the default
    assert {"reward/starts_with_digit", "reward_std/starts_with_digit"} <= metric_keys(
        tmp_path / "run"
    )


def test_functions_without_a_reward_section_are_summed(tiny_model, tmp_path):
    datasets = pytest.importorskip("datasets")

    def one(prompts, completions, **columns):
        return [1.0] * len(completions)

    def half(completions, **kwargs):  # TRL's style: keywords, prompts among the rest
        assert "prompts" in kwargs and "answer" in kwargs
        return [0.5] * len(completions)

    ds = datasets.Dataset.from_list(addition_rows(0)[0][:8])
    summary = grpo_core.train(small(tiny_model, tmp_path / "run"), rewards=[one, half], dataset=ds)
    assert summary["first_reward"] == pytest.approx(1.5)
    written = json.loads((tmp_path / "run" / "config.json").read_text())
    assert written["data"]["columns"] == ["answer"]  # every field but the prompt
    components = written["reward"]["options"]["components"]
    assert [c["as"] for c in components] == ["one", "half"]  # the names they are logged under
    # nested functions: only this process has them (a resume from the CLI says so)
    assert [c["name"] for c in components] == ["<python>:one", "<python>:half"]


def test_an_unpicklable_function_runs_inline_with_a_notice(tiny_model, tmp_path, capsys):
    lock = threading.Lock()

    def locked(prompts, completions, **columns):
        with lock:
            return [float(len(c) > 0) for c in completions]

    cfg = small(tiny_model, tmp_path / "run", steps=1)
    summary = grpo_core.train(cfg, rewards={"locked": locked}, dataset=addition_rows(0)[0][:4])
    assert summary["steps"] == 1
    assert "cannot be pickled" in capsys.readouterr().err


def test_preflight_runs_before_a_model_loads(tmp_path):
    def needs_solution(prompts, completions, solution, **columns):
        return [0.0] * len(completions)

    needs_solution.columns = ("solution",)
    cfg = {"model": {"name_or_path": str(tmp_path / "no-model")}}
    with pytest.raises(ConfigError) as info:
        grpo_core.train(cfg, rewards=[needs_solution], dataset=[{"prompt": "1+1=", "answer": "2"}])
    text = "\n".join(info.value.problems)
    assert "model.name_or_path" in text and "the reward reads ['solution']" in text


def test_rewards_need_names_and_must_not_shadow_plugins():
    with pytest.raises(UserError, match="a lambda"):
        grpo_core.train({}, rewards=[lambda p, c, **k: [0.0] * len(c)])
    with pytest.raises(UserError, match=r"rewards\[1\]: found int 5, expected a function"):
        grpo_core.train({}, rewards=[len, 5])
    with pytest.raises(UserError, match="reward plugin from grpo-core"):
        grpo_core.train({}, rewards={"math": len})


REWARD_FILE = """
import os

with open("pids", "a") as f:  # loaded by a process (the trainer's first, at validation)
    f.write(f"load {os.getpid()}\\n")


def brevity(prompts, completions, **columns):
    with open("pids", "a") as f:  # called by a process
        f.write(f"call {os.getpid()}\\n")
    return [1.0 if len(c) < 3 else 0.0 for c in completions]
"""


def test_a_reward_file_named_in_the_config_runs_in_the_worker(tiny_model, addition_data, tmp_path):
    (tmp_path / "my_rewards.py").write_text(REWARD_FILE)
    cfg = make_config(
        tiny_model,
        addition_data,
        str(tmp_path / "run"),
        train={"steps": 1, "prompts_per_step": 2},
        reward={
            "name": "weighted",
            "options": {"components": [{"name": "my_rewards.py:brevity"}, {"name": "math"}]},
        },
    )
    p = run_grpo("train", write_config(tmp_path / "c.json", cfg), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    lines = [line.split() for line in (tmp_path / "pids").read_text().splitlines()]
    trainer = lines[0][1]
    calls = {pid for what, pid in lines if what == "call"}
    assert lines[0][0] == "load" and calls and trainer not in calls
    assert "reward/my_rewards.py:brevity" in metric_keys(tmp_path / "run")


@pytest.mark.parametrize(
    "name,expected",
    [
        ("missing.py:f", "file not found: missing.py"),
        ("json:no_such_function", "json has no function 'no_such_function'"),
        ("no_such_module_xyz:f", "cannot import no_such_module_xyz"),
    ],
)
def test_bad_references_are_one_line_errors(name, expected):
    cfg = {
        "model": {"name_or_path": "m"},
        "data": {"path": os.path.join(ROOT, "tests", "data", "prompts.jsonl")},
        "reward": {"name": "weighted", "options": {"components": [{"name": name}]}},
    }
    with pytest.raises(ConfigError) as info:
        config.validate(cfg)
    assert info.value.problems[0].startswith("reward.options.components[0].name: ")
    assert expected in info.value.problems[0]


@pytest.mark.parametrize(
    "dataset,expected",
    [
        (["2+3=", "1+1="], r"dataset\[0\]: found str '2\+3=', expected a mapping"),
        ([{"prompt": "p", "answer": 10**5000}], r"dataset\[0\]\.answer: an integer of 16610 bits"),
    ],
)
def test_in_memory_data_of_the_wrong_shape_is_one_line(dataset, expected):
    with pytest.raises(UserError, match=expected):
        grpo_core.train({}, rewards=[len], dataset=dataset)
