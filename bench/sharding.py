"""Per-rank peak memory and seconds per step of each multi-process strategy, as ratios against
DDP measured in the same run.

    python bench/sharding.py [--hidden 1024] [--layers 4] [--steps 4] [--nproc 2] [--no-deepspeed]

Strategies: ddp and fsdp (FSDP2), and DeepSpeed ZeRO-2 and ZeRO-3 when the deepspeed extra
is installed (every parameter partitioned: persistence threshold 0). Each strategy trains the
same randomly initialised Qwen2-shaped model (byte vocabulary) on 2 CPU processes (torchrun,
gloo, one thread each) for ``--steps`` steps, 4 prompts x G=4, 8 new tokens, KL 0.05 (a
reference model: sharded like the policy under fsdp and ZeRO-3, whole otherwise). Peak memory is
each rank's maximum resident size; s/step is the median of the steps after the first.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


DEEPSPEED = {
    "zero2": {"zero_optimization": {"stage": 2}},
    "zero3": {"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}},
}


def run(strategy: str, model: str, data: str, out: str, args) -> dict:
    cfg = {
        "model": {"name_or_path": model},
        "data": {"path": data, "columns": ["answer"]},
        "sampling": {"group_size": 4, "max_new_tokens": 8},
        "reward": {"name": "format", "options": {"tags": [], "patterns": ["[0-9]"]}},
        "kl": {"name": "fixed", "options": {"coef": 0.05}},
        "train": {"steps": args.steps, "prompts_per_step": 4, "micro_batch_groups": 1},
        "optimizer": {"lr": 1e-4},
        "runtime": {"device": "cpu", "threads": 1},
        "distributed": {"strategy": "deepspeed" if strategy in DEEPSPEED else strategy},
        "deepspeed": DEEPSPEED.get(strategy),
        "output": {
            "dir": os.path.join(out, strategy),
            "progress": False,
            "samples_every": 0,
            "save_model": False,
        },
        "health": {"enabled": False},
    }
    path = os.path.join(out, f"{strategy}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cfg, f)
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={args.nproc}",
            "-m",
            "grpo_core.cli",
            "train",
            path,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"},
    )
    if p.returncode:
        raise SystemExit(f"{strategy} failed:\n{p.stderr[-2000:]}")
    with open(os.path.join(out, strategy, "summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    with open(os.path.join(out, strategy, "metrics.jsonl"), encoding="utf-8") as f:
        steps = [json.loads(x)["time/step"] for x in f][1:]
    return {
        "peak": max(r["peak_memory_mb"] for r in summary["per_rank"]),
        "params": summary["per_rank"][0]["parameters"],
        "optimizer": summary["per_rank"][0]["optimizer_state"],
        "step": statistics.median(steps),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--no-deepspeed", action="store_true", help="only ddp and fsdp")
    args = ap.parse_args()
    strategies = ["ddp", "fsdp"]
    if not args.no_deepspeed and importlib.util.find_spec("deepspeed"):
        strategies += list(DEEPSPEED)
    from grpo_core.tiny import addition_rows, build_model, write_jsonl

    out = tempfile.mkdtemp(prefix="grpo-sharding-")
    model = build_model(os.path.join(out, "model"), hidden=args.hidden, layers=args.layers)
    data = os.path.join(out, "train.jsonl")
    write_jsonl(data, addition_rows()[0])
    results = {s: run(s, model, data, out, args) for s in strategies}
    base = results["ddp"]
    print(
        f"{args.layers} layers x {args.hidden}, {args.nproc} CPU processes (gloo), "
        f"{args.steps} steps"
    )
    print(
        "| strategy | params per rank | optimizer state per rank | peak MiB per rank | "
        "memory vs DDP | s/step | time vs DDP |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, r in results.items():
        print(
            f"| {name} | {r['params'] / 1e6:.1f} M | {r['optimizer'] / 1e6:.1f} M | "
            f"{r['peak']:.0f} | {r['peak'] / base['peak']:.2f} | {r['step']:.2f} | "
            f"{r['step'] / base['step']:.2f} |"
        )
    if "zero3" not in results:
        print("(no DeepSpeed rows: pip install -e '.[deepspeed]')")


if __name__ == "__main__":
    main()
