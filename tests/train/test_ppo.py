"""PPO with a critic: GAE, whitening and the clipped value loss against hand values, and the
``ppo`` baseline in real tiny runs (training, exact resume, refusals)."""

from __future__ import annotations

import json
import os

import pytest
import torch
from helpers import make_config
from safetensors.torch import load_file

from grpo_core import config, preflight
from grpo_core.errors import ConfigError, UserError
from grpo_core.loss.critic import gae, masked_whiten, terminal_rewards, value_loss
from grpo_core.trainer import train

F64 = torch.float64


def t(rows):
    return torch.tensor(rows, dtype=F64)


def test_terminal_rewards_sit_on_the_last_model_token():
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 1], [0, 0, 0]])
    out = terminal_rewards(torch.tensor([1.0, 2.0, 3.0, 4.0]), mask)
    assert out.tolist() == [[0, 0, 1], [0, 2, 0], [0, 0, 3], [0, 0, 0]]


def test_gae_by_hand():
    gamma, lam = 0.9, 0.8  # gamma * lam = 0.72
    rewards = t([[0, 0, 1], [0, 2, 0], [0, 0, 1]])
    values = t([[0.5, 0.6, 0.7], [1.0, 0.5, 9.0], [0.2, 7.0, 0.4]])
    mask = t([[1, 1, 1], [1, 1, 0], [1, 0, 1]])  # row 1 padded; row 2 an environment token
    adv, ret = gae(rewards, values, mask, gamma, lam)
    # row 0: delta_2 = 1 - 0.7 = 0.3; delta_1 = 0.9 * 0.7 - 0.6 = 0.03, A_1 = 0.03 + 0.72 * 0.3
    # = 0.246; delta_0 = 0.9 * 0.6 - 0.5 = 0.04, A_0 = 0.04 + 0.72 * 0.246 = 0.21712
    # row 1: A_1 = 2 - 0.5 = 1.5; A_0 = 0.9 * 0.5 - 1 + 0.72 * 1.5 = 0.53 (the pad's 9 unused)
    # row 2: A_2 = 1 - 0.4 = 0.6; the environment token is skipped: A_0 = 0.9 * 0.4 - 0.2
    # + 0.72 * 0.6 = 0.592 (its value 7 unused)
    expected = [[0.21712, 0.246, 0.3], [0.53, 1.5, 0.0], [0.592, 0.0, 0.6]]
    torch.testing.assert_close(adv, t(expected))
    torch.testing.assert_close(ret, (t(expected) + values) * mask)


def test_gae_with_gamma_and_lambda_one_is_the_return_minus_the_value():
    values, mask = t([[0.3, -0.2, 0.9, 5.0]]), t([[1, 1, 1, 0]])
    rewards = terminal_rewards(torch.tensor([2.0]), mask).double()
    adv, ret = gae(rewards, values, mask, 1.0, 1.0)
    torch.testing.assert_close(adv, t([[1.7, 2.2, 1.1, 0.0]]))
    torch.testing.assert_close(ret, t([[2.0, 2.0, 2.0, 0.0]]))


def test_masked_whiten_by_hand():
    # valid 1, 2, 3: mean 2, unbiased variance 1
    out = masked_whiten(t([[1, 2], [3, 100]]), t([[1, 1], [1, 0]]))
    torch.testing.assert_close(out, t([[-1, 0], [1, 0]]), rtol=1e-6, atol=1e-6)


def test_clipped_value_loss_by_hand():
    values, old, ret = t([[1.0, 0.6, 0.0]]), t([[0.5, 0.5, 0.5]]), t([[2.0, 0.0, 0.0]])
    loss, clipped = value_loss(values, old, ret, 0.2)
    # token 0: (1 - 2)^2 = 1 against (0.7 - 2)^2 = 1.69: clipped, 0.845; token 1: inside the
    # clip, 0.36 / 2; token 2: (0 - 0)^2 = 0 against (0.3 - 0)^2 = 0.09: clipped, 0.045
    torch.testing.assert_close(loss, t([[0.845, 0.18, 0.045]]))
    assert clipped.tolist() == [[True, False, True]]
    plain, none = value_loss(values, old, ret, None)
    torch.testing.assert_close(plain, t([[0.5, 0.18, 0.0]]))
    assert not none.any()


def cfg(path, data, out, steps=3, ckpt=0, **sections):
    return config.validate(
        make_config(
            path,
            data,
            str(out),
            reward={"name": "format", "options": {"tags": [], "patterns": ["[0-9]"]}},
            baseline={"name": "ppo", "options": {"lr": 1e-3, "lam": 0.9}},
            sampling={"group_size": 4, "max_new_tokens": 6},
            train={
                "steps": steps,
                "prompts_per_step": 4,
                "micro_batch_groups": 2,
                "seed": 2,
                "inner_iterations": 2,
            },
            optimizer={"lr": 1e-2},
            runtime={"device": "cpu", "threads": 1},
            output={
                "dir": str(out),
                "progress": False,
                "samples_every": 1,
                "checkpoint_every": ckpt,
                "tensorboard": "off",
            },
            **sections,
        )
    )


def records(out) -> list[dict]:
    return [json.loads(x) for x in open(os.path.join(out, "metrics.jsonl"))]


def weights(out) -> dict:
    return load_file(os.path.join(out, "final", "model.safetensors"))


def test_ppo_trains_its_critic_and_resumes_exactly(tiny_model, addition_data, tmp_path):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    train(cfg(tiny_model, addition_data, whole))
    rows = records(whole)
    assert rows[0]["critic/values"] == 0.0  # the head starts at zero
    assert all(r["critic/values"] != 0.0 for r in rows[1:])  # and learns
    assert all(r["critic/value_loss"] > 0 and r["critic/grad_norm"] > 0 for r in rows)
    before = load_file(os.path.join(tiny_model, "model.safetensors"))
    assert any(not torch.equal(before[k], weights(whole)[k]) for k in before)
    adv = [json.loads(x)["advantage"] for x in open(whole / "samples.jsonl")]
    assert len(set(adv)) > 2  # per-token advantages, shown as each completion's mean
    train(cfg(tiny_model, addition_data, cut, steps=2, ckpt=1))
    ckpt = cut / "checkpoints" / "step-00000002"  # the critic, checksummed like the rest
    assert "baseline.pt" in json.load(open(ckpt / "state.json"))["files"]
    train(cfg(tiny_model, addition_data, cut, steps=3, ckpt=1), resume=True)
    keys = ("reward", "loss", "critic/value_loss", "critic/values")
    assert [[r[k] for k in keys] for r in records(cut)] == [[r[k] for k in keys] for r in rows]
    a, b = weights(whole), weights(cut)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_sharded_and_lora_runs_are_refused_in_one_line(tiny_model, addition_data, tmp_path):
    with pytest.raises(UserError, match=r"ppo \(a critic\) is not supported with model.lora"):
        train(
            cfg(
                tiny_model,
                addition_data,
                tmp_path / "lora",
                steps=1,
                model={"name_or_path": tiny_model, "lora": {"r": 2}},
            )
        )
    with pytest.raises(ConfigError) as err:
        preflight.check(
            cfg(tiny_model, addition_data, tmp_path / "fsdp", distributed={"strategy": "fsdp"})
        )
    assert "critic.name: ppo (a critic) runs in one process only" in str(err.value)
