"""Accuracy and speed of the ``math`` reward against math-verify, on real data, in one run.

    python bench/math_reward.py [--data ../shared/data] [--limit N] [--show-disagreements K]
                                [--skip-data] [--show-form-disagreements]
    python bench/math_reward.py --pairs tests/data/math_pairs.jsonl [--show-errors]
    python bench/math_reward.py --mv-tests PATH/TO/Math-Verify [--show-errors]

Needs the benchmark extra (``pip install -e '.[bench]'``) for math-verify. Prints:

1. for each real data set, accuracy / precision / recall against the reference verdicts and
   items per second, for both verifiers, and the speed ratio;
2. per answer-form category of ``tests/data/math_forms.jsonl`` (hand-labelled cases, many
   wrapped in real completions): cases equal / unequal and the accuracy of both verifiers;
3. items/s on plain numbers, on the mixed forms with warm workers, and from a worker thread,
   and the first-call latency of a fresh process (verdict cache cleared before each timing);
4. the hostile set: every item scored 0 within the per-item budget.

With ``--pairs FILE`` (labelled pairs, one form each) or ``--mv-tests DIR`` (Math-Verify's
own test cases) it prints only, per form, accuracy / precision / recall and the false 1s
(wrong answers paid) of both verifiers.

math-verify runs in the main thread (its ``signal.alarm`` timeouts work only there); ours
runs as the trainer calls it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter

import grpo_core


def load_jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def datasets(root: str, limit: int | None) -> dict[str, list[tuple[str, str, bool]]]:
    """name -> [(completion, gold answer, reference verdict)]."""
    out = {}
    cot = load_jsonl(os.path.join(root, "math_cot_samples", "math_cot_100.jsonl"))
    out["math_cot (grader)"] = [
        (c, r["gt"], bool(s)) for r in cot for c, s in zip(r["code"], r["score"])
    ]
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
    out["math500 other answer"] = [
        (r["solution"], other, r["answer"].strip() == other.strip())
        for r, other in zip(m500, shuffled)
    ]
    if limit:
        out = {k: v[:limit] for k, v in out.items()}
    return out


HOSTILE = [
    "\\boxed{9^{9^{9^{9^{9}}}}}",
    "\\boxed{" + "(" * 10_000 + "1" + ")" * 10_000 + "}",
    "\\boxed{" + "{" * 10_000 + "}" * 10_000 + "}",
    "1" * 1_000_000,
    "\\boxed{99999999!}",
    "\\boxed{(x+1)^{100000}}",
    "\\boxed{__import__('os').system('touch /tmp/bench_pwned')}",
    "\\boxed{" + "x+" * 50_000 + "1}",
    "\\boxed{\\sqrt{" * 2000 + "2" + "}" * 2000 + "}",
    "\\boxed{10^{10^{10^{10}}} - 10^{10^{10^{10}}}}",
    "\\boxed{(x+1)^{9000} > 0}",
    "\\boxed{|(x+1)^{5000} - x| < 2^{10000}}",
    "\\boxed{\\sin(10^{9999}) + e^{e^{e^{10}}}}",
    "\\boxed{" + "\\pm 1" * 40 + "}",
    "1," * 50_000,
    "\\boxed{" * 20_000,
]


def ours(items, reward) -> tuple[list[bool], float]:
    reward.verifier.cache.clear()  # time the work, not the memory of an earlier pass
    t0 = time.perf_counter()
    scores = []
    for s in range(0, len(items), 256):
        chunk = items[s : s + 256]
        scores += reward(
            ["q"] * len(chunk), [c for c, _, _ in chunk], answer=[g for _, g, _ in chunk]
        )
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


FORMS = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "math_forms.jsonl")


def forms_table(reward, path: str, show: bool = False) -> list[tuple[str, str, bool]]:
    """Per category: n equal / n unequal, accuracy of ours and of math-verify; with ``show``,
    every case where the two verifiers disagree, with its label."""
    rows = load_jsonl(path)
    items = [(r["completion"], r["gold"], bool(r["expected"])) for r in rows]
    a, _ = ours(items, reward)
    b, _ = theirs(items)
    if show:
        from grpo_core_plugins.rewards.math.extract import extract_answer

        for r, x, y in zip(rows, a, b):
            if x != y:
                print(
                    f"  [{r['category']}] label={r['expected']} ours={x} mv={y} "
                    f"gold={r['gold']!r} ours-extracted={extract_answer(r['completion'])!r}"
                )
    print(f"\n{'category':26} {'n eq/ne':>8} | {'ours':>6} | {'math-verify':>11}")
    n, ra, rb = Counter(), Counter(), Counter()
    for r, x, y in zip(rows, a, b):
        c = r["category"]
        n[(c, r["expected"])] += 1
        ra[c] += x == r["expected"]
        rb[c] += y == r["expected"]
    for c in dict.fromkeys(r["category"] for r in rows):
        total = n[(c, True)] + n[(c, False)]
        print(
            f"{c:26} {n[(c, True)]:>3}/{n[(c, False)]:<4} | {ra[c] / total:6.3f} | "
            f"{rb[c] / total:11.3f}"
        )
    ref = [e for _, _, e in items]
    sa, sb = stats(a, ref), stats(b, ref)
    print(
        f"{'all':26} {sum(ref):>3}/{len(ref) - sum(ref):<4} | {sa[0]:6.3f} | {sb[0]:11.3f}"
        f"   (precision {sa[1]:.3f} vs {sb[1]:.3f}, recall {sa[2]:.3f} vs {sb[2]:.3f})"
    )
    return items


PAIRS = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "math_pairs.jsonl")


def pairs_table(reward, rows: list[dict], show: bool = False) -> None:
    """Per form of labelled pairs: n right / wrong, then accuracy / precision / recall and
    false 1s (wrong answers paid) for ours and math-verify; with ``show``, every pair either
    verifier gets wrong, with what ours extracted."""
    items = [(r["completion"], r["gold"], bool(r["label"])) for r in rows]
    a, _ = ours(items, reward)
    b, _ = theirs(items)
    if show:
        from grpo_core_plugins.rewards.math.extract import extract_answer

        for r, x, y in zip(rows, a, b):
            if r["label"] not in (x, y) or x != y:
                print(
                    f"  [{r['form']}] label={r['label']} ours={x} mv={y} gold={r['gold']!r} "
                    f"ours-extracted={extract_answer(r['completion'])!r}"
                )
    print(
        f"\n{'form':26} {'right/wrong':>11} | {'ours acc/prec/rec':>17} {'false1':>6} | "
        f"{'math-verify acc/prec/rec':>24} {'false1':>6}"
    )
    forms = list(dict.fromkeys(r["form"] for r in rows)) + ["all"]
    for form in forms:
        idx = [i for i, r in enumerate(rows) if form in ("all", r["form"])]
        ref = [items[i][2] for i in idx]
        pa, pb = [a[i] for i in idx], [b[i] for i in idx]
        sa, sb = stats(pa, ref), stats(pb, ref)
        fa = sum(p and not r for p, r in zip(pa, ref))
        fb = sum(p and not r for p, r in zip(pb, ref))
        print(
            f"{form:26} {sum(ref):>5}/{len(ref) - sum(ref):<5} | "
            f"{sa[0]:.3f}/{sa[1]:.3f}/{sa[2]:.3f} {fa:>6} | "
            f"{sb[0]:.3f}/{sb[1]:.3f}/{sb[2]:.3f}        {fb:>6}"
        )


def mv_cases(directory: str) -> list[dict]:
    """Math-Verify's published test cases as labelled pairs, read (never run) from the
    ``tests/*.py`` of a checkout: each ``pytest.mark.parametrize`` row of literal strings
    ``gold, pred, expected`` (or ``result``), its expected verdict as the label; rows that
    test an option ours has no counterpart for (set-relation comparison, strictness; the same
    pair is labelled 1 and 0 by the option) are left out. The form is the test's name."""
    import ast
    import glob

    rows = []
    for path in sorted(glob.glob(os.path.join(directory, "tests", "*.py"))):
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef):
                continue
            for deco in node.decorator_list:
                if not (
                    isinstance(deco, ast.Call) and getattr(deco.func, "attr", "") == "parametrize"
                ):
                    continue
                try:
                    names = [n.strip() for n in ast.literal_eval(deco.args[0]).split(",")]
                    values = ast.literal_eval(deco.args[1])
                except (ValueError, SyntaxError, AttributeError, IndexError):
                    continue  # built at run time: not literal cases
                for v in values:
                    row = dict(zip(names, v))
                    if "allow_set_relation_comp" in row or "strict" in row:
                        continue  # a test of an option: its label is the option's, not a verdict
                    label = row.get("expected", row.get("result"))
                    rows.append(
                        {
                            "form": f"mv:{node.name}",
                            "completion": row["pred"],
                            "gold": row["gold"],
                            "label": bool(label),
                        }
                    )
    return rows


def fresh_reward():
    """A new reward whose workers are up and warmed, with no memory of any item."""
    reward = grpo_core.create("reward", "math", {"timeout": 2.0})
    reward.verifier.pool.wait_ready()
    reward(["q"], ["\\boxed{x+1}"], answer=["1+x"])
    return reward


def rate(items, reps: int = 3, reward=None) -> float:
    """Median items/s over ``reps`` passes, each by a fresh reward with warm workers (so no
    pass profits from caches of an earlier one), unless ``reward`` is given."""
    runs = []
    for _ in range(reps):
        r = reward or fresh_reward()
        runs.append(len(items) / ours(items, r)[1])
        if reward is None:
            r.verifier.close()
    return statistics.median(runs)


def rate_in_thread(items) -> float:
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", rate(items)))
    t.start()
    t.join()
    return out["r"]


FIRST_CALL = """
import time
t0 = time.perf_counter()
import grpo_core
reward = grpo_core.create("reward", "math", {})
t1 = time.perf_counter()
scores = reward(["q"] * 2, ["\\\\boxed{x+1}", "\\\\boxed{(1,2]}"], answer=["1+x", "(1,2]"])
t2 = time.perf_counter()
assert list(scores) == [1.0, 1.0], scores
print(f"{t1 - t0:.3f} {t2 - t1:.3f}")
"""


def first_call(runs: int = 3) -> tuple[float, float]:
    """(create seconds, first-call seconds) in fresh processes, medians of ``runs``."""
    made, first = [], []
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, "-c", FIRST_CALL],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        ).stdout.split()
        made.append(float(out[0]))
        first.append(float(out[1]))
    return statistics.median(made), statistics.median(first)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--data", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")
    )
    ap.add_argument("--forms", default=FORMS)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--show-disagreements", type=int, default=0)
    ap.add_argument(
        "--show-form-disagreements",
        action="store_true",
        help="list every form case where ours and math-verify disagree",
    )
    ap.add_argument("--skip-data", action="store_true", help="only the forms, speed and hostile")
    ap.add_argument(
        "--pairs",
        help=f"only the labelled pairs of this JSONL (form, completion, gold, label), per form; "
        f"the project's corpus is {os.path.relpath(PAIRS)}",
    )
    ap.add_argument(
        "--mv-tests",
        metavar="DIR",
        help="only Math-Verify's published test cases, read from the tests/ of a checkout",
    )
    ap.add_argument("--show-errors", action="store_true", help="with --pairs / --mv-tests")
    args = ap.parse_args()
    if args.pairs or args.mv_tests:
        reward = fresh_reward()
        rows = load_jsonl(args.pairs) if args.pairs else mv_cases(args.mv_tests)
        pairs_table(reward, rows, args.show_errors)
        reward.verifier.close()
        return 0
    if not args.skip_data and not os.path.isdir(args.data):
        print(f"no data at {args.data}; pass --data (or --skip-data)", file=sys.stderr)
        return 2
    reward = grpo_core.create("reward", "math", {"timeout": 2.0})
    reward.verifier.pool.wait_ready()
    reward(["q"], ["\\boxed{x+1}"], answer=["1+x"])  # warm the workers before timing
    plain = []
    if not args.skip_data:
        print(
            f"{'data set':24} {'n':>5} | {'ours acc/prec/rec':>20} {'items/s':>8} | "
            f"{'math-verify acc/prec/rec':>24} {'items/s':>8} | speed x"
        )
        for name, items in datasets(args.data, args.limit).items():
            if name == "gsm8k solutions":
                plain = items
            ref = [r for _, _, r in items]
            a, ta = ours(items, reward)
            b, tb = theirs(items)
            sa, sb = stats(a, ref), stats(b, ref)
            print(
                f"{name:24} {len(items):5} | {sa[0]:.3f}/{sa[1]:.3f}/{sa[2]:.3f}      "
                f"{len(items) / ta:8.0f} | {sb[0]:.3f}/{sb[1]:.3f}/{sb[2]:.3f}          "
                f"{len(items) / tb:8.0f} | {tb / ta:6.1f}"
            )
            shown = 0
            for (c, g, r), x, y in zip(items, a, b):
                if shown < args.show_disagreements and x != r:
                    from grpo_core_plugins.rewards.math.extract import extract_answer

                    print(f"   ours={x} mv={y} ref={r} gold={g!r} extracted={extract_answer(c)!r}")
                    shown += 1
    mixed = forms_table(reward, args.forms, args.show_form_disagreements)
    _, t_mv = theirs(mixed)
    print("\nspeed (2 workers; median of 3 passes, each by a fresh reward with warm workers):")
    if plain:
        print(f"  plain numbers (gsm8k solutions, {len(plain)}): {rate(plain):8.0f} items/s")
    print(
        f"  mixed forms ({len(mixed)}), warm workers:      {rate(mixed):8.0f} items/s"
        f"   (math-verify {len(mixed) / t_mv:.0f} items/s)"
    )
    print(f"  mixed forms, from a worker thread:        {rate_in_thread(mixed):8.0f} items/s")
    from grpo_core_plugins.rewards.math.extract import extract_answer, gold_answer

    reward.verifier.cache.clear()
    symbolic = [
        x for x in mixed if reward.verifier.fast(extract_answer(x[0]), gold_answer(x[1])) is None
    ]  # only items the in-process fast path cannot decide
    _, t_mv = theirs(symbolic)
    print(
        f"  symbolic only ({len(symbolic)}), warm workers:  {rate(symbolic):8.0f} items/s"
        f"   (math-verify {len(symbolic) / t_mv:.0f} items/s)"
    )
    made, first = first_call()
    print(
        f"  fresh process: create {made:.2f} s (registry, all plugins), then first call "
        f"{first:.2f} s (median of 3)"
    )
    # hostile set: ours in the per-item budget; nothing may run over it
    t0 = time.perf_counter()
    worst = 0.0
    for text in HOSTILE:
        t = time.perf_counter()
        score = reward(["q"], [text], answer=["2"])[0]
        worst = max(worst, time.perf_counter() - t)
        assert score == 0.0
    print(
        f"hostile set ({len(HOSTILE)} items): ours all 0, slowest {worst:.2f} s (budget 2 s), "
        f"total {time.perf_counter() - t0:.1f} s, worker timeouts {reward.verifier.timeouts}, "
        f"parent peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB, "
        f"/tmp/bench_pwned exists: {os.path.exists('/tmp/bench_pwned')}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
