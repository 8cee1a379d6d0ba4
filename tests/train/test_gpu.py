"""GPU-marked tests (run by scripts/gpu_check.sh on a CUDA machine), and the check's own
verdict and exit code, which need no GPU: judged from figures, good and failing."""

from __future__ import annotations

import copy
import json
import os
import subprocess

import pytest
import torch
from helpers import ROOT, make_config, run_grpo

from grpo_core import config
from grpo_core.cli import gpu_verdict
from grpo_core.cli.gpu_check import parse

#: what a passing check on one GPU without vLLM collects
GOOD = {
    "gpu": "NVIDIA H200",
    "gpus": 1,
    "torch": "2.13.0",
    "gpu_tests": {"exit_code": 0},
    "training": {
        "steps": 30,
        "rewards": [0.2] * 10 + [0.3] * 10 + [0.5] * 10,
        "completion_len": [3.0] * 30,
    },
    "generation": {
        "hf random 0.5B": {"8": 900.0, "64": 6500.0},
        "vllm random 0.5B": {"skipped": "vllm is not installed"},
        "hf Qwen2.5-7B": {"8": 300.0, "64": 2100.0},
        "vllm Qwen2.5-7B": {"8": 1200.0, "64": 9000.0},
    },
    "logprob_mismatch": {
        "random 0.5B": {"skipped": "vllm is not installed"},
        "Qwen2.5-7B": {"mean_abs": 0.004, "max_abs": 0.3, "tokens": 4096},
    },
    "memory": {"measured_mib": 5000.0, "planned_mib": 6000.0},
    "distributed": {
        "fsdp": {"skipped": "needs 2 or more GPUs, 1 visible"},
        "zero3": {"world": 2, "exit_code": 0, "ranks_in_sync": True},
    },
}


def _set(figures: dict, path: str, value) -> dict:
    out = copy.deepcopy(figures)
    *parents, last = path.split("/")
    node = out
    for key in parents:
        node = node[key]
    node[last] = value
    return out


def test_good_figures_pass_and_skips_say_why():
    checks = gpu_verdict.judge(GOOD)
    assert gpu_verdict.exit_code(checks) == 0
    assert {c.status for c in checks} == {"pass", "skip"}
    skipped = {c.name: c.expected for c in checks if c.status == "skip"}
    assert skipped["vllm random 0.5B generation tokens/s"] == "vllm is not installed"
    assert "needs 2 or more GPUs" in skipped["fsdp over the GPUs"]
    assert len(gpu_verdict.table(checks).splitlines()) == len(checks) + 2  # header, rule


@pytest.mark.parametrize(
    "path,value,failing",
    [
        ("gpu_tests/exit_code", 1, "GPU-marked tests"),  # pytest's exit code, propagated
        ("gpu_tests/exit_code", 5, "GPU-marked tests"),  # no test collected
        ("training/completion_len", [3.0] * 29 + [0.0], "completions not empty"),
        ("training/rewards", [0.0] * 30, "reward rises (bf16)"),  # zero reward, zero updates
        ("training/rewards", [0.5] * 15 + [0.55] * 15, "reward rises (bf16)"),  # not enough
        (
            "generation/hf random 0.5B",
            {"8": 900.0, "64": 800.0},
            "hf random 0.5B generation tokens/s",
        ),
        (
            "logprob_mismatch/Qwen2.5-7B",
            {"mean_abs": 0.2, "max_abs": 0.9, "tokens": 99},
            "hf/vLLM log-prob mismatch Qwen2.5-7B",
        ),
        (
            "logprob_mismatch/random 0.5B",
            {"mean_abs": 0.01, "max_abs": 4.0, "tokens": 99},
            "hf/vLLM log-prob mismatch random 0.5B",
        ),
        ("memory/measured_mib", 8000.0, "peak memory vs plan-memory"),
        ("distributed/zero3/ranks_in_sync", False, "zero3 over the GPUs"),
        ("distributed/zero3/exit_code", 1, "zero3 over the GPUs"),
        ("memory", {"error": "OutOfMemoryError: CUDA out of memory"}, "peak memory vs plan-memory"),
    ],
)
def test_each_failing_figure_fails_its_check_and_the_exit_code(path, value, failing):
    checks = gpu_verdict.judge(_set(GOOD, path, value))
    assert [c.name for c in checks if c.status == "fail"] == [failing]
    assert gpu_verdict.exit_code(checks) == 1


def test_a_part_never_measured_fails():
    figures = copy.deepcopy(GOOD)
    del figures["training"]
    failed = [c for c in gpu_verdict.judge(figures) if c.status == "fail"]
    assert [c.figure for c in failed] == ["not measured"]


@pytest.mark.parametrize("how", ["script", "grpo"])
def test_the_exit_code_of_the_real_command(tmp_path, how):
    """A failing check injected through the figures an earlier check wrote: the command
    exits 1, prints the table, and writes every figure with the verdict; good figures exit 0."""
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"figures": _set(GOOD, "gpu_tests/exit_code", 2)}))
    good = tmp_path / "good.json"
    good.write_text(json.dumps(GOOD))
    codes = {}
    for name, src in (("bad", bad), ("good", good)):
        args = ["--from-figures", str(src), "--out", str(tmp_path / f"{name}-out.json")]
        if how == "script":
            p = subprocess.run(
                ["bash", os.path.join(ROOT, "scripts", "gpu_check.sh"), *args],
                capture_output=True,
                text=True,
                cwd=ROOT,
                timeout=120,
            )
        else:
            p = run_grpo("gpu-check", *args, cwd=ROOT, timeout=120)
        codes[name] = p.returncode
        assert "| measured" in p.stdout and "Traceback" not in p.stderr, p.stderr
    assert codes == {"bad": 1, "good": 0}
    missing = run_grpo("gpu-check", "--from-figures", str(tmp_path / "none.json"), cwd=ROOT)
    assert missing.returncode == 2 and missing.stderr.startswith("error: --from-figures:")
    written = json.loads((tmp_path / "bad-out.json").read_text())
    assert written["figures"]["gpu_tests"] == {"exit_code": 2}
    assert {c["name"]: c["status"] for c in written["checks"]}["GPU-marked tests"] == "fail"


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_gpu_check_says_no_gpu_and_parses_arguments():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the no-GPU message does not apply")
    out = subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", "gpu_check.sh"), "--steps", "2"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert out.returncode == 3 and "no CUDA device" in out.stderr
    assert parse(["--steps", "3", "--skip-vllm"]).skip_vllm
    bad = subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", "gpu_check.sh"), "--steps", "0"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert bad.returncode == 2 and "must be >= 1" in bad.stderr
    assert parse(["--group-sizes", "4,32"]).group_sizes == (4, 32)
    nowhere = subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", "gpu_check.sh"), "--model", "Qwen/Qwen2.5-7B"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert (
        nowhere.returncode == 2
        and "--model: Qwen/Qwen2.5-7B is not a model directory" in nowhere.stderr
    )
    helped = subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", "gpu_check.sh"), "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert helped.returncode == 0 and "--from-figures" in helped.stdout


def test_the_probes_measure_on_cpu(tiny_model, tmp_path):
    """The check's measuring code, run on the CPU with the tiny model (on a GPU it runs with
    device cuda): each probe returns the figures its verdict reads."""
    from grpo_core.cli import gpu_probes

    speeds = gpu_probes.hf_speed(tiny_model, (2, 4), 2, 4, device="cpu")
    assert sorted(speeds) == ["2", "4"] and min(speeds.values()) > 0
    mem = gpu_probes.memory(tiny_model, str(tmp_path), 2, 2, 4, device="cpu")
    assert mem["measured_mib"] > 0 and mem["planned_mib"] > 0
    trained = gpu_probes.demo_training(str(tmp_path / "demo"), 2, device="cpu")
    assert trained["steps"] == 2 and len(trained["rewards"]) == len(trained["completion_len"])
    assert gpu_probes.vllm_rows(tiny_model, (2,), 2, 4) == (
        {"skipped": "vllm is not installed"},
        {"skipped": "vllm is not installed"},
    )
    if not torch.cuda.is_available():
        assert gpu_probes.distributed(str(tmp_path), "fsdp")["skipped"].startswith(
            "needs 2 or more GPUs, 0 visible"
        )


@pytest.mark.gpu
@needs_cuda
def test_bf16_training_on_cuda(tiny_model, addition_data, tmp_path):
    from grpo_core.trainer import train

    cfg = config.validate(
        make_config(
            tiny_model,
            addition_data,
            str(tmp_path / "r"),
            kl={"name": "fixed", "options": {"coef": 0.05}},
            train={"steps": 2, "prompts_per_step": 4},
            runtime={"device": "cuda"},
        )
    )
    summary = train(cfg)
    assert summary["steps"] == 2 and summary["peak_memory_mb"] > 0


@pytest.mark.gpu
@needs_cuda
def test_vllm_generator_trains_and_syncs(tiny_model, addition_data, tmp_path):
    pytest.importorskip("vllm", reason="vllm is not installed")
    from grpo_core.trainer import train

    cfg = config.validate(
        make_config(
            tiny_model,
            addition_data,
            str(tmp_path / "r"),
            generator={
                "name": "vllm",
                "options": {"gpu_memory_utilization": 0.2, "enforce_eager": True},
            },
            train={"steps": 2, "prompts_per_step": 4},
            runtime={"device": "cuda"},
        )
    )
    train(cfg)
    rows = [json.loads(x) for x in open(tmp_path / "r" / "metrics.jsonl")]
    assert len(rows) == 2 and all(r["samples"] == 16 for r in rows)


@pytest.mark.gpu
@needs_cuda
def test_vllm_sync_changes_the_engines_weights(tiny_model):
    """After a sync the engine holds the trained weights: its checksum moves, and it samples
    from them (its log-probs match the trainer's recomputation of the same completions)."""
    pytest.importorskip("vllm", reason="vllm is not installed")
    import grpo_core
    from grpo_core.config import section
    from grpo_core.model.logprobs import completion_logprobs
    from grpo_core.rollout import SamplingParams
    from grpo_core.store.models import load_model, load_tokenizer

    cuda = torch.device("cuda")
    mc = section("model", {"name_or_path": tiny_model})
    model, tok = load_model(mc, cuda), load_tokenizer(mc)
    gen = grpo_core.create(
        "generator", "vllm", {"gpu_memory_utilization": 0.2, "enforce_eager": True, "sleep": False}
    )
    gen.setup(model, tok, cuda)
    before = sum(gen.llm.collective_rpc("weights_checksum"))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    gen.sync_weights(model)
    assert sum(gen.llm.collective_rpc("weights_checksum")) != pytest.approx(before, rel=1e-3)
    prompts = [tok(f"{a}+{a}=")["input_ids"] for a in range(4)]
    ro = gen.generate(prompts, 4, SamplingParams(max_new_tokens=8)).to(cuda)
    with torch.no_grad():
        ours = completion_logprobs(model, ro, 1.0, 1024)[0]
    delta = (ours - ro.logprobs)[ro.action_mask.bool()].abs()
    assert delta.mean() < 0.05, float(delta.mean())
