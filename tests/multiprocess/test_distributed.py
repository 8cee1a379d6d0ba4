"""Training on several real CPU processes (torchrun, gloo): data parallel and FSDP2 sharding
against one process, sharded checkpoints resumed on the same and on another number of
processes, batch statistics that do not depend on the process count, two "nodes"."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch
from helpers import ROOT, make_config, write_config
from safetensors.torch import load_file

pytestmark = pytest.mark.multiprocess

DIGIT = {"name": "format", "options": {"tags": [], "patterns": ["[0-9]"]}}
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
LR = 1e-2


def assert_same_training(a: dict, b: dict, steps: int, lr: float = LR) -> None:
    """Weights trained on two paths (one process, ddp, fsdp, ZeRO) are the same training.

    Where the bound comes from. Every run here uses AdamW's default kernel (optimizer.fused
    false: the fused one rounds differently on different CPUs), so the paths differ only in
    the order each gradient is summed (one backward, or an all-reduce of two halves). AdamW
    moves each element by about lr per step whatever its gradient's size (m / sqrt(v)), and
    by Cauchy-Schwarz on m and v at most lr * 1.01 per step in the first 6 steps with betas
    (0.9, 0.99) (1.6 below, for room): two runs can disagree on one element by at most
    2 * 1.6 * lr * steps. A few ulps of a gradient change its update only when the
    gradient is itself at rounding level (a sum that cancels), and those elements are few but
    CPU-dependent (4 of 8,256 were over 1e-5 on one machine, none on another), so no
    element-wise bound holds everywhere. What does: at most a handful of elements move the
    other way, so the difference's norm is at most that of 4 such elements (sqrt(4) times
    one), while the runs move ~lr * steps * sqrt(N) (~3 here, measured differences ~2e-4): a
    path that loses a rank's gradient or mixes up shards differs by about the former."""
    assert a.keys() == b.keys()
    diff = sum(float((a[k].double() - b[k].double()).square().sum()) for k in a) ** 0.5
    assert diff <= 4**0.5 * 2 * 1.6 * lr * steps, diff


def cfg_for(model, data, out, strategy="auto", steps=3, output=None, **sections):
    return make_config(
        model,
        data,
        out,
        reward=DIGIT,
        sampling={"group_size": 4, "max_new_tokens": 6},
        kl={"name": "fixed", "options": {"coef": 0.05}},
        train={"steps": steps, "prompts_per_step": 4, "micro_batch_groups": 1, "seed": 5},
        optimizer={"lr": LR, "fused": False},
        runtime={"device": "cpu", "threads": 1},
        distributed={"strategy": strategy},
        output=output or {"dir": out, "progress": False, "samples_every": 1},
        **sections,
    )


def torchrun(cfg_path, *extra, nproc=2):
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={nproc}",
            "-m",
            "grpo_core.cli",
            "train",
            cfg_path,
            *extra,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
        env=ENV,
    )


def one_process(cfg_path, *extra):
    return subprocess.run(
        [sys.executable, "-m", "grpo_core.cli", "train", cfg_path, *extra],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
        env=ENV,
    )


def rows(run):
    return [json.loads(x) for x in open(os.path.join(run, "metrics.jsonl"))]


def final(run):
    return load_file(os.path.join(run, "final", "model.safetensors"))


def checkpoints(run) -> list[str]:
    ckpts = os.path.join(run, "checkpoints")
    return (
        sorted(d for d in os.listdir(ckpts) if d.startswith("step-"))
        if os.path.isdir(ckpts)
        else []
    )


def kill_after_checkpoints(cmd: list[str], run: str, env: dict, n: int = 2) -> None:
    """Start ``cmd`` (a torchrun launch); SIGKILL the launcher and every rank, mid-run, once
    ``n`` checkpoints exist."""
    p = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    t0 = time.monotonic()
    while len(checkpoints(run)) < n:
        assert time.monotonic() - t0 < 600 and p.poll() is None  # a hang guard: ten minutes
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()


@pytest.fixture(scope="module")
def single(tiny_model, addition_data, tmp_path_factory):
    """The one-process run every strategy is compared with."""
    out = str(tmp_path_factory.mktemp("single") / "run")
    p = one_process(write_config(out + ".json", cfg_for(tiny_model, addition_data, out)))
    assert p.returncode == 0, p.stderr
    return out


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_strategies_match_one_process(tiny_model, addition_data, tmp_path, single, strategy):
    out = str(tmp_path / strategy)
    p = torchrun(
        write_config(tmp_path / "c.json", cfg_for(tiny_model, addition_data, out, strategy))
    )
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert summary["world_size"] == 2 and summary["ranks_in_sync"] is True
    assert [r["samples"] for r in rows(out)] == [16, 16, 16]  # both ranks' samples counted
    for a, b in zip(rows(out), rows(single)):  # same completions (batch-invariant sampling)
        assert a["reward"] == b["reward"]
        # the elements that differ are those whose gradient is near 0: the loss hardly
        # depends on them, so it agrees to float32 rounding of a mean of O(1) terms
        assert abs(a["loss"] - b["loss"]) < 1e-6
    wa, wb = final(out), final(single)
    assert_same_training(wa, wb, steps=3)
    if strategy == "fsdp":  # each rank holds half of the parameters and optimizer state
        ranks = summary["per_rank"]
        total = sum(w.numel() for w in wa.values())
        for r in ranks:
            assert 0.4 < r["parameters"] / total < 0.6, ranks
        assert (
            abs(ranks[0]["optimizer_state"] - ranks[1]["optimizer_state"])
            < 0.2 * ranks[0]["optimizer_state"]
        )


def test_fsdp_uses_less_memory_per_rank_than_ddp(tmp_path, addition_data):
    from grpo_core.tiny import build_model

    model = build_model(str(tmp_path / "wide"), hidden=1024, layers=4, seed=0)
    peaks = {}
    for strategy in ("ddp", "fsdp"):
        out = str(tmp_path / strategy)
        cfg = cfg_for(model, addition_data, out, strategy, steps=1)
        cfg["sampling"]["max_new_tokens"] = 2
        p = torchrun(write_config(tmp_path / f"{strategy}.json", cfg))
        assert p.returncode == 0, p.stderr[-3000:]
        summary = json.load(open(os.path.join(out, "summary.json")))
        peaks[strategy] = max(r["peak_memory_mb"] for r in summary["per_rank"])
        if strategy == "fsdp":
            held = [r["optimizer_state"] for r in summary["per_rank"]]
    # ~38 M weights (150 MB): DDP holds weights, gradients, Adam state and the reference whole
    assert peaks["fsdp"] < peaks["ddp"] - 150, peaks
    assert all(0.4 < h / sum(held) < 0.6 for h in held)


def test_fsdp_sigkill_resume_is_identical_and_reshards(tiny_model, addition_data, tmp_path):
    ref, run = str(tmp_path / "ref"), str(tmp_path / "run")
    ref_cfg = cfg_for(tiny_model, addition_data, ref, "fsdp", steps=6)
    assert torchrun(write_config(tmp_path / "ref.json", ref_cfg)).returncode == 0
    keep = {
        "dir": run,
        "progress": False,
        "samples_every": 0,
        "checkpoint_every": 1,
        "keep_last": 2,
    }
    path = write_config(
        tmp_path / "run.json", cfg_for(tiny_model, addition_data, run, "fsdp", steps=6, output=keep)
    )
    kill_after_checkpoints(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "grpo_core.cli",
            "train",
            path,
        ],
        run,
        ENV,
    )
    ckpts = os.path.join(run, "checkpoints")
    done = torchrun(path, "--resume")
    assert done.returncode == 0, done.stderr[-3000:]
    a, b = final(ref), final(run)
    assert all(torch.equal(a[k], b[k]) for k in a)  # same world size: bit for bit
    # the next-to-last sharded checkpoint finished on one process (2 -> 1)
    one = write_config(
        tmp_path / "one.json", cfg_for(tiny_model, addition_data, run, "auto", steps=6, output=keep)
    )
    p = one_process(one, "--resume", os.path.join(ckpts, checkpoints(run)[0]))
    assert p.returncode == 0, p.stderr[-3000:]
    assert_same_training(final(run), a, steps=6)
    # a one-process checkpoint continued on two sharded processes (1 -> 2)
    single = str(tmp_path / "single")
    first = cfg_for(
        tiny_model,
        addition_data,
        single,
        steps=2,
        output={"dir": single, "progress": False, "checkpoint_every": 2},
    )
    assert one_process(write_config(tmp_path / "s.json", first)).returncode == 0
    more = cfg_for(
        tiny_model,
        addition_data,
        single,
        "fsdp",
        steps=3,
        output={"dir": single, "progress": False, "checkpoint_every": 2},
    )
    p = torchrun(write_config(tmp_path / "s2.json", more), "--resume")
    assert p.returncode == 0, p.stderr[-3000:]
    assert [r["step"] for r in rows(single)] == [0, 1, 2]


@pytest.mark.parametrize("baseline", ["reinforce_pp", "mixed"])
def test_batch_statistics_do_not_depend_on_the_process_count(
    tiny_model, addition_data, tmp_path, baseline
):
    runs = {}
    for n in (1, 2):
        out = str(tmp_path / f"n{n}")
        cfg = write_config(
            tmp_path / f"{n}.json",
            cfg_for(tiny_model, addition_data, out, baseline={"name": baseline}),
        )
        p = torchrun(cfg, nproc=n) if n > 1 else one_process(cfg)
        assert p.returncode == 0, p.stderr[-3000:]
        runs[n] = out
    for a, b in zip(rows(runs[1]), rows(runs[2])):  # the advantages are the same (bound: as
        assert abs(a["loss"] - b["loss"]) < 1e-6  # in test_strategies_match_one_process)
    adv = {
        n: [json.loads(x)["advantage"] for x in open(os.path.join(r, "samples.jsonl"))]
        for n, r in runs.items()
    }
    assert adv[1] == pytest.approx(adv[2], abs=1e-6)


def test_remax_flat_group_resampling_and_validation_under_fsdp(tiny_model, addition_data, tmp_path):
    """The generations outside the sampling phase (ReMax's greedy completions, extra
    completions for flat groups, rank 0's validation) run on gathered weights, and a best
    model is gathered from the shards."""
    runs = {}
    for n in (1, 2):
        out = str(tmp_path / f"n{n}")
        cfg = cfg_for(
            tiny_model,
            addition_data,
            out,
            "fsdp" if n > 1 else "auto",
            baseline={"name": "remax"},
            eval={
                "data": addition_data,
                "split": "train",
                "every_n_steps": 1,
                "max_problems": 4,
                "keep_best": "reward",
            },
        )
        p = (
            torchrun(write_config(tmp_path / f"{n}.json", cfg), nproc=n)
            if n > 1
            else one_process(write_config(tmp_path / f"{n}.json", cfg))
        )
        assert p.returncode == 0, p.stderr[-3000:]
        runs[n] = out
    for a, b in zip(rows(runs[1]), rows(runs[2])):
        assert a["reward"] == b["reward"] and a["eval/reward"] == b["eval/reward"]
        assert abs(a["loss"] - b["loss"]) < 1e-6  # the same greedy baselines (bound: above)
    best = [load_file(os.path.join(r, "best", "model.safetensors")) for r in runs.values()]
    assert_same_training(best[0], best[1], steps=3)
    out = str(tmp_path / "resample")
    cfg = cfg_for(tiny_model, addition_data, out, "fsdp", groups={"resample_zero_std_max": 2})
    p = torchrun(write_config(tmp_path / "r.json", cfg))
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.load(open(os.path.join(out, "summary.json")))["ranks_in_sync"] is True


def test_two_nodes_on_one_machine(tiny_model, addition_data, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = str(tmp_path / "nodes")
    path = write_config(tmp_path / "c.json", cfg_for(tiny_model, addition_data, out, "ddp"))
    nodes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                f"--node_rank={i}",
                "--nproc_per_node=1",
                "--master_addr=127.0.0.1",
                f"--master_port={port}",
                "-m",
                "grpo_core.cli",
                "train",
                path,
            ],
            cwd=ROOT,
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    results = [n.communicate(timeout=600) for n in nodes]
    assert all(n.returncode == 0 for n in nodes), results[0][1][-2000:]
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert summary["world_size"] == 2 and summary["ranks_in_sync"] is True


def test_prompts_must_divide_between_processes(tiny_model, addition_data, tmp_path):
    cfg = cfg_for(tiny_model, addition_data, str(tmp_path / "odd"))
    cfg["train"]["prompts_per_step"] = 3
    p = torchrun(write_config(tmp_path / "odd.json", cfg))
    assert p.returncode != 0 and "not divisible by the 2 processes" in p.stderr


def test_sigterm_stops_every_rank_at_one_step_with_a_checkpoint(
    tiny_model, addition_data, tmp_path
):
    """SIGTERM to the whole job (a scheduler's notice): the ranks agree on the step, write one
    sharded checkpoint of it and exit non-zero; resuming continues from it."""
    out = str(tmp_path / "run")
    keep = {"dir": out, "progress": False, "samples_every": 0, "checkpoint_every": 0}
    path = write_config(
        tmp_path / "c.json", cfg_for(tiny_model, addition_data, out, "fsdp", steps=400, output=keep)
    )
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "grpo_core.cli",
            "train",
            path,
        ],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    t0 = time.monotonic()
    while not os.path.exists(os.path.join(out, "metrics.jsonl")) or len(rows(out)) < 2:
        # a hang guard: ten minutes, which a loaded machine cannot reach
        assert p.poll() is None and time.monotonic() - t0 < 600, p.stderr.read()[-3000:]
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGTERM)
    err = p.communicate(timeout=300)[1]
    assert p.returncode != 0
    saved = checkpoints(out)
    assert (
        len(saved) == 1
        and f"checkpoint saved in {os.path.join(out, 'checkpoints', saved[0])}" in err
    ), err[-3000:]
    steps = len(rows(out))
    assert int(saved[0].split("-")[1]) == steps
    more = cfg_for(tiny_model, addition_data, out, "fsdp", steps=steps + 1, output=keep)
    done = torchrun(write_config(tmp_path / "m.json", more), "--resume")
    assert done.returncode == 0, done.stderr[-3000:]
    assert [r["step"] for r in rows(out)] == list(range(steps + 1))


def test_mini_batches_take_a_share_of_each_rank(tiny_model, addition_data, tmp_path):
    # 4 prompts on 2 ranks, 2 mini-batches: each update on one group of each rank; 2 updates
    # a step under a warm-up over 8 updates: lr after the first step is LR x 2 / 8
    out = str(tmp_path / "run")
    cfg = cfg_for(tiny_model, addition_data, out, "ddp", steps=2)
    cfg["train"]["mini_batches"] = 2
    cfg["optimizer"]["warmup_steps"] = 8
    p = torchrun(write_config(tmp_path / "c.json", cfg))
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert summary["world_size"] == 2 and summary["ranks_in_sync"] is True
    assert rows(out)[0]["lr"] == pytest.approx(LR * 2 / 8)
    cfg["train"]["mini_batches"] = 4  # 2 prompts a rank cannot make 4 mini-batches
    cfg["output"]["dir"] = str(tmp_path / "bad")
    p = torchrun(write_config(tmp_path / "bad.json", cfg))
    assert p.returncode != 0
    assert "train.mini_batches: 4 does not divide the 2 prompts each of the 2 processes holds" in (
        p.stderr
    )
