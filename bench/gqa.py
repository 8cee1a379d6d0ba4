"""The log-prob passes with SDPA reading grouped key/value heads in place, against
transformers' copies of them per query head, in alternation in one process.

    python bench/gqa.py [--case gsm8k,smollm2] [--rounds 8] [--data ../shared/data]

One batch per case, sampled once by the ``hf`` generator (4 prompts x 8 completions of the case
in bench/step_vs_trl.py, temperature 1), then rounds of: the training pass (log-probs with
gradients and their backward) and the reference pass (inference mode), each with the switch on
(``grouped``: grpo_core.model.logprobs as it runs) and off (``copied``: the model's own path),
``runtime.packing: auto``, one thread, the side that goes first alternating by round. The first
round warms up; per side the median wall seconds, and the ratio: each round's grouped over
copied, the median over the rounds of each order, the geometric mean of the two (a drifting
machine moves a round's two sides alike; the order within a round moved the ratio by a few
points in one run).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from decode import model_for, prompts_for  # noqa: E402
from step_vs_trl import CASES  # noqa: E402


def passes(model, rollout) -> dict:
    """The two passes as calls."""
    from grpo_core.model import logprobs

    def train():
        model.zero_grad(set_to_none=True)
        lp, _ = logprobs.completion_logprobs(model, rollout, 1.0, 1024, packing="auto")
        lp.sum().backward()

    def reference():
        logprobs.reference_logprobs(
            model, rollout, 1.0, 1024, contextlib.nullcontext(), packing="auto"
        )

    return {"train": train, "reference": reference}


def run_case(case: str, rounds: int, data_root: str) -> None:
    from grpo_core_plugins.generators.hf import HFGenerator
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_core.model import logprobs
    from grpo_core.rollout import SamplingParams

    _, _, P, G, new_tokens, _ = CASES[case]
    path = model_for(case, tempfile.mkdtemp(prefix=f"gqa_{case}_"))
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    gen = HFGenerator()
    gen.setup(model, tok, torch.device("cpu"))
    rollout = gen.generate(prompts_for(case, tok, data_root), G, SamplingParams(new_tokens))
    model.train()
    grouped = logprobs._grouped_query_sdpa
    switch = {"grouped": grouped, "copied": lambda *a: contextlib.nullcontext()}
    calls = passes(model, rollout)
    times = {(s, p): [] for s in switch for p in calls}
    for r in range(rounds + 1):
        order = list(switch) if r % 2 else list(switch)[::-1]  # each side first by turns
        for side in order:
            logprobs._grouped_query_sdpa = switch[side]
            for name, call in calls.items():
                t = time.perf_counter()
                call()
                if r:  # the first round warms up
                    times[side, name].append(time.perf_counter() - t)
    logprobs._grouped_query_sdpa = grouped
    for name in calls:
        on, off = times["grouped", name], times["copied", name]
        ratios = [a / b for a, b in zip(on, off)]
        # the two orders' medians, geometric mean: neither order's share of rounds tips it
        ratio = math.sqrt(statistics.median(ratios[0::2]) * statistics.median(ratios[1::2]))
        print(
            f"| {case} ({P} x {G}, {new_tokens} new) | {name} | {statistics.median(on):.3f} | "
            f"{statistics.median(off):.3f} | {ratio:.2f} |",
            flush=True,
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="gsm8k", help="comma-separated: gsm8k, smollm2")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--data", default=os.path.join("..", "shared", "data"))
    args = ap.parse_args()
    if args.rounds < 2 or args.rounds % 2:
        ap.error("--rounds: an even number, at least 2 (each side first in half of them)")
    torch.set_num_threads(1)
    print(
        f"torch {torch.__version__}; 1 thread; {args.rounds} rounds after one warm-up, sides "
        "in alternation; median wall seconds; ratio: each order's median of grouped/copied, "
        "their geometric mean"
    )
    print("| case | pass | grouped s | copied s | grouped/copied |")
    print("|---|---|---|---|---|")
    for case in args.case.split(","):
        if case not in ("gsm8k", "smollm2"):
            raise SystemExit(f"--case: unknown case {case!r} (expected gsm8k or smollm2)")
        run_case(case, args.rounds, args.data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
