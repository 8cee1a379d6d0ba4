"""DeepSpeed ZeRO stages 1, 2 and 3 on 2 CPU processes against one process, and DeepSpeed
checkpoints: SIGKILL mid-run, resume, the same final weights.

DeepSpeed is an optional extra: CI installs it and runs these in a step of their own
(``scripts/test.sh``; marker ``deepspeed``); without it they skip, saying so. Its first start
on a machine JIT-compiles a CPU communication op (~40 s here), cached after.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from helpers import ROOT, write_config
from safetensors.torch import load_file
from test_distributed import (
    assert_same_training,
    cfg_for,
    checkpoints,
    final,
    kill_after_checkpoints,
    one_process,
    rows,
)

pytest.importorskip(
    "deepspeed",
    reason="the deepspeed extra is not installed (pip install -e '.[deepspeed]'; CI installs it)",
)
pytestmark = [pytest.mark.multiprocess, pytest.mark.deepspeed]

ENV = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
# every parameter of the tiny model partitioned (DeepSpeed keeps ones under 100k whole)
ZERO3 = {"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}


def launch(path, *extra) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "grpo_core.cli",
        "train",
        str(path),
        *extra,
    ]


def torchrun(path, *extra):
    return subprocess.run(
        launch(path, *extra), capture_output=True, text=True, cwd=ROOT, timeout=900, env=ENV
    )


def generating_cfg(model, data, out, **kw):
    """Generation outside the sampling phase too: ReMax's greedy completions and rank 0's
    validation, keeping the best model (gathered from the partitions under ZeRO-3)."""
    return cfg_for(
        model,
        data,
        out,
        baseline={"name": "remax"},
        eval={
            "data": data,
            "split": "train",
            "every_n_steps": 1,
            "max_problems": 4,
            "keep_best": "reward",
        },
        **kw,
    )


@pytest.fixture(scope="module")
def single(tiny_model, addition_data, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("single") / "run")
    p = one_process(write_config(out + ".json", generating_cfg(tiny_model, addition_data, out)))
    assert p.returncode == 0, p.stderr[-3000:]
    return out


# ZeRO-2 with its optimizer offloaded to the CPU and gradients reduced in small buckets: it
# reads during backward whether the micro-batch ends the update (told, as no engine.forward
# runs); untold, it stepped with the first micro-batch's gradient only
OFFLOAD = {
    "zero_optimization": {
        "stage": 2,
        "offload_optimizer": {"device": "cpu"},
        "reduce_bucket_size": 1000,
    },
    "zero_force_ds_cpu_optimizer": False,
}
CONFIGS = {
    1: {"zero_optimization": {"stage": 1}},
    2: {"zero_optimization": {"stage": 2}},
    3: ZERO3,
    "2-offload": OFFLOAD,
}


@pytest.mark.parametrize("stage", list(CONFIGS))
def test_zero_stages_match_one_process(tiny_model, addition_data, tmp_path, single, stage):
    out = str(tmp_path / f"zero{stage}")
    cfg = generating_cfg(tiny_model, addition_data, out)
    cfg["deepspeed"] = CONFIGS[stage]
    p = torchrun(write_config(tmp_path / "c.json", cfg))
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert summary["world_size"] == 2 and summary["ranks_in_sync"] is True
    for a, b in zip(rows(out), rows(single), strict=True):  # the same completions
        assert a["reward"] == b["reward"] and a["eval/reward"] == b["eval/reward"]
        # as in test_distributed (loss bound: test_strategies_match_one_process), with 10x
        # room: DeepSpeed reduces gradients in buckets of its own order, and ZeRO-3 runs the
        # LM head over whole logits, not the chunked head (log-probs differ in the last bits)
        assert abs(a["loss"] - b["loss"]) < 1e-5
    for name in ("final", "best"):  # the bound: test_distributed.assert_same_training
        assert_same_training(
            load_file(os.path.join(out, name, "model.safetensors")),
            load_file(os.path.join(single, name, "model.safetensors")),
            steps=3,
        )
    ranks, total = summary["per_rank"], sum(w.numel() for w in final(single).values())
    held = [r["parameters"] / total for r in ranks]
    if stage == 3:  # each rank holds about half of the weights
        assert all(0.4 < h < 0.6 for h in held), held
    else:
        assert all(h > 0.99 for h in held), held
    state = [r["optimizer_state"] for r in ranks]  # the optimizer state is split in every stage
    assert all(0.4 < s / sum(state) < 0.6 for s in state), state


def test_zero3_sigkill_resume_is_identical(tiny_model, addition_data, tmp_path):
    ref, run = str(tmp_path / "ref"), str(tmp_path / "run")
    ref_cfg = cfg_for(tiny_model, addition_data, ref, steps=5, deepspeed=ZERO3)
    assert torchrun(write_config(tmp_path / "ref.json", ref_cfg)).returncode == 0
    keep = {
        "dir": run,
        "progress": False,
        "samples_every": 0,
        "checkpoint_every": 1,
        "keep_last": 2,
    }
    path = write_config(
        tmp_path / "run.json",
        cfg_for(tiny_model, addition_data, run, steps=5, output=keep, deepspeed=ZERO3),
    )
    kill_after_checkpoints(launch(path), run, ENV)
    done = torchrun(path, "--resume")
    assert done.returncode == 0, done.stderr[-3000:]
    assert [r["step"] for r in rows(run)] == list(range(5))
    a, b = final(ref), final(run)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    kept = os.path.join(run, "checkpoints", checkpoints(run)[-1])
    assert os.path.isdir(os.path.join(kept, "deepspeed"))  # DeepSpeed's own engine state
    # without DeepSpeed the checkpoint cannot continue: said in one line, no traceback
    plain = write_config(
        tmp_path / "plain.json", cfg_for(tiny_model, addition_data, run, steps=5, output=keep)
    )
    p = one_process(plain, "--resume", kept, "--force")
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert "written by a DeepSpeed run" in p.stderr, p.stderr[-2000:]


def test_a_non_finite_loss_stops_every_rank_together(tiny_model, addition_data, tmp_path):
    """DeepSpeed cannot skip an update: a learning rate that sends the weights to infinity
    after the first step stops both ranks at the next loss, in one line, nothing hung."""
    out = str(tmp_path / "nan")
    cfg = cfg_for(tiny_model, addition_data, out, deepspeed={"zero_optimization": {"stage": 2}})
    cfg["optimizer"] = {"lr": 1e30, "max_grad_norm": None}
    p = torchrun(write_config(tmp_path / "nan.json", cfg))
    assert p.returncode != 0
    assert p.stderr.count("non-finite loss under deepspeed, which cannot skip") == 2, p.stderr[
        -3000:
    ]
    assert "Traceback" not in p.stderr.split("non-finite loss under deepspeed")[0]
    assert [r["step"] for r in rows(out)] == [0]
