"""GPU-marked tests (run by scripts/gpu_check.sh on a CUDA machine) and the script's
CPU-safe parts."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import torch
from helpers import ROOT, make_config

from grpo_core import config
from grpo_core.cli.gpu_check import parse

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_gpu_check_says_no_gpu_and_parses_arguments():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the no-GPU message does not apply")
    out = subprocess.run(["bash", os.path.join(ROOT, "scripts", "gpu_check.sh"), "--steps", "2"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 3 and "no CUDA device" in out.stderr
    assert parse(["--steps", "3", "--backends", "hf"]).steps == 3
    bad = subprocess.run(["bash", os.path.join(ROOT, "scripts", "gpu_check.sh"), "--steps", "0"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert bad.returncode == 2 and "must be >= 1" in bad.stderr
    helped = subprocess.run(["bash", os.path.join(ROOT, "scripts", "gpu_check.sh"), "--help"],
                            capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert helped.returncode == 0 and "--backends" in helped.stdout


@pytest.mark.gpu
@needs_cuda
def test_bf16_training_on_cuda(tiny_model, addition_data, tmp_path):
    from grpo_core.trainer import train

    cfg = config.validate(make_config(tiny_model, addition_data, str(tmp_path / "r"),
                                      kl={"name": "fixed", "options": {"coef": 0.05}},
                                      train={"steps": 2, "prompts_per_step": 4}, runtime={"device": "cuda"}))
    summary = train(cfg)
    assert summary["steps"] == 2 and summary["peak_memory_mb"] > 0


@pytest.mark.gpu
@needs_cuda
def test_vllm_generator_trains_and_syncs(tiny_model, addition_data, tmp_path):
    pytest.importorskip("vllm", reason="vllm is not installed")
    from grpo_core.trainer import train

    cfg = config.validate(make_config(
        tiny_model, addition_data, str(tmp_path / "r"),
        generator={"name": "vllm", "options": {"gpu_memory_utilization": 0.2,
                                               "enforce_eager": True}},
        train={"steps": 2, "prompts_per_step": 4}, runtime={"device": "cuda"}))
    train(cfg)
    rows = [json.loads(x) for x in open(tmp_path / "r" / "metrics.jsonl")]
    assert len(rows) == 2 and all(r["samples"] == 16 for r in rows)
