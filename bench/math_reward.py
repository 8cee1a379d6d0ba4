"""Accuracy and speed of the ``math`` reward against math-verify, on real data, in one run.

    python bench/math_reward.py [--data ../shared/data] [--limit N] [--show-disagreements K]

Needs the benchmark extra (``pip install -e '.[bench]'``) for math-verify. Prints one table:
for each data set, accuracy / precision / recall against the reference verdicts and items per
second, for both verifiers, and the speed ratio. math-verify runs in the main thread (its
``signal.alarm`` timeouts work only there); ours runs as the trainer calls it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import sys
import time

import grpo_core


def load_jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def datasets(root: str, limit: int | None) -> dict[str, list[tuple[str, str, bool]]]:
    """name -> [(completion, gold answer, reference verdict)]."""
    out = {}
    cot = load_jsonl(os.path.join(root, "math_cot_samples", "math_cot_100.jsonl"))
    out["math_cot (grader)"] = [(c, r["gt"], bool(s)) for r in cot
                                for c, s in zip(r["code"], r["score"])]
    gsm = load_jsonl(os.path.join(root, "gsm8k", "example_model_solutions.jsonl"))
    rows = []
    for r in gsm:
        gold = r["ground_truth"].rsplit("A:", 1)[-1].strip()
        for key in ("6b_finetuning", "6b_verification", "175b_finetuning", "175b_verification"):
            rows.append((r[key]["solution"], gold, bool(r[key]["is_correct"])))
    out["gsm8k solutions"] = rows
    m500 = load_jsonl(os.path.join(root, "math500", "test.jsonl"))
    out["math500 own answer"] = [(r["solution"], r["answer"], True) for r in m500]
    rng = random.Random(0)
    shuffled = [r["answer"] for r in m500]
    rng.shuffle(shuffled)
    out["math500 other answer"] = [(r["solution"], other, r["answer"].strip() == other.strip())
                                   for r, other in zip(m500, shuffled)]
    if limit:
        out = {k: v[:limit] for k, v in out.items()}
    return out


HOSTILE = [
    "\\boxed{9^{9^{9^{9^{9}}}}}", "\\boxed{" + "(" * 10_000 + "1" + ")" * 10_000 + "}",
    "\\boxed{" + "{" * 10_000 + "}" * 10_000 + "}", "1" * 1_000_000, "\\boxed{99999999!}",
    "\\boxed{(x+1)^{100000}}", "\\boxed{__import__('os').system('touch /tmp/bench_pwned')}",
    "\\boxed{" + "x+" * 50_000 + "1}", "\\boxed{\\sqrt{" * 2000 + "2" + "}" * 2000 + "}",
    "\\boxed{10^{10^{10^{10}}} - 10^{10^{10^{10}}}}",
]


def ours(items, reward) -> tuple[list[bool], float]:
    t0 = time.perf_counter()
    scores = []
    for s in range(0, len(items), 256):
        chunk = items[s:s + 256]
        scores += reward(["q"] * len(chunk), [c for c, _, _ in chunk],
                         answer=[g for _, g, _ in chunk])
    return [v > 0.5 for v in scores], time.perf_counter() - t0


def theirs(items) -> tuple[list[bool], float]:
    from math_verify import parse, verify

    t0 = time.perf_counter()
    out = []
    for completion, gold, _ in items:
        try:
            out.append(bool(verify(parse(f"${gold}$"), parse(completion))))
        except Exception:
            out.append(False)
    return out, time.perf_counter() - t0


def stats(pred: list[bool], ref: list[bool]) -> tuple[float, float, float]:
    tp = sum(p and r for p, r in zip(pred, ref))
    fp = sum(p and not r for p, r in zip(pred, ref))
    fn = sum(r and not p for p, r in zip(pred, ref))
    acc = sum(p == r for p, r in zip(pred, ref)) / len(ref)
    return acc, tp / max(tp + fp, 1), tp / max(tp + fn, 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=os.path.join(os.path.dirname(__file__), "..", "..",
                                                   "shared", "data"))
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--show-disagreements", type=int, default=0)
    args = ap.parse_args()
    if not os.path.isdir(args.data):
        print(f"no data at {args.data}; pass --data", file=sys.stderr)
        return 2
    reward = grpo_core.create("reward", "math", {"timeout": 2.0})
    reward(["q"], ["\\boxed{x+1}"], answer=["1+x"])  # start the worker pool before timing
    print(f"{'data set':24} {'n':>5} | {'ours acc/prec/rec':>20} {'items/s':>8} | "
          f"{'math-verify acc/prec/rec':>24} {'items/s':>8} | speed x")
    for name, items in datasets(args.data, args.limit).items():
        ref = [r for _, _, r in items]
        a, ta = ours(items, reward)
        b, tb = theirs(items)
        sa, sb = stats(a, ref), stats(b, ref)
        print(f"{name:24} {len(items):5} | {sa[0]:.3f}/{sa[1]:.3f}/{sa[2]:.3f}      "
              f"{len(items) / ta:8.0f} | {sb[0]:.3f}/{sb[1]:.3f}/{sb[2]:.3f}          "
              f"{len(items) / tb:8.0f} | {tb / ta:6.1f}")
        shown = 0
        for (c, g, r), x, y in zip(items, a, b):
            if shown < args.show_disagreements and x != r:
                from grpo_core_plugins.math_reward.extract import extract_answer

                print(f"   ours={x} mv={y} ref={r} gold={g!r} extracted="
                      f"{extract_answer(c)!r}")
                shown += 1
    # hostile set: ours in a worker thread's budget; math-verify in the main thread
    t0 = time.perf_counter()
    worst = 0.0
    for text in HOSTILE:
        t = time.perf_counter()
        score = reward(["q"], [text], answer=["2"])[0]
        worst = max(worst, time.perf_counter() - t)
        assert score == 0.0
    print(f"hostile set ({len(HOSTILE)} items): ours all 0, slowest {worst:.2f} s (budget 2 s), "
          f"total {time.perf_counter() - t0:.1f} s, worker timeouts {reward.verifier.timeouts}, "
          f"parent peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB, "
          f"/tmp/bench_pwned exists: {os.path.exists('/tmp/bench_pwned')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
