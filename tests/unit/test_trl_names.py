"""A TRL user's names: unknown keys that are TRL's (or verl's) say where ours live, a flat
TRL-style mapping loads, and `1e-3` in a YAML file is a number."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
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
    ("entropy_coef: 0.01\n", "", "did you mean objective.entropy_coef"),
    (
        "logging_steps: 5\n",
        "",
        "a TRL setting with no counterpart here: every step's metrics are logged",
    ),
    ("reward_funcs: [f]\n", "", "does not have: grpo_core.train(rewards=[...])"),
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


def test_flat_trl_mapping_maps_the_common_script_and_refuses_in_one_line_each():
    flat = {
        "model_name_or_path": "m",
        "dataset_name": PROMPTS,
        "reward": {"name": "math"},
        "loss_type": "dapo",
        "scale_rewards": "batch",
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 4,
        "num_generations": 8,
        "adam_beta2": 0.99,
        "max_steps": 5,
        "num_train_epochs": 3,  # max_steps wins, as in TRL
        "entropy_coef": 0.01,
    }
    cfg = config.validate(trl_names.from_trl(flat))
    assert cfg["objective"]["aggregation"] == "token_mean"
    assert cfg["baseline"] == {"name": "batch_std", "options": {"eps": 1e-4}}
    assert cfg["train"]["prompts_per_step"] == 4 and cfg["train"]["mini_batches"] == 1
    assert cfg["optimizer"]["betas"] == [0.9, 0.99] and cfg["objective"]["entropy_coef"] == 0.01
    with pytest.raises(ConfigError) as info:
        trl_names.from_trl(
            {"loss_type": "sapo", "num_train_epochs": 2, "use_liger_kernel": True, "fp16": True}
        )
    problems = info.value.problems
    assert len(problems) == 4 and all("instead" in p for p in problems), problems
    assert any(p.startswith("loss_type: 'sapo' has no counterpart") for p in problems)


def _trl_fields():
    pytest.importorskip("trl", reason="TRL is a test-only dependency (pip install trl)")
    return trl_names.trl_defaults()


def test_every_grpoconfig_field_is_mapped_refused_or_ignored():
    """Fails when a TRL release adds a GRPOConfig field the table in trl_names lacks."""
    fields, version = _trl_fields()
    tables = (trl_names.TRL, trl_names.MISSING, trl_names.IGNORED)
    lacking = [f for f in fields if not any(f in t for t in tables)]
    assert lacking == [], f"TRL {version}: add these to grpo_core/config/trl_names.py"
    twice = [f for f in fields if sum(f in t for t in tables) > 1]
    assert twice == []
    # the defaults from_trl fills in when a script sets only some of the batch names
    assert {k: fields[k] for k in trl_names._TRL_DEFAULTS} == trl_names._TRL_DEFAULTS


def test_the_migration_page_is_generated_from_the_table():
    from grpo_core.config import CORE_SCHEMA

    fields, version = _trl_fields()
    with open(os.path.join(ROOT, "docs", "trl.md"), encoding="utf-8") as f:
        page = f.read()
    generated = trl_names.markdown(fields, version, CORE_SCHEMA)
    assert generated in page + "\n", (
        "docs/trl.md is stale: python -m grpo_core.config.trl_names docs/trl.md"
    )


def test_a_grpoconfig_counts_only_the_fields_set_away_from_trls_defaults(capsys):
    trl = pytest.importorskip("trl")
    args = trl.GRPOConfig(
        output_dir="runs/x",
        use_cpu=True,
        learning_rate=1e-5,
        num_generations=4,
        loss_type="dr_grpo",
        logging_steps=5,
        max_steps=3,
    )
    assert set(trl_names.changed_fields(args)) == {
        "output_dir",
        "use_cpu",
        "learning_rate",
        "num_generations",
        "loss_type",
        "logging_steps",
        "max_steps",
    }
    flat = trl_names.from_trl(args, ["math"])
    notice = capsys.readouterr().err
    assert notice.count("\n") == 1 and "logging_steps (every step's metrics are logged" in notice
    cfg = config.validate(
        {
            **flat,
            "model": {"name_or_path": "m"},
            "data": {"path": PROMPTS, "columns": ["answer"]},
            "reward": {"name": "math"},
        }
    )
    assert cfg["objective"]["aggregation"] == "seq_mean_token_sum_norm"
    assert cfg["train"]["prompts_per_step"] == 2  # 8 completions per device / 4 generations
    assert cfg["runtime"]["device"] == "cpu" and cfg["optimizer"]["lr"] == 1e-5


# --- numbers: TRL's advantages and losses against ours on the same random batch -------------


def _trl_advantages(rewards: torch.Tensor, G: int, scale: str) -> torch.Tensor:
    """TRL's advantage computation (GRPOTrainer._generate_and_score_completions, one reward
    function, sum_then_normalize), written from its source around TRL's own nanstd."""
    from trl.trainer.utils import nanstd

    grouped = rewards.view(-1, G)
    mean = torch.nanmean(grouped, dim=1).repeat_interleave(G)
    if scale == "batch":
        std = nanstd(rewards).expand_as(rewards)
    else:
        std = nanstd(grouped, dim=1).repeat_interleave(G)
    adv = rewards - mean
    return adv if scale == "none" else adv / (std + 1e-4)


@pytest.mark.parametrize("scale", ["group", "batch", "none", True, False])
def test_scale_rewards_gives_trls_advantages(scale):
    pytest.importorskip("trl")
    import grpo_core

    torch.manual_seed(0)
    P, G = 5, 4
    rewards = torch.randint(0, 3, (P * G,)).float() + torch.rand(P * G)
    baseline = trl_names.from_trl({"scale_rewards": scale})["baseline"]
    ours = grpo_core.create("baseline", baseline["name"], baseline.get("options"))
    got = ours.advantages(rewards.view(P, G)).reshape(-1)
    name = {True: "group", False: "none"}.get(scale, scale)
    assert torch.allclose(got, _trl_advantages(rewards, G, name), rtol=1e-5, atol=1e-6)


def test_reinforce_pp_is_not_trls_batch_scaling():
    """The two formulas docs/trl.md explains: REINFORCE++ divides the group-centred
    advantages by their own batch std; TRL's batch scaling divides by the raw rewards'."""
    pytest.importorskip("trl")
    import grpo_core

    rewards = torch.tensor([[1.0, 0.0, 1.0, 0.0], [3.0, 3.0, 3.0, 2.0]])
    pp = grpo_core.create("baseline", "reinforce_pp", {}).advantages(rewards)
    trl_batch = _trl_advantages(rewards.reshape(-1), 4, "batch").view(2, 4)
    centred = rewards - rewards.mean(1, keepdim=True)
    assert torch.allclose(pp, (centred - centred.mean()) / (centred.std() + 1e-6), atol=1e-5)
    assert torch.allclose(trl_batch, centred / (rewards.std() + 1e-4), atol=1e-5)
    assert not torch.allclose(pp, trl_batch, atol=1e-2)


def _trl_loss(logp, old, adv, mask, loss_type, eps_low, eps_high, max_len):
    """TRL's loss for one micro-batch per step on one process (GRPOTrainer._compute_loss,
    written from its source): the clipped surrogate, then each loss_type's reduction."""
    ratio = torch.exp(logp - old)
    if loss_type == "cispo":
        per_token = -torch.clamp(ratio, max=eps_high).detach() * adv[:, None] * logp
    else:
        clipped = torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
        per_token = -torch.min(ratio * adv[:, None], clipped * adv[:, None])
    masked = per_token * mask
    if loss_type == "grpo":
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "dr_grpo":
        return masked.sum() / (per_token.size(0) * max_len)
    return masked.sum() / mask.sum().clamp(min=1.0)  # bnpo, dapo, cispo with one micro-batch


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dapo", "dr_grpo", "cispo"])
def test_loss_type_gives_trls_loss(loss_type):
    """Values equal for the clipped losses; for cispo the gradients (TRL's value is
    -w A log p, ours -w A: docs/trl.md)."""
    import grpo_core
    from grpo_core.loss.losses import Normaliser, aggregate

    torch.manual_seed(1)
    B, T, max_len = 6, 7, 9
    old = -torch.rand(B, T) * 3
    logp = (old + torch.randn(B, T) * 0.3).requires_grad_(True)
    adv = torch.randn(B)
    mask = (torch.rand(B, T) > 0.3).float()
    mask[:, 0] = 1
    eps_high = 0.28 if loss_type != "cispo" else 1.5
    cfg = trl_names.from_trl({"loss_type": loss_type, "epsilon": 0.2, "epsilon_high": eps_high})
    objective = cfg["objective"]
    options = {k: v for k, v in objective.get("options", {}).items()}
    fn = grpo_core.create("objective", objective["name"], options)
    term = fn.fn(logp, old, adv, mask, **fn.options)
    ours = aggregate(term.loss, mask, objective["aggregation"], Normaliser.of(mask, max_len))
    theirs = _trl_loss(logp, old, adv, mask, loss_type, 0.2, eps_high, max_len)
    (g_ours,) = torch.autograd.grad(ours, logp)
    (g_theirs,) = torch.autograd.grad(theirs, logp)
    assert torch.allclose(g_ours, g_theirs, rtol=1e-5, atol=1e-7)
    if loss_type != "cispo":
        assert torch.allclose(ours, theirs, rtol=1e-6)


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
