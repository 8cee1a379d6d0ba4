"""DAPO's dynamic sampling: groups without signal replaced by groups of new prompts until the
batch is full, the cap on rounds, the data position on resume, and two processes."""

from __future__ import annotations

import json
import os

import pytest
import torch
from helpers import make_config, write_config
from safetensors.torch import load_file
from test_distributed import cfg_for, one_process, torchrun

from grpo_core import config
from grpo_core.errors import UserError
from grpo_core.samplers.dynamic import has_signal
from grpo_core.trainer import train

NAN = float("nan")
DIGIT = {"name": "format", "options": {"tags": [], "patterns": ["[0-9]"]}}


def test_has_signal_by_hand():
    grid = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, NAN], [0.5, 0.6, 0.5], [NAN, NAN, NAN]])
    assert has_signal(grid).tolist() == [False, True, True, False]
    # population std of (0.5, 0.6, 0.5) = sqrt(0.02 / 9) = 0.0471; of (0, 1): 0.5
    assert has_signal(grid, 0.047).tolist() == [False, True, True, False]
    assert has_signal(grid, 0.048).tolist() == [False, True, False, False]


def cfg(model, data, out, steps=3, rounds=4, ckpt=0, **extra):
    return config.validate(
        make_config(
            model,
            data,
            str(out),
            reward=DIGIT,
            sampling={"group_size": 4, "max_new_tokens": 6},
            groups={"dynamic_sampling": True, "max_rounds": rounds, **extra},
            train={"steps": steps, "prompts_per_step": 4, "micro_batch_groups": 2, "seed": 3},
            optimizer={"lr": 1e-2},
            runtime={"device": "cpu", "threads": 1},
            output={
                "dir": str(out),
                "progress": False,
                "samples_every": 0,
                "checkpoint_every": ckpt,
                "tensorboard": "off",
            },
        )
    )


def records(out) -> list[dict]:
    return [json.loads(x) for x in open(os.path.join(out, "metrics.jsonl"))]


def position(out, step) -> int:
    path = os.path.join(out, "checkpoints", f"step-{step:08d}", "state.json")
    return json.load(open(path))["data_position"]


def test_full_batches_of_groups_with_signal(tiny_model, addition_data, tmp_path):
    out = tmp_path / "full"
    train(cfg(tiny_model, addition_data, out, ckpt=3))
    rows = records(out)
    # the untrained model writes a digit in about 1 of 5 completions: many flat groups
    assert sum(r["groups/filtered"] for r in rows) > 0
    assert any(r["groups/rounds"] > 1 for r in rows)
    for r in rows:
        assert r["groups/filler"] == 0 and r["zero_std_frac"] == 0  # every group has signal
        assert r["groups/generated"] - r["groups/filtered"] == 4
        assert r["samples"] == 16
    # every prompt the steps consumed, and no other, is recorded in the data position
    assert position(out, 3) == sum(r["groups/generated"] for r in rows)


def test_the_cap_completes_the_batch_with_groups_left_out_of_the_loss(
    tiny_model, addition_data, tmp_path
):
    out = tmp_path / "cap"
    train(cfg(tiny_model, addition_data, out, rounds=1, ckpt=3, min_std=0.45))
    rows = records(out)
    assert all(r["groups/rounds"] == 1 and r["groups/generated"] == 4 for r in rows)
    # min_std 0.45 keeps only 2 right / 2 wrong (population std 0.5; 1 of 4: 0.433)
    assert all(r["groups/filler"] == r["groups/filtered"] for r in rows)
    assert any(r["groups/filler"] for r in rows)
    assert position(out, 3) == 12  # one round: the ordinary steps' prompts
    all_out = tmp_path / "all"  # every group filler: nothing is learnt
    train(cfg(tiny_model, addition_data, all_out, steps=1, rounds=1, min_std=10.0))
    (r,) = records(all_out)
    assert r["groups/filler"] == 4 and r["loss"] == 0.0 and r["grad_norm"] == 0.0
    before = load_file(os.path.join(tiny_model, "model.safetensors"))
    after = load_file(os.path.join(all_out, "final", "model.safetensors"))
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_reward_is_over_every_completion_generated_and_kept_groups_have_their_own(
    tiny_model, addition_data, tmp_path, monkeypatch
):
    """The logged ``reward`` is the policy's success rate: the mean over every completion each
    step generated, filtered groups included; ``reward_kept`` is over the groups trained on
    (not the filler). Read against what phases.score returned each round, and the summary
    counts the filler groups of the whole run."""
    from grpo_core import phases

    seen: list[torch.Tensor] = []
    score = phases.score

    def spy(run, step, sampled, *a, **k):
        got = score(run, step, sampled, *a, **k)
        seen.append((step, got.rewards.clone()))
        return got

    monkeypatch.setattr(phases, "score", spy)
    out = tmp_path / "reward"
    summary = train(cfg(tiny_model, addition_data, out, rounds=2, min_std=0.45))
    rows = records(out)
    for r in rows:
        drawn = torch.cat([x for s, x in seen if s == r["step"]])
        assert r["reward"] == pytest.approx(float(drawn.double().mean()), abs=1e-12)
        # min_std 0.45 keeps only groups of 2 right and 2 wrong: a kept mean of exactly 0.5
        assert r["groups/filler"] == 4 or r["reward_kept"] == 0.5, r
    assert any(r["reward"] != r["reward_kept"] for r in rows)
    assert summary["filler_groups"] == sum(r["groups/filler"] for r in rows) > 0


def test_resume_continues_the_data_order_exactly(tiny_model, addition_data, tmp_path):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    once = train(cfg(tiny_model, addition_data, whole, steps=4, min_std=0.45))
    train(cfg(tiny_model, addition_data, cut, steps=2, ckpt=1, min_std=0.45))
    resumed = train(cfg(tiny_model, addition_data, cut, steps=4, ckpt=1, min_std=0.45), True)
    # the summary after a resume totals the whole run, as one run's does
    for key in ("steps", "first_reward", "final_reward", "filler_groups"):
        assert resumed[key] == once[key], key
    assert resumed["steps_this_process"] == 2 and once["filler_groups"] > 0
    a, b = records(whole), records(cut)
    keys = ("reward", "groups/filtered", "groups/generated", "groups/rounds")
    assert [[r[k] for k in keys] for r in a] == [[r[k] for k in keys] for r in b]
    wa = load_file(os.path.join(whole, "final", "model.safetensors"))
    wb = load_file(os.path.join(cut, "final", "model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_refuses_flat_group_resampling_beside_it(tiny_model, addition_data, tmp_path):
    with pytest.raises(UserError, match="resample_zero_std_max"):
        train(cfg(tiny_model, addition_data, tmp_path / "x", resample_zero_std_max=2))


@pytest.mark.multiprocess
def test_two_processes_draw_the_same_groups_as_one(tiny_model, addition_data, tmp_path):
    runs = {}
    for n in (1, 2):
        out = str(tmp_path / f"n{n}")
        c = cfg_for(
            tiny_model,
            addition_data,
            out,
            "ddp" if n > 1 else "auto",
            groups={"dynamic_sampling": True, "max_rounds": 4},
            output={"dir": out, "progress": False, "samples_every": 0, "checkpoint_every": 3},
        )
        path = write_config(tmp_path / f"{n}.json", c)
        p = torchrun(path, nproc=n) if n > 1 else one_process(path)
        assert p.returncode == 0, p.stderr[-3000:]
        runs[n] = out
    one, two = records(runs[1]), records(runs[2])
    assert sum(r["groups/filtered"] for r in one) > 0
    keys = (
        "reward",
        "samples",
        "groups/filtered",
        "groups/generated",
        "groups/rounds",
        "groups/filler",
        "zero_std_frac",
    )
    for a, b in zip(one, two):  # the same groups, counted over both ranks
        assert [a[k] for k in keys] == [b[k] for k in keys]
        assert abs(a["loss"] - b["loss"]) < 1e-6
    assert position(runs[1], 3) == position(runs[2], 3)


@pytest.mark.parametrize("baseline", ["remax", "ppo"])
def test_with_greedy_completions_and_with_a_critic(tiny_model, addition_data, tmp_path, baseline):
    # ReMax's greedy completions and PPO's per-token targets follow the groups kept
    out = tmp_path / baseline
    c = cfg(tiny_model, addition_data, out, steps=2)
    c["baseline"] = {"name": baseline, "options": {}}
    c = config.validate(c)
    train(c)
    rows = records(out)
    assert all(r["groups/generated"] - r["groups/filtered"] == 4 for r in rows)
    assert all(r["samples"] == 16 and r["zero_std_frac"] == 0 for r in rows)
