"""``grpo plan-memory``: parameter counts, the switches, and a measured CPU step."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import ROOT, run_grpo

from grpo_core.cli.memory import PRESETS, plan
from grpo_core.observe.flops import Shape


def test_parameter_counts_match_the_published_sizes():
    assert Shape(**PRESETS["qwen2.5-0.5b"]).params() == pytest.approx(494e6, rel=0.01)
    assert Shape(**PRESETS["qwen2.5-1.5b"]).params() == pytest.approx(1.54e9, rel=0.01)
    assert Shape(**PRESETS["qwen2.5-7b"]).params() == pytest.approx(7.62e9, rel=0.01)


def test_switches_move_the_estimate_the_right_way():
    s = Shape(**PRESETS["qwen2.5-1.5b"])
    base = plan(s, 8, 8, 256, 512)
    assert plan(s, 8, 8, 256, 512, lora_rank=16)["total"] < base["total"]
    assert plan(s, 8, 8, 256, 512, lora_rank=16)["reference"] == 0
    assert (
        plan(s, 8, 8, 256, 512, gradient_checkpointing=True)["activations"]
        < base["activations"] / 5
    )
    assert plan(s, 8, 8, 256, 512, reference=False)["total"] < base["total"]
    assert plan(s, 8, 8, 256, 512, generation_batch=8)["kv_cache"] == base["kv_cache"] / 8
    z2 = plan(s, 8, 32, 256, 512, strategy="zero2", gpus=4)
    assert z2["gradients"] == base["gradients"] / 4 and z2["weights"] == base["weights"]
    fsdp = plan(s, 8, 32, 256, 512, strategy="fsdp", gpus=4)
    ddp = plan(s, 8, 32, 256, 512, strategy="ddp", gpus=4)
    assert fsdp["optimizer"] == ddp["optimizer"] / 4 and fsdp["reference"] == ddp["reference"] / 4
    assert ddp["activations"] == base["activations"]  # 32 prompts on 4 devices: 8 each
    z3 = plan(s, 8, 32, 256, 512, strategy="zero3", gpus=4)
    assert z3["optimizer"] == z2["optimizer"] and z3["weights"] < z2["weights"] / 2
    assert z3["reference"] == fsdp["reference"]  # partitioned like the policy
    assert z3["logits"] > fsdp["logits"]  # the head's logits at once, not in chunks
    assert (
        plan(s, 8, 8, 256, 512, dtype="auto")["weights"]
        == 2 * plan(s, 8, 8, 256, 512, dtype="bfloat16")["weights"]
    )  # float32 master weights, as trained
    assert base["ppo_total"] > base["total"] + 2 * base["weights"]


def test_cli_presets_and_config_json(tiny_model):
    out = run_grpo(
        "plan-memory",
        "--model",
        "Qwen/Qwen2.5-7B-Instruct",
        "--group-size",
        "16",
        "--max-new-tokens",
        "1024",
        "--gpus",
        "8",
        "--prompts",
        "64",
        cwd=ROOT,
    )
    assert out.returncode == 0 and "GRPO peak" in out.stdout and "PPO peak" in out.stdout
    rows = {line.split()[0] for line in out.stdout.splitlines()[2:-1]}
    assert rows == {"ddp", "fsdp", "zero1", "zero2", "zero3"}  # each strategy the trainer has
    for args, needle in ((["--gpus", "0"], "--gpus"), (["--dtype", "int3"], "--dtype")):
        bad = run_grpo("plan-memory", "--model", "qwen2.5-7b", *args, cwd=ROOT)
        assert bad.returncode == 2 and needle in bad.stderr and "Traceback" not in bad.stderr
    assert run_grpo("plan-memory", "--model", tiny_model, cwd=ROOT).returncode == 0
    bad = run_grpo("plan-memory", "--model", "gpt-9", cwd=ROOT)
    assert bad.returncode == 2 and "neither a preset" in bad.stderr


def test_the_plan_by_hand():
    # 2 layers of width 4 (2 heads, 1 KV head: kv_dim 2), MLP 8, vocabulary 10, tied:
    # a layer has (16 + 4) + 2 * (8 + 2) + 16 + 3 * 32 + 2 * 4 = 160 numbers, the model 364
    s = Shape(hidden=4, layers=2, heads=2, kv_heads=1, intermediate=8, vocab=10, tied=True)
    assert s.params() == 364
    e = plan(s, 2, 1, 3, 5, dtype="float32", logprob_chunk=4)
    assert e["weights"] == e["reference"] == e["gradients"] == 364 * 4
    assert e["optimizer"] == 2 * 364 * 4  # AdamW's two moments
    assert e["kv_cache"] == 2 * 2 * 2 * 8 * 2 * 4  # K and V, 2 layers, kv_dim 2, 8 tokens, 2
    assert e["logits"] == 4 * 4 * 10 * 4 + 2 * 10 * 4 * 2  # a chunk of 4 rows; sampling's
    assert e["activations"] == 16 * 2 * (8 * 4 + 4 * 8 + 4 * 2) * 4  # 16 tokens x 2 layers x 72
    # resident from the second step: weights, reference, moments; then the backward phase
    assert e["total"] == 3 * 1456 + 2912 - 1456 + (1456 + 9216 + 800) == 17296
    # PPO: a critic's weights, gradients and two moments resident; its activations come
    # after the policy's backward and fit inside that phase
    assert e["ppo_total"] == 17296 + 4 * 1456
    # auto (float32 weights, bf16 compute), one process: the reference's matrices in bf16, its
    # 40-number embedding in float32 (norms counted as matrices: a few numbers a layer)
    assert plan(s, 2, 1, 3, 5, dtype="auto")["reference"] == 324 * 2 + 40 * 4
    assert plan(s, 2, 4, 3, 5, dtype="auto", strategy="ddp", gpus=2)["reference"] == 364 * 4
    gc = plan(s, 2, 1, 3, 5, dtype="float32", logprob_chunk=4, gradient_checkpointing=True)
    assert gc["activations"] == 16 * (2 * 4 + 2 * 72) * 4  # layer inputs + one layer twice


def test_shared_prompts_run_once():
    s = Shape(hidden=4, layers=2, heads=2, kv_heads=1, intermediate=8, vocab=10, tied=True)
    # 8 completions of one 200-token prompt: (8 - 1) x 200 >= 128 tokens saved, so the
    # trainer runs the prompt once: 200 + 8 x 10 tokens, not 8 x 210
    e = plan(s, 8, 1, 200, 10, dtype="float32")
    assert e["activations"] == (200 + 80) * 2 * 72 * 4
    gc = plan(s, 8, 1, 200, 10, dtype="float32", gradient_checkpointing=True)
    assert gc["activations"] == 8 * 210 * (2 * 4 + 2 * 72) * 4  # no sharing when checkpointing
    assert plan(s, 8, 1, 16, 10, dtype="float32")["activations"] == 8 * 26 * 2 * 72 * 4


PARENT = """
import subprocess, sys
held = bytearray(600 * 2**20)
held[::4096] = b"x" * len(held[::4096])  # resident, not only reserved
child = "from grpo_core.observe.metrics import peak_rss_bytes; print(peak_rss_bytes())"
print(subprocess.run([sys.executable, "-c", child], capture_output=True, text=True).stdout)
"""


def test_a_child_does_not_report_its_parents_peak_as_its_own():
    # ru_maxrss would: the child execs out of the parent's address space (vfork) and keeps
    # its high-water mark, 600 MB here, which once made the probe below report 391 MB for 221
    p = subprocess.run([sys.executable, "-c", PARENT], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert 10 * 2**20 < int(p.stdout) < 400 * 2**20, p.stdout


@pytest.mark.parametrize(
    "switches",
    [
        [],
        ["--gradient-checkpointing"],
        ["--lora-rank", "8"],
        ["--gradient-checkpointing", "--lora-rank", "8"],
        ["--critic"],
    ],
    ids=["full", "checkpointing", "lora", "lora+checkpointing", "ppo"],
)
def test_estimate_within_15_percent_of_a_measured_cpu_run(switches):
    if "--lora-rank" in switches:
        pytest.importorskip("peft", reason="LoRA needs the lora extra (peft)")
    # glibc's heap keeps freed blocks (RSS then counts memory the run no longer uses, up to
    # 1.8x with checkpointing); a fixed mmap threshold returns them, so RSS follows the live
    # memory the plan estimates, as the GPU allocator's peak does
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    p = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tests", "memory_probe.py"), *switches],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert abs(r["estimated"] - r["measured"]) <= 0.15 * r["measured"], r


def test_reads_a_run_config(tiny_model, addition_data, tmp_path):
    from helpers import make_config, write_config

    cfg = make_config(
        tiny_model,
        addition_data,
        str(tmp_path / "r"),
        sampling={"group_size": 16, "max_new_tokens": 32},
        model={"name_or_path": tiny_model, "gradient_checkpointing": True},
    )
    out = run_grpo("plan-memory", write_config(tmp_path / "c.json", cfg), cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "4 prompts x G=16" in out.stdout and "gradient checkpointing" in out.stdout
    assert "no reference" in out.stdout  # KL 0: the trainer loads none


def test_a_colocated_vllm_engine_adds_its_reservation():
    s, engine = Shape(**PRESETS["qwen2.5-1.5b"]), 0.3 * 80 * 2**30
    hf = plan(s, 8, 8, 256, 512)
    asleep = plan(s, 8, 8, 256, 512, engine_bytes=engine)
    awake = plan(s, 8, 8, 256, 512, engine_bytes=engine, engine_sleeps=False)
    assert asleep["vllm"] == engine and hf["vllm"] == 0 and asleep["kv_cache"] == 0
    fixed = hf["weights"] + hf["reference"]
    assert asleep["total"] == fixed + max(engine, hf["total"] - fixed)  # generation or update
    assert awake["total"] > asleep["total"] and awake["total"] >= fixed + engine + (
        hf["gradients"] + hf["activations"] + hf["logits"]
    )  # held through backward too


def test_cli_reads_the_engines_reservation_from_a_run_config(tiny_model, addition_data, tmp_path):
    from helpers import make_config, write_config

    cfg = make_config(
        tiny_model,
        addition_data,
        str(tmp_path / "r"),
        generator={"name": "vllm", "options": {"gpu_memory_utilization": 0.5}},
    )
    path = write_config(tmp_path / "c.json", cfg)
    out = run_grpo("plan-memory", path, "--device-memory", "80", cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "vLLM: 0.5 x 80.0 GiB reserved on each device, freed during the update" in out.stdout
    header, row = out.stdout.splitlines()[2:4]
    cells = dict(zip([c.strip() for c in header.split("|")], [c.strip() for c in row.split("|")]))
    assert float(cells["vllm"]) == 40.0 and float(cells["GRPO peak"]) >= 40.0
    awake = run_grpo("plan-memory", path, "--device-memory", "80", "--vllm-awake", cwd=ROOT)
    assert "kept" in awake.stdout
    bad = run_grpo("plan-memory", path, "--vllm-memory-utilization", "1.5", cwd=ROOT)
    assert bad.returncode == 2 and bad.stderr.startswith("error: --vllm-memory-utilization:")
