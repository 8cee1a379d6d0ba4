"""``grpo plan-memory``: parameter counts, the switches, and a measured CPU step."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, run_grpo

from grpo_core.cli.memory import PRESETS, Shape, plan


def test_parameter_counts_match_the_published_sizes():
    assert Shape(**PRESETS["qwen2.5-0.5b"]).params() == pytest.approx(494e6, rel=0.01)
    assert Shape(**PRESETS["qwen2.5-1.5b"]).params() == pytest.approx(1.54e9, rel=0.01)
    assert Shape(**PRESETS["qwen2.5-7b"]).params() == pytest.approx(7.62e9, rel=0.01)


def test_switches_move_the_estimate_the_right_way():
    s = Shape(**PRESETS["qwen2.5-1.5b"])
    base = plan(s, 8, 8, 256, 512)
    assert plan(s, 8, 8, 256, 512, lora_rank=16)["total"] < base["total"]
    assert plan(s, 8, 8, 256, 512, lora_rank=16)["reference"] == 0
    assert plan(s, 8, 8, 256, 512, gradient_checkpointing=True)["activations"] < \
        base["activations"] / 5
    assert plan(s, 8, 8, 256, 512, reference=False)["total"] < base["total"]
    assert plan(s, 8, 8, 256, 512, generation_batch=8)["kv_cache"] == base["kv_cache"] / 8
    z2 = plan(s, 8, 8, 256, 512, zero_stage=2, gpus=4)
    assert z2["gradients"] == base["gradients"] / 4 and z2["weights"] == base["weights"]
    assert base["ppo_total"] > base["total"] + 2 * base["weights"]


def test_cli_presets_and_config_json(tiny_model):
    out = run_grpo("plan-memory", "--model", "qwen2.5-7b", "--group-size", "16",
                   "--max-new-tokens", "1024", "--zero-stage", "3", "--gpus", "8", cwd=ROOT)
    assert out.returncode == 0 and "GRPO peak" in out.stdout and "PPO peak" in out.stdout
    assert run_grpo("plan-memory", "--model", tiny_model, cwd=ROOT).returncode == 0
    bad = run_grpo("plan-memory", "--model", "gpt-9", cwd=ROOT)
    assert bad.returncode == 2 and "neither a preset" in bad.stderr


def test_estimate_within_25_percent_of_a_measured_cpu_step():
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "memory_probe.py")],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert abs(r["estimated"] - r["measured"]) <= 0.25 * r["measured"], r
