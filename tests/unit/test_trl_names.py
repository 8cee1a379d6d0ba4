"""A TRL user's names: unknown keys that are TRL's (or verl's) say where ours live, a flat
TRL-style mapping loads, and `1e-3` in a YAML file is a number."""

from __future__ import annotations

import dataclasses
import os

import pytest
from helpers import ROOT

from grpo_core import config
from grpo_core.cli.main import main
from grpo_core.config import trl_names
from grpo_core.config.file import parse_yaml, read_file
from grpo_core.config.view import view
from grpo_core.errors import ConfigError

PROMPTS = os.path.join(ROOT, "tests", "data", "prompts.jsonl")
BASE = f"""model: {{name_or_path: m}}
data: {{path: {PROMPTS}, columns: [answer]}}
reward: {{name: math}}
"""

CASES = [
    (
        "num_generations: 8\n",
        "(top level)",
        "num_generations: unknown key 'num_generations': did you mean sampling.group_size "
        "(TRL's name)?",
    ),
    ("sampling: {num_generations: 8}\n", "sampling", "sampling.group_size (TRL's name)"),
    ("beta: 0.04\n", "", "beta: unknown key 'beta': did you mean kl.options.coef (TRL's name"),
    (
        "optimizer: {learning_rate: 1.0e-6}\n",
        "",
        "optimizer.learning_rate: unknown key 'learning_rate': did you mean optimizer.lr "
        "(TRL's name)?",
    ),
    ("lr_scheduler_type: cosine\n", "", "did you mean optimizer.lr_schedule (TRL's name)?"),
    ("loss_type: dr_grpo\n", "", "objective.aggregation (TRL's name; grpo: seq_mean_token_mean"),
    (
        "objective: {name: grpo, options: {epsilon_high: 0.28}}\n",
        "",
        "objective.options.epsilon_high: unknown key 'epsilon_high': did you mean "
        "objective.options.clip_high (TRL's name)?",
    ),
    (
        "warmup_ratio: 0.1\n",
        "",
        "warmup_ratio: unknown key 'warmup_ratio': did you mean optimizer.warmup_ratio?",
    ),
    ("kl_loss_coef: 0.001\n", "", "did you mean kl.options.coef (verl's name"),
    ("lr: 0.001\n", "", "lr: unknown key 'lr': did you mean optimizer.lr?"),
]


@pytest.mark.parametrize("extra,_where,expected", CASES, ids=[c[0].split(":")[0] for c in CASES])
def test_trl_names_point_at_ours(tmp_path, capsys, extra, _where, expected):
    path = tmp_path / "c.yaml"
    path.write_text(BASE + extra)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert expected in err, err
    assert all(line.startswith("error: ") for line in err.strip().splitlines())


def test_unknown_key_without_a_meaning_keeps_the_plain_line():
    with pytest.raises(ConfigError) as info:
        config.validate({**parse_yaml(BASE), "num_generations": 4, "trainer": {}})
    assert info.value.problems == [
        "num_generations: unknown key 'num_generations': did you mean sampling.group_size "
        "(TRL's name)?",
        "(top level): unknown key(s) ['trainer']; expected keys from "
        + str(sorted(config.CORE_SCHEMA["properties"])),
    ]


def test_every_mapped_path_exists_in_the_schema():
    for name, (path, _) in {**trl_names.TRL, **trl_names.VERL}.items():
        node = config.CORE_SCHEMA
        for part in path.split("."):
            if part == "options" or "properties" not in node:
                break  # a plugin's options: checked by the plugin's own schema
            assert part in node["properties"], (name, path)
            node = node["properties"][part]


def test_flat_trl_mapping_loads():
    flat = {
        "model_name_or_path": "m",
        "dataset_name": PROMPTS,
        "num_generations": 4,
        "learning_rate": 1e-5,
        "beta": 0.0,
        "epsilon_high": 0.28,
        "max_steps": 3,
        "use_vllm": False,
        "steps_per_generation": 2,
        "optim": "adamw_torch_fused",
        "attn_implementation": "sdpa",
        "reward": {"name": "math"},
    }
    cfg = config.validate(trl_names.from_trl(flat))
    assert cfg["sampling"]["group_size"] == 4 and cfg["optimizer"]["lr"] == 1e-5
    assert cfg["kl"]["name"] == "fixed" and cfg["kl"]["options"]["coef"] == 0.0
    assert cfg["objective"]["options"]["clip_high"] == 0.28 and cfg["train"]["steps"] == 3
    assert cfg["generator"]["name"] == "hf" and cfg["data"]["path"] == PROMPTS
    assert cfg["train"]["mini_batches"] == 2 and cfg["optimizer"]["name"] == "adamw"
    assert cfg["model"]["attn_implementation"] == "sdpa"


def test_generation_kwargs_become_sampling_keys_checked_by_the_schema():
    flat = {
        "model_name_or_path": "m",
        "dataset_name": PROMPTS,
        "reward": {"name": "math"},
        "generation_kwargs": {"top_p": 0.9, "top_k": 20, "min_p": 0.05, "stop_strings": ["\n"]},
    }
    cfg = config.validate(trl_names.from_trl(flat))
    sampling = cfg["sampling"]
    assert (sampling["top_p"], sampling["top_k"], sampling["min_p"]) == (0.9, 20, 0.05)
    assert sampling["stop"] == ["\n"]
    with pytest.raises(ConfigError) as info:
        trl_names.from_trl({**flat, "generation_kwargs": {"no_repeat_ngram_size": 3}})
    assert info.value.problems == [
        "generation_kwargs.no_repeat_ngram_size: not a sampling setting here; the generator "
        "takes ['max_new_tokens', 'min_p', 'repetition_penalty', 'stop', 'temperature', "
        "'top_k', 'top_p']"
    ]
    with pytest.raises(ConfigError) as info:
        config.validate(trl_names.from_trl({**flat, "generation_kwargs": {"top_p": 2}}))
    assert info.value.problems[0].startswith("sampling.top_p: ")


def test_flat_trl_mapping_refuses_names_that_need_a_decision():
    with pytest.raises(ConfigError) as info:
        trl_names.from_trl({"loss_type": "dapo", "per_device_train_batch_size": 8})
    assert info.value.problems[0].startswith("loss_type: set objective.aggregation instead")
    assert len(info.value.problems) == 2


def test_yaml_file_reads_exponents_without_a_dot_as_numbers(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        BASE + "optimizer: {lr: 1e-3, weight_decay: 5E-2}\n"
        "train: {steps: 3}\nsampling: {stop: ['1e5']}\n"
    )
    cfg = config.validate(read_file(str(path)))
    assert cfg["optimizer"]["lr"] == 0.001 and cfg["optimizer"]["weight_decay"] == 0.05
    assert cfg["sampling"]["stop"] == ["1e5"]  # quoted: still a string
    assert parse_yaml("a: 1e\nb: e5\nc: 1_000\n") == {"a": "1e", "b": "e5", "c": 1000}


def test_yaml_exponent_reading_leaves_pyyaml_itself_alone():
    import yaml

    assert yaml.safe_load("a: 1e-3") == {"a": "1e-3"}


def test_a_trl_setting_we_lack_says_what_to_do_instead():
    with pytest.raises(ConfigError) as info:
        config.validate({**parse_yaml(BASE), "use_liger_loss": True})
    assert info.value.problems == [
        "use_liger_loss: unknown key 'use_liger_loss': a TRL setting grpo-core does not have: "
        "the log-probs are computed in chunks (runtime.logprob_chunk) (docs/trl.md)"
    ]


def test_the_migration_page_lists_every_name():
    with open(os.path.join(ROOT, "docs", "trl.md"), encoding="utf-8") as f:
        page = f.read()
    for table in (trl_names.TRL, trl_names.VERL):
        for name, (path, _) in table.items():
            assert f"| `{name}` | `{path}` |" in page, name
    for name in trl_names.MISSING:
        assert f"| `{name}` |" in page, name


def test_trl_metric_names_with_the_train_prefix():
    from grpo_core.observe.tracking import metric_name

    assert metric_name("lr", "trl_train") == "train/learning_rate"
    assert metric_name("reward/format", "trl_train") == "train/rewards/format/mean"
    assert metric_name("reward", "trl_train") == "train/reward"
    assert metric_name("reward_std/format", "trl") == "rewards/format/std"
    assert metric_name("lr", "trl") == "learning_rate" and metric_name("lr", "native") == "lr"
    cfg = config.validate({**parse_yaml(BASE), "output": {"metric_names": "trl_train"}})
    assert cfg["output"]["metric_names"] == "trl_train"


def test_warmup_ratio_is_a_share_of_the_updates():
    import torch

    from grpo_core.engine.schedules import build, problems

    cfg = config.validate(
        {**parse_yaml(BASE), "optimizer": {"warmup_ratio": 0.25, "lr_schedule": "linear"}}
    )
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    sched = build(opt, view(cfg).optimizer, 10)  # ceil(2.5) = 3 warm-up updates
    lrs = []
    for _ in range(4):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([0.0, 1 / 3, 2 / 3, 1.0])
    both = dataclasses.replace(view(cfg).optimizer, warmup_steps=2)
    assert problems(both, 10) == [
        "optimizer.warmup_ratio: 0.25 set beside optimizer.warmup_steps 2; keep one"
    ]


def test_chat_template_kwargs_reach_the_template(tiny_model):
    from grpo_core.data.prompts import make_batch
    from grpo_core.store.models import load_tokenizer

    cfg = config.validate({**parse_yaml(BASE), "model": {"name_or_path": tiny_model}})
    tokenizer = load_tokenizer(view(cfg).model)
    tokenizer.chat_template = (
        "{% if enable_thinking is defined and not enable_thinking %}"
        "/no_think {% endif %}{{ messages[-1]['content'] }}"
    )
    rows = [{"prompt": "1+1=", "answer": "2"}]
    data = view(cfg).data
    plain = make_batch(rows, data, tokenizer)
    off = make_batch(
        rows, dataclasses.replace(data, chat_template_kwargs={"enable_thinking": False}), tokenizer
    )
    assert plain.prompts == ["1+1="] and off.prompts == ["/no_think 1+1="]
