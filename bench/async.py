"""Asynchronous rollouts against the synchronous loop: steps/s, tokens/s and the reward
curve, one trainer thread and one generator thread.

    python bench/async.py [--steps 24] [--warmup 4] [--prompts 8] [--group 8]
                          [--tokens 16] [--inner 1] [--hidden 64] [--warm]
                          [--repeats 3] [--out DIR]

Trains a tiny model (grpo_core.tiny, the demo's two-digit sums; ``--warm``: warm-started
as in the demo, so it answers and learns; else randomly initialised, so every completion
runs to ``--tokens`` and each step costs the same) with the same seed and config four
times, each run its own ``grpo train`` process: the synchronous loop, then
``sampling.max_staleness`` 0 (generator process, taking turns), 1 and 2.
``runtime.threads: 1``, so the synchronous loop uses one core and the asynchronous runs one
core each for training and generation. Steps/s and tokens/s are taken over the steps after
``--warmup`` from the runs' own per-step times (process start and model loading left out);
the reward columns are the mean reward of the first and the last third of the steps.
``--repeats`` rounds run the four in turn (each round in another order) and each figure is
the median over rounds. Prints one JSON line per run, then a table with the speed-ups
against the synchronous loop and against k = 0: k = 0 has the same two processes as k >= 1
but no overlap, so on a machine other jobs load (where two runnable processes get a larger
share of it than one) its ratio to the synchronous loop is that share, not an overlap, and
k = 1 against k = 0 is the overlap's own gain.
The sync run's ``generate`` and ``train`` shares say whether the case is balanced (the
overlap can at best halve a step whose two halves are equal).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = (("sync", "inline", 0), ("k=0", "process", 0), ("k=1", "auto", 1), ("k=2", "auto", 2))


def _model(out: str, hidden: int, warm: bool) -> tuple[str, str]:
    """The tiny model (warm-started or not) and the training rows (built under ``out``)."""
    from grpo_core.cli.demo import warm_start
    from grpo_core.tiny import addition_rows, build_model, write_jsonl

    model, data = os.path.join(out, "model"), os.path.join(out, "train.jsonl")
    if not os.path.isdir(model):
        build_model(model, hidden=hidden, layers=2, seed=0)
        if warm:
            warm_start(model, addition_rows(0)[0], steps=80)
    write_jsonl(data, addition_rows(0)[0])
    return model, data


def _config(args, model: str, data: str, out: str, generation: str, k: int) -> dict:
    return {
        "model": {"name_or_path": model},
        "data": {"path": data, "columns": ["answer"]},
        "sampling": {
            "group_size": args.group,
            "max_new_tokens": args.tokens,
            "max_staleness": k,
            "generation": generation,
        },
        "train": {
            "steps": args.steps,
            "prompts_per_step": args.prompts,
            "micro_batch_groups": args.prompts,
            "inner_iterations": args.inner,
            "seed": 0,
        },
        "optimizer": {"lr": 1e-3},
        "reward": {"name": "math", "isolation": "inline"},
        "runtime": {"device": "cpu", "threads": 1},
        "output": {"dir": out, "progress": False, "samples_every": 0, "save_model": False},
    }


def _measure(records: list[dict], warmup: int) -> dict:
    timed = records[warmup:]
    seconds = sum(r["time/step"] for r in timed)
    tokens = sum(r["completion_len"] * r["samples"] for r in timed)
    third = max(len(records) // 3, 1)
    return {
        "steps_per_s": len(timed) / seconds,
        "tokens_per_s": tokens / seconds,
        "generate_share": sum(r["time/generate"] for r in timed) / seconds,
        "train_share": sum(r["time/train"] for r in timed) / seconds,
        "reward_first_third": statistics.fmean(r["reward"] for r in records[:third]),
        "reward_last_third": statistics.fmean(r["reward"] for r in records[-third:]),
    }


def _run(args, model: str, data: str, name: str, generation: str, k: int) -> dict:
    """One ``grpo train`` process of a variant; its figures."""
    out = os.path.join(args.out, name.replace("=", ""))
    path = os.path.join(args.out, f"{name.replace('=', '')}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(_config(args, model, data, out, generation, k), f)
    cmd = [sys.executable, "-m", "grpo_core.cli", "train", path, "--overwrite"]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    return {"run": name, **_measure(records, args.warmup)}


def main() -> None:
    """Run the four variants and print their figures."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--inner", type=int, default=1)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--warm", action="store_true")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    args.out = args.out or tempfile.mkdtemp(prefix="bench-async-")
    model, data = _model(args.out, args.hidden, args.warm)
    runs: dict[str, list[dict]] = {v[0]: [] for v in VARIANTS}
    for r in range(args.repeats):
        for v in VARIANTS[r % 4 :] + VARIANTS[: r % 4]:
            runs[v[0]].append(_run(args, model, data, *v))
            print(json.dumps(runs[v[0]][-1]), flush=True)
    rows = [
        {"run": n, **{k: statistics.median(x[k] for x in got) for k in got[0] if k != "run"}}
        for n, got in runs.items()
    ]
    sync, k0 = rows[0]["steps_per_s"], rows[1]["steps_per_s"]
    print(f"{'run':5} {'steps/s':>8} {'x sync':>7} {'x k=0':>6} {'tokens/s':>9} {'reward':>13}")
    for r in rows:
        print(
            f"{r['run']:5} {r['steps_per_s']:8.3f} {r['steps_per_s'] / sync:7.2f} "
            f"{r['steps_per_s'] / k0:6.2f} {r['tokens_per_s']:9.1f} "
            f"{r['reward_first_third']:6.3f}/{r['reward_last_third']:.3f}"
        )


if __name__ == "__main__":
    main()
