"""A five-minute GPU check: the GPU-marked tests, then a short bf16 GRPO run of a randomly
initialised Qwen2.5-0.5B-shaped model, printing generation and training tokens/s and peak
memory, with the hf generator and (when importable) vLLM. Needs no internet."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

NO_GPU = ("no CUDA device: this check needs a GPU (torch.cuda.is_available() is False); "
          "the CPU test suite is `bash scripts/test.sh`")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="gpu_check", description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5, help="GRPO steps per backend (default 5)")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--skip-tests", action="store_true", help="skip the GPU-marked tests")
    ap.add_argument("--backends", default="hf,vllm", help="comma list of generators to try")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.group_size < 1 or args.prompts < 1 or args.max_new_tokens < 1:
        ap.error("--steps, --group-size, --prompts and --max-new-tokens must be >= 1")
    return args


def build(path: str) -> None:
    """Qwen2.5-0.5B's shape with random weights and the byte-level demo tokenizer."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo_core.cli.memory import PRESETS
    from grpo_core.tiny import build_tokenizer

    s = PRESETS["qwen2.5-0.5b"]
    tok = build_tokenizer()
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=s["vocab"], hidden_size=s["hidden"],
                      intermediate_size=s["intermediate"], num_hidden_layers=s["layers"],
                      num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"],
                      tie_word_embeddings=True, max_position_embeddings=4096,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)


def run_backend(backend: str, model: str, data: str, args, out: str) -> dict:
    from grpo_core import config
    from grpo_core.trainer import train

    cfg = config.validate({
        "model": {"name_or_path": model},
        "data": {"path": data, "columns": ["answer"]},
        "sampling": {"group_size": args.group_size, "max_new_tokens": args.max_new_tokens},
        "train": {"steps": args.steps, "prompts_per_step": args.prompts,
                  "micro_batch_groups": 2},
        "optimizer": {"lr": 1e-6},
        "runtime": {"device": "cuda"},
        "reward": {"name": "math"},
        "kl": {"name": "fixed", "options": {"coef": 0.04}},
        "generator": {"name": backend},
        "output": {"dir": out, "progress": False, "save_model": False, "samples_every": 0},
    })
    summary = train(cfg)
    rows = [json.loads(x) for x in open(os.path.join(out, "metrics.jsonl"))][1:] or \
        [json.loads(x) for x in open(os.path.join(out, "metrics.jsonl"))]
    gen_tokens = sum(r["samples"] * r["completion_len"] for r in rows)
    return {"backend": backend,
            "generate_tokens_per_s": gen_tokens / sum(r["time/generate"] for r in rows),
            "train_tokens_per_s": gen_tokens / sum(r["time/train"] + r["time/reference"]
                                                   for r in rows),
            "step_s": sum(r["time/step"] for r in rows) / len(rows),
            "peak_memory_gib": summary["peak_memory_mb"] / 1024}


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import torch

    if not torch.cuda.is_available():
        print(NO_GPU, file=sys.stderr)
        return 3
    print(f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}", flush=True)
    if not args.skip_tests:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        rc = subprocess.call([sys.executable, "-m", "pytest", "-q", "-m", "gpu",
                              os.path.join(root, "tests")])
        print(f"GPU-marked tests: exit {rc}", flush=True)
    work = tempfile.mkdtemp(prefix="gpu_check_")
    model = os.path.join(work, "model")
    build(model)
    from grpo_core.tiny import addition_rows, write_jsonl

    data = os.path.join(work, "train.jsonl")
    write_jsonl(data, addition_rows()[0])
    for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
        if backend == "vllm":
            try:
                import vllm  # noqa: F401
            except ImportError:
                print("vllm: not importable, skipped")
                continue
        torch.cuda.reset_peak_memory_stats()
        result = run_backend(backend, model, data, args, os.path.join(work, backend))
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
