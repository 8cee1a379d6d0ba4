"""Checkpoints, exact resume after SIGKILL, fault injection, the NaN guard."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import resource
import signal
import subprocess
import sys
import threading
import time
import types

import pytest
import torch
from helpers import ROOT, make_config, run_grpo, write_config
from safetensors.torch import load_file

from grpo_core import config
from grpo_core.errors import UserError
from grpo_core.hookspecs import Baseline, Generator, hookimpl
from grpo_core.registry import registry
from grpo_core.rollout import Rollout
from grpo_core.store.checkpoint import FAULT_PAUSE_ENV
from grpo_core.trainer import TrainingError, train

DIGIT = {"name": "format", "options": {"tags": [], "patterns": ["[0-9]"]}}


def resumable_config(tiny_model, addition_data, out, steps=8):
    return make_config(
        tiny_model,
        addition_data,
        out,
        reward={**DIGIT, "isolation": "inline"},  # one process fewer to start per run
        sampling={"group_size": 4, "max_new_tokens": 6},
        baseline={"name": "mixed"},
        kl={"name": "adaptive", "options": {"init_coef": 0.05}},
        train={"steps": steps, "prompts_per_step": 4, "micro_batch_groups": 2, "seed": 3},
        optimizer={"lr": 1e-2, "lr_schedule": "cosine", "warmup_steps": 2},
        runtime={"device": "cpu", "threads": 1},
        output={
            "dir": out,
            "checkpoint_every": 1,
            "keep_last": 2,
            "progress": False,
            "samples_every": 0,
        },
    )


def start(cfg_path, resume, env=None):
    args = [sys.executable, "-m", "grpo_core.cli", "train", cfg_path] + (
        ["--resume"] if resume else []
    )
    return subprocess.Popen(
        args,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
    )


def lines(run_dir):
    path = os.path.join(run_dir, "metrics.jsonl")
    return sum(1 for _ in open(path)) if os.path.exists(path) else 0


def wait_for(pred, timeout=600):
    # a hang guard, not a bound on speed: ten minutes, which a loaded machine cannot reach
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError("condition not reached")
        time.sleep(0.01)


def test_sigkill_and_resume_is_bitwise_identical(tiny_model, addition_data, tmp_path):
    ref_dir, run_dir = str(tmp_path / "ref"), str(tmp_path / "run")
    ref_cfg = write_config(
        tmp_path / "ref.json", resumable_config(tiny_model, addition_data, ref_dir)
    )
    cfg = write_config(tmp_path / "run.json", resumable_config(tiny_model, addition_data, run_dir))
    done = subprocess.run(
        [sys.executable, "-m", "grpo_core.cli", "train", ref_cfg],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    rng = random.Random(7)
    ckpts = os.path.join(run_dir, "checkpoints")
    kills = []
    # 1: a random point after step 2
    p = start(cfg, resume=False)
    wait_for(lambda: lines(run_dir) >= 2)
    time.sleep(rng.uniform(0, 0.2))
    p.send_signal(signal.SIGKILL)
    p.wait()
    kills.append(lines(run_dir))
    # 2: in the middle of a checkpoint write (the writer pauses after the weights)
    p = start(cfg, resume=True, env={FAULT_PAUSE_ENV: "3"})
    wait_for(lambda: os.path.isdir(ckpts) and any(d.startswith(".tmp-") for d in os.listdir(ckpts)))
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert any(d.startswith(".tmp-") for d in os.listdir(ckpts))  # a half-written checkpoint
    kills.append(lines(run_dir))
    # 3: another random point
    p = start(cfg, resume=True)
    target = min(lines(run_dir) + 2, 7)
    wait_for(lambda: lines(run_dir) >= target)
    time.sleep(rng.uniform(0, 0.2))
    p.send_signal(signal.SIGKILL)
    p.wait()
    kills.append(lines(run_dir))
    # finish
    p = start(cfg, resume=True)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    a = load_file(os.path.join(ref_dir, "final", "model.safetensors"))
    b = load_file(os.path.join(run_dir, "final", "model.safetensors"))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), kills
    steps = [json.loads(x)["step"] for x in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert steps == list(range(8))  # repeated steps were not logged twice
    assert len([d for d in os.listdir(ckpts) if d.startswith("step-")]) == 2  # keep_last
    assert not [d for d in os.listdir(ckpts) if d.startswith(".tmp-")]


def test_leftovers_of_a_crash_are_cleared_and_never_counted(tmp_path):
    from grpo_core.store.checkpoint import clear_leftovers, list_checkpoints

    root = tmp_path / "checkpoints"
    for name, files in (
        ("step-00000002", ["state.json", "model.safetensors"]),
        ("step-00000001", ["model.safetensors"]),  # its state.json gone
        (".del-step-00000000", ["x"]),
        (".tmp-step-00000003-9", ["y"]),
    ):
        (root / name).mkdir(parents=True)
        for f in files:
            (root / name / f).write_text("{}")
    assert list_checkpoints(str(root)) == [str(root / "step-00000002")]
    clear_leftovers(str(root))
    assert sorted(os.listdir(root)) == ["step-00000002"]


def test_incompatible_resume_is_refused_unless_forced(tiny_model, addition_data, tmp_path):
    out = str(tmp_path / "run")
    cfg = resumable_config(tiny_model, addition_data, out, steps=2)
    path = write_config(tmp_path / "c.json", cfg)
    assert run_grpo("train", path, cwd=ROOT).returncode == 0
    cfg["sampling"]["group_size"] = 8
    cfg["train"]["steps"] = 3
    path = write_config(tmp_path / "c2.json", cfg)
    refused = run_grpo("train", path, "--resume", cwd=ROOT)
    assert refused.returncode == 2
    assert "sampling.group_size: checkpoint 4, config 8" in refused.stderr
    assert run_grpo("train", path, "--resume", "--force", cwd=ROOT).returncode == 0


def test_resume_without_checkpoint_is_a_user_error(tiny_model, addition_data, tmp_path):
    path = write_config(
        tmp_path / "c.json", resumable_config(tiny_model, addition_data, str(tmp_path / "none"))
    )
    out = run_grpo("train", path, "--resume", cwd=ROOT)
    assert out.returncode == 2 and "no intact checkpoint" in out.stderr


def limit_file_size():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (60_000, 60_000))


def test_full_disk_during_checkpoint_leaves_nothing_half_written(
    tiny_model, addition_data, tmp_path
):
    out = str(tmp_path / "run")
    path = write_config(tmp_path / "c.json", resumable_config(tiny_model, addition_data, out, 3))
    p = subprocess.run(
        [sys.executable, "-m", "grpo_core.cli", "train", path],
        capture_output=True,
        text=True,
        cwd=ROOT,
        preexec_fn=limit_file_size,
    )
    assert p.returncode == 2, p.stderr
    assert "cannot write checkpoint" in p.stderr and "File too large" in p.stderr
    assert "Traceback" not in p.stderr
    assert os.listdir(os.path.join(out, "checkpoints")) == []


def test_full_disk_while_writing_metrics(tiny_model, addition_data, tmp_path):
    out = tmp_path / "run"
    first = resumable_config(tiny_model, addition_data, str(out), 1)
    assert run_grpo("train", write_config(tmp_path / "a.json", first), cwd=ROOT).returncode == 0
    (out / "metrics.jsonl").unlink()
    os.symlink("/dev/full", out / "metrics.jsonl")  # every write: No space left on device
    path = write_config(
        tmp_path / "c.json", resumable_config(tiny_model, addition_data, str(out), 2)
    )
    p = run_grpo("train", path, "--resume", cwd=ROOT)
    assert p.returncode == 2 and "cannot write metrics" in p.stderr
    assert "No space left on device" in p.stderr and "Traceback" not in p.stderr


def test_dataset_row_missing_a_field(tiny_model, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2="}\n')
    path = write_config(
        tmp_path / "c.json", make_config(tiny_model, str(data), str(tmp_path / "r"))
    )
    p = run_grpo("train", path, cwd=ROOT)
    assert p.returncode == 2
    assert "row 1 has no field 'answer'" in p.stderr and "Traceback" not in p.stderr


def register(kind, name, factory, dist):
    module = types.ModuleType(f"{dist}_module")
    setattr(module, kind, hookimpl(lambda register: register(name, factory), specname=kind))
    registry().add(module, dist)


def test_hanging_reward_is_cut_off(tiny_model, addition_data, tmp_path):
    release, returned = threading.Event(), []

    def hang(p, c, **k):  # stuck until the test lets it go (ten minutes at most: a hang guard)
        release.wait(600)
        returned.append(1)

    register("reward", "hang", lambda: hang, "test-hang")
    base = make_config(
        tiny_model,
        addition_data,
        str(tmp_path / "a"),
        reward={"name": "hang", "timeout": 0.5, "failure": "zero"},
        train={"steps": 1, "prompts_per_step": 2},
    )
    try:
        summary = train(config.validate(base))
        # the run ended while the reward call was still stuck: it did not wait for it
        assert summary["steps"] == 1 and not returned
        base["reward"]["failure"] = "raise"
        base["output"]["dir"] = str(tmp_path / "b")
        with pytest.raises(UserError, match="did not return within 0.5 s"):
            train(config.validate(base))
        assert not returned
    finally:
        release.set()


@pytest.mark.parametrize(
    "groups, baseline",
    [({}, "remax"), ({"resample_zero_std_max": 2}, "grpo")],
    ids=["greedy completions", "extra completions"],
)
def test_a_reward_failure_after_the_rollouts_own_is_warned(
    groups, baseline, tiny_model, addition_data, tmp_path, capsys
):
    """Completions scored after the rollout's own (ReMax's greedy ones; the ones drawn for
    flat groups) warn of a reward failure as the rollout's do, naming the policy applied."""
    calls = []

    def late(prompts, completions, **k):  # every group flat (all 0), then a failure
        calls.append(len(completions))
        if len(calls) > 1:
            raise RuntimeError("the second call fails")
        return [0.0] * len(completions)

    register("reward", "late", lambda: late, "test-late")
    cfg = make_config(
        tiny_model,
        addition_data,
        str(tmp_path / "run"),
        reward={"name": "late", "failure": "zero"},
        baseline={"name": baseline},
        groups=groups,
        train={"steps": 1, "prompts_per_step": 2},
    )
    assert train(config.validate(cfg))["steps"] == 1
    assert len(calls) == 2 and calls[0] == 2 * 4  # the rollout's 8, then the later ones
    err = capsys.readouterr().err
    assert err.count("the second call fails") == 1, err
    assert "applied reward.failure: zero" in err


def test_a_declaration_is_read_from_what_a_function_factory_builds(
    tiny_model, addition_data, tmp_path
):
    """A baseline registered through a function (as the built-in estimators are) still gets
    the greedy completions its class declares it needs: the plan reads the declaration from
    what the factory builds, not only from a registered class."""
    seen = []

    class Greedy(Baseline):
        needs_greedy = True

        def advantages(self, rewards, greedy_rewards=None):
            seen.append(greedy_rewards)
            return rewards - torch.nan_to_num(greedy_rewards)[:, None]

    register("baseline", "greedy_by_function", lambda: Greedy(), "test-greedy-fn")
    cfg = make_config(
        tiny_model,
        addition_data,
        str(tmp_path / "run"),
        baseline={"name": "greedy_by_function"},
        train={"steps": 1, "prompts_per_step": 2},
    )
    assert train(config.validate(cfg))["steps"] == 1
    assert len(seen) == 1 and seen[0] is not None and seen[0].shape == (2,)


def test_a_class_off_the_contract_is_refused_before_its_declarations_are_read(
    tiny_model, addition_data, tmp_path
):
    """A registered class that does not derive from the kind's base has no declarations to
    read: the run stops with the contract's one-line error, not an AttributeError."""

    class NotABaseline:
        def advantages(self, rewards, greedy_rewards=None):
            return rewards

    register("baseline", "off_contract", NotABaseline, "test-off-contract")
    cfg = make_config(
        tiny_model,
        addition_data,
        str(tmp_path / "run"),
        baseline={"name": "off_contract"},
        train={"steps": 1, "prompts_per_step": 2},
    )
    with pytest.raises(UserError, match="does not derive from grpo_core.hookspecs.Baseline"):
        train(config.validate(cfg))


def test_empty_completions_do_not_break_the_step(tiny_model, addition_data, tmp_path):
    class Empty(Generator):
        def setup(self, model, tokenizer, device):
            self.pad = tokenizer.pad_token_id

        def sync_weights(self, model):
            pass

        def generate(self, prompt_ids, n, sampling, seed=0, row_offset=0):
            P = len(prompt_ids)
            width = max(map(len, prompt_ids))
            pids = torch.tensor([[self.pad] * (width - len(p)) + p for p in prompt_ids])
            pmask = (
                torch.arange(width)[None]
                >= width - torch.tensor([len(p) for p in prompt_ids])[:, None]
            ).long()
            B = P * n
            return Rollout(
                pids,
                pmask,
                torch.zeros(B, 0, dtype=torch.long),
                torch.zeros(B, 0, dtype=torch.long),
                torch.zeros(B, 0),
                torch.zeros(B, dtype=torch.bool),
                torch.arange(B) // n,
            )

    register("generator", "empty", Empty, "test-empty")
    cfg = config.validate(
        make_config(
            tiny_model,
            addition_data,
            str(tmp_path / "r"),
            generator={"name": "empty"},
            kl={"name": "fixed", "options": {"coef": 0.1}},
            train={"steps": 2, "prompts_per_step": 2},
        )
    )
    train(cfg)
    rows = [json.loads(x) for x in open(tmp_path / "r" / "metrics.jsonl")]
    assert all(r["completion_len"] == 0 and r["reward"] == 0 and r["loss"] == 0 for r in rows)


def test_nan_guard_skips_then_stops(tiny_model, addition_data, tmp_path, capsys):
    class Inf(Baseline):
        def advantages(self, rewards, greedy_rewards=None):
            return torch.full_like(rewards, float("inf"))

    register("baseline", "inf", Inf, "test-inf")
    cfg = config.validate(
        make_config(
            tiny_model,
            addition_data,
            str(tmp_path / "r"),
            baseline={"name": "inf"},
            train={"steps": 5, "prompts_per_step": 2, "max_nonfinite_steps": 2},
        )
    )
    with pytest.raises(TrainingError, match="non-finite loss or gradient in 2 steps in a row"):
        train(cfg)
    assert "update skipped" in capsys.readouterr().err
    rows = [json.loads(x) for x in open(tmp_path / "r" / "metrics.jsonl")]
    assert [r["skipped_updates"] for r in rows] == [1]  # the 2nd step stops before logging


def test_pickle_weights_refused_unless_opted_in(tiny_model, tmp_path):
    import shutil

    from transformers import AutoModelForCausalLM

    from grpo_core.store.models import load_model

    dst = tmp_path / "pickled"
    shutil.copytree(tiny_model, dst)
    model = AutoModelForCausalLM.from_pretrained(str(dst))
    os.remove(dst / "model.safetensors")
    torch.save(model.state_dict(), dst / "pytorch_model.bin")
    cfg = config.section("model", {"name_or_path": str(dst)})
    with pytest.raises(UserError, match="only pickle weights"):
        load_model(cfg, torch.device("cpu"))
    load_model(dataclasses.replace(cfg, allow_unsafe_weights=True), torch.device("cpu"))
