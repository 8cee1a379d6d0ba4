"""Callback plugins (plugin API 3): called at the loop's boundaries in order, a stop asked at a
step's end ends the run there with its final model, and a wrong name is a one-line error."""

from __future__ import annotations

import json
import os
import types

import pytest
from helpers import make_config

import grpo_core
from grpo_core import config
from grpo_core.errors import ConfigError
from grpo_core.hookspecs import Callback, hookimpl
from grpo_core.registry import registry
from grpo_core.trainer import train

CALLS: list[tuple] = []


class Recorder(Callback):
    def __init__(self, stop_after: int | None = None):
        self.stop_after = stop_after

    def on_train_begin(self, run_dir, config, start_step):
        CALLS.append(("begin", os.path.basename(run_dir), start_step, "callbacks" in config))

    def on_step_end(self, step, metrics):
        CALLS.append(("step", step, metrics["step"], "reward" in metrics))
        return step == self.stop_after

    def on_save(self, step, path):
        CALLS.append(("save", step, os.path.basename(path)))

    def on_train_end(self, summary):
        CALLS.append(("end", summary["steps"]))


def register_recorder():
    module = types.ModuleType("recorder_callback_for_tests")
    module.GRPO_CORE_API = (3,)
    schema = {"type": "object", "properties": {"stop_after": {"type": ["integer", "null"]}}}
    module.callback = hookimpl(
        lambda register: register("recorder", Recorder, schema=schema), specname="callback"
    )
    registry().add(module, "test-callback")


def test_callbacks_see_each_boundary_and_can_stop_the_run(tiny_model, addition_data, tmp_path):
    register_recorder()
    CALLS.clear()
    out = str(tmp_path / "run")
    cfg = config.validate(
        make_config(
            tiny_model,
            addition_data,
            out,
            train={"steps": 4, "prompts_per_step": 4, "micro_batch_groups": 2},
            output={"dir": out, "progress": False, "checkpoint_every": 1, "keep_last": 4},
            callbacks=[{"name": "recorder", "options": {"stop_after": 1}}],
        )
    )
    summary = train(cfg)
    assert CALLS == [
        ("begin", "run", 0, True),
        ("step", 0, 0, True),
        ("save", 1, "step-00000001"),
        ("step", 1, 1, True),  # asks to stop: step 2 and 3 never run
        ("save", 2, "step-00000002"),
        ("end", 2),
    ]
    assert summary["steps"] == 2
    assert len(open(os.path.join(out, "metrics.jsonl")).readlines()) == 2
    assert os.path.isfile(os.path.join(out, "final", "model.safetensors"))


def test_an_unknown_callback_is_one_line_naming_the_entry():
    with pytest.raises(ConfigError) as err:
        config.validate(
            make_config("m", "d.jsonl", "out", callbacks=[{"name": "no_such_callback"}])
        )
    assert str(err.value).startswith("callbacks[0].name: ")
    assert "\n" not in str(err.value)


def test_the_contract_version_serves_api_2_plugins_too():
    assert grpo_core.PLUGIN_API_VERSION == 4
    # every built-in still declares API 2 and loads
    assert {name for kind, name in registry().plugins if kind == "reward"} >= {"math", "format"}


def test_callbacks_and_the_attention_kernel_may_change_on_resume():
    from grpo_core.store.checkpoint import config_differences

    saved = config.validate(make_config("m", "d.jsonl", "out"))
    changed = {
        **saved,
        "callbacks": [{"name": "recorder", "options": {}}],
        "model": {**saved["model"], "attn_implementation": "eager"},
        "train": {**saved["train"], "mini_batches": 2},
    }
    # the number of updates a step takes is part of the run: still refused
    assert config_differences({"config": saved}, changed) == [
        "train.mini_batches: checkpoint 1, config 2"
    ]


def test_callback_objects_from_python(tiny_model, addition_data, tmp_path):
    CALLS.clear()
    out = str(tmp_path / "run")
    first, second = Recorder(stop_after=0), Recorder()
    summary = grpo_core.train(
        make_config(tiny_model, addition_data, out, train={"steps": 3}),
        callbacks=[first, second],
    )
    assert summary["steps"] == 1  # the first object asked to stop after step 0
    # both objects, in order, as themselves (Recorder, then Recorder_2)
    assert [c[0] for c in CALLS] == ["begin", "begin", "step", "step", "end", "end"]
    assert json.load(open(os.path.join(out, "config.json")))["callbacks"] == [
        {"name": "Recorder", "options": {}},
        {"name": "Recorder_2", "options": {}},
    ]
    with pytest.raises(grpo_core.UserError, match=r"^callbacks\[0\]: object does not derive"):
        grpo_core.train(make_config(tiny_model, addition_data, out), callbacks=[object()])
