"""Throughput of the ``code`` reward (completions/s) against a naive sequential runner, in
one run.

    python bench/code_reward.py [--completions 48] [--repeats 5] [--parallel 0]

The completions are programs for the four problems of examples/data/code_problems.jsonl
(three stdin/stdout tests each), in the mix a policy early in training writes: a quarter
correct, a quarter with a wrong answer on the last test, a quarter raising on the first test,
a quarter with a little real work (a loop of 200,000 additions) before a correct answer; each
program distinct (the reward would run a repeated one only once).
Three runners score the same batch:

- ``naive``: the peer, what a reward function written without a sandbox does:
  ``subprocess.run([python, "-c", program], input=..., timeout=...)`` per test, one test
  after another, all tests of every completion, no limits, no isolation;
- ``code p=1``: the ``code`` reward with ``parallel: 1`` (the sandbox's own cost: launcher,
  namespaces, temporary directory; it stops a completion at its first failing test);
- ``code p=N``: the reward with ``parallel: N`` (``--parallel``, 0 = the CPU count).

Each round runs the three in turn (each round in another order); a figure is the median over
``--repeats`` rounds, each runner's scores checked against the expected ones. Prints one JSON
line per round and a table: completions/s, and the ratio against ``naive`` as the median of
the rounds' ratios (each round's runners ran back to back, so a load that drifts between
rounds cancels out of it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "examples", "data", "code_problems.jsonl")

SOLUTIONS = (
    "a, b = map(int, input().split())\nprint(a + b)",
    "print(input()[::-1])",
    "print(sum(c in 'aeiouAEIOU' for c in input()))",
    "n = int(input())\na, b = 0, 1\nfor _ in range(n):\n    a, b = b, a + b\nprint(a)",
)
WORK = "s = 0\nfor i in range(200_000):\n    s += i\n"


def batch(n: int) -> tuple[list[str], list[list[dict]], list[float]]:
    """``n`` completions (a quarter of each kind), their tests and expected scores."""
    with open(DATA, encoding="utf-8") as f:
        problems = [json.loads(line) for line in f]
    completions, tests, expected = [], [], []
    for i in range(n):
        k = i % len(problems)
        program, good = SOLUTIONS[k], 1.0
        kind = (i // len(problems)) % 4
        if kind == 1:  # wrong on the last test only
            last = problems[k]["tests"][-1]["input"]
            program = (
                f"import io, sys\ndata = sys.stdin.read()\nif data == {last!r}:\n"
                "    print(-1)\n    raise SystemExit\nsys.stdin = io.StringIO(data)\n" + program
            )
            good = 0.0
        elif kind == 2:  # raises at once
            program, good = "raise ValueError('no idea')\n" + program, 0.0
        elif kind == 3:  # some work first
            program = WORK + program
        # each program distinct: the reward runs a repeated one once, the naive runner not
        completions.append(f"Solution:\n```python\n# attempt {i}\n{program}\n```\n")
        tests.append(problems[k]["tests"])
        expected.append(good)
    return completions, tests, expected


def naive(completions: list[str], tests: list[list[dict]], timeout: float = 4.0) -> list[float]:
    """The peer: every test of every completion, one at a time, in a bare subprocess."""
    from grpo_core_plugins.rewards.code import extract_program, same_output

    scores = []
    for text, cases in zip(completions, tests):
        program, passed = extract_program(text, "block"), 0
        for case in cases:
            try:
                done = subprocess.run(
                    [sys.executable, "-c", program],
                    input=case["input"].encode(),
                    capture_output=True,
                    timeout=timeout,
                )
            except subprocess.TimeoutExpired:
                continue
            passed += done.returncode == 0 and same_output(done.stdout, case["output"], "lines")
        scores.append(float(passed == len(cases)))
    return scores


def main() -> None:
    from grpo_core_plugins.rewards import sandbox

    import grpo_core

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--completions", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--parallel", type=int, default=0, help="0: the CPU count")
    args = parser.parse_args()
    parallel = args.parallel or os.cpu_count() or 1
    completions, tests, expected = batch(args.completions)
    prompts = ["p"] * len(completions)
    rewards = {
        p: grpo_core.create("reward", "code", {"parallel": p}) for p in sorted({1, parallel})
    }
    runners = {
        "naive": lambda: naive(completions, tests),
        "code p=1": lambda: list(rewards[1](prompts, completions, tests=tests)),
        f"code p={parallel}": lambda: list(rewards[parallel](prompts, completions, tests=tests)),
    }
    print(f"isolation: {sandbox.isolation().describe()}; cpus {os.cpu_count()}", flush=True)
    rates: dict[str, list[float]] = {name: [] for name in runners}
    names = list(runners)
    for r in range(args.repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        round_rates = {}
        for name in order:
            start = time.perf_counter()
            scores = runners[name]()
            elapsed = time.perf_counter() - start
            if scores != expected:
                raise SystemExit(f"{name} scored {scores}, expected {expected}")
            round_rates[name] = len(completions) / elapsed
            rates[name].append(round_rates[name])
        print(json.dumps({"round": r, "load": os.getloadavg()[0], **round_rates}), flush=True)
    print(
        f"\n| runner | completions/s (median of {args.repeats}) | rounds | vs naive "
        "(median of the rounds' ratios) |\n|---|---|---|---|"
    )
    for name in names:
        ratios = [a / b for a, b in zip(rates[name], rates["naive"])]
        shown = ", ".join(f"{x:.1f}" for x in rates[name])
        print(
            f"| {name} | {statistics.median(rates[name]):.1f} | {shown} | "
            f"{statistics.median(ratios):.2f}x |"
        )


if __name__ == "__main__":
    main()
