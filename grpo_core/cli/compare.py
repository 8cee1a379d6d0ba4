"""``grpo compare``: every variant x every seed on the same task, then a table and plots."""

from __future__ import annotations

import itertools
import json
import os
import statistics
import subprocess
import sys
import time

import yaml

from grpo_core import config as config_mod
from grpo_core.cli.plots import plot_groups
from grpo_core.configfile import unresolved
from grpo_core.errors import UserError
from grpo_core.metrics import read
from grpo_core.registry import registry

KINDS = ("baseline", "kl", "reward", "generator", "objective")


def variants(args) -> list[dict[str, str]]:
    """Cartesian product of --baselines and every --vary KIND=A,B."""
    axes: dict[str, list[str]] = {}
    if args.baselines:
        axes["baseline"] = [b.strip() for b in args.baselines.split(",") if b.strip()]
    for item in args.vary:
        kind, _, names = item.partition("=")
        if kind not in KINDS or not names:
            raise UserError(f"--vary {item!r}: expected KIND=NAME,NAME with KIND one of {KINDS}")
        axes[kind] = [n.strip() for n in names.split(",") if n.strip()]
    if not axes:
        raise UserError("grpo compare: give --baselines A,B and/or --vary KIND=A,B")
    for kind, names in axes.items():
        for n in names:
            registry().get(kind, n)  # unknown names fail now, not after an hour
    return [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())]


def label(variant: dict[str, str]) -> str:
    return ",".join(f"{v}" if k == "baseline" else f"{k}={v}" for k, v in variant.items())


def run_one(base_cfg: dict, variant: dict, seed: int, steps: int | None, out: str) -> dict:
    cfg = unresolved(base_cfg)  # ${env:NAME} stays a reference in the configs written here
    for kind, name in variant.items():
        if cfg.get(kind, {}).get("name") != name:
            cfg[kind] = {"name": name, "options": {}}
    cfg["train"]["seed"] = seed
    if steps:
        cfg["train"]["steps"] = steps
    run_dir = os.path.join(out, f"{label(variant).replace('=', '-').replace(',', '_')}-seed{seed}")
    cfg["output"].update({"dir": run_dir, "progress": False, "checkpoint_every": 0})
    cfg = config_mod.validate(cfg)
    os.makedirs(run_dir, exist_ok=True)
    path = run_dir + ".yaml"  # beside the run: its directory is the trainer's own
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(unresolved(cfg), f, sort_keys=False)
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "grpo_core.cli", "train", path],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["(no output)"]
        raise UserError(f"run {run_dir} failed: {tail[0]}")
    with open(os.path.join(run_dir, "summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    return {"records": read(run_dir), "seconds": time.time() - t0, "summary": summary}


def table(results: dict[str, list[dict]], threshold: float) -> str:
    lines = [f"| variant | final reward (mean ± std over seeds) | steps to reward >= {threshold} "
             f"| wall time (s) | mean KL | peak memory (MiB) |",
             "|---|---|---|---|---|---|"]
    for name, runs in results.items():
        finals, reach, kls = [], [], []
        for run in runs:
            rec = run["records"]
            tail = rec[-max(1, len(rec) // 10):]
            finals.append(statistics.fmean(r["reward"] for r in tail))
            hit = next((r["step"] for i, r in enumerate(rec)
                        if statistics.fmean(x["reward"] for x in rec[max(0, i - 19):i + 1])
                        >= threshold), None)
            reach.append(hit)
            kls.append(statistics.fmean(r["kl"] for r in rec))
        sd = statistics.stdev(finals) if len(finals) > 1 else 0.0
        hits = [h for h in reach if h is not None]
        reach_txt = (f"{statistics.fmean(hits):.0f} ({len(hits)}/{len(runs)} seeds)" if hits
                     else f"not reached (0/{len(runs)})")
        secs = statistics.fmean(r["seconds"] for r in runs)
        mem = max(r["summary"].get("peak_memory_mb", 0) for r in runs)
        lines.append(f"| {name} | {statistics.fmean(finals):.3f} ± {sd:.3f} | {reach_txt} | "
                     f"{secs:.0f} | {statistics.fmean(kls):.4f} | {mem:.0f} |")
    return "\n".join(lines)


def compare_cli(args) -> int:
    base = config_mod.load(args.config, args.set)
    combos = variants(args)
    if args.seeds < 1:
        raise UserError("--seeds: expected a number >= 1")
    os.makedirs(args.out, exist_ok=True)
    results: dict[str, list[dict]] = {}
    t0 = time.time()
    total = len(combos) * args.seeds
    for i, (variant, seed) in enumerate(itertools.product(combos, range(args.seeds))):
        print(f"[{i + 1}/{total}] {label(variant)} seed {seed} ...", file=sys.stderr, flush=True)
        results.setdefault(label(variant), []).append(
            run_one(base, variant, seed, args.steps, args.out))
    md = table(results, args.threshold)
    wall = time.time() - t0
    report = (f"# grpo compare\n\nconfig: {args.config}; {args.seeds} seeds; total wall time "
              f"{wall:.0f} s\n\n{md}\n\nFinal reward: mean over the last 10% of steps. Steps to "
              f"reach: the first step where the mean reward of the last 20 steps reaches the "
              f"threshold.\n")
    with open(os.path.join(args.out, "compare.md"), "w", encoding="utf-8") as f:
        f.write(report)
    groups = {name: [r["records"] for r in runs] for name, runs in results.items()}
    steps = max(len(r["records"]) for runs in results.values() for r in runs)
    paths = plot_groups(groups, ["reward", "kl", "entropy"], args.out, max(1, steps // 50))
    print(report)
    for p in paths:
        print(p)
    return 0
