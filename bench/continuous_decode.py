"""Continuous batching in the static decode path, on the CPU: tokens/s with rows replaced as
they finish against fixed batches that each run to their longest completion.

    python bench/continuous_decode.py [--rows 64] [--slots 8] [--new-tokens 64] [--repeats 5]

CPU-only figures of the loop's bookkeeping, not of a GPU: a tiny random model (2 layers, 32
wide), the hf generator with ``decode: static`` (its decode step compiled with torch.compile's
``eager`` backend: dynamo's trace, no code generation), one thread, temperature 1, and a
sixth of the vocabulary ending a completion, so lengths are skewed (geometric, mean about 6,
cut at the budget). Both sides decode the same ``--rows`` completions (one per prompt) with
``--slots`` rows at a time and the same seeds, so they give the same tokens (checked):

- fixed batches: ``generate`` on each ``--slots`` prompts in turn (no row waits: the batch
  runs until its longest completion ends);
- continuous: one ``generate`` over all prompts with ``sampling.batch_size = --slots`` (a row
  that ends hands its slot to the next at the next check).

Printed: each side's median tokens/s over ``--repeats`` alternating runs, decode steps, and the
ratio continuous / fixed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=64, help="completions (one per prompt)")
    ap.add_argument("--slots", type=int, default=8, help="rows decoded at once")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--check-every", type=int, default=4)
    return ap.parse_args(argv)


def generator(path: str, check_every: int):
    """An hf generator decoding statically on the CPU, its steps counted."""
    import torch
    from grpo_core_plugins.generators.hf import HFGenerator
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    gen = HFGenerator(decode="static", compile_backend="eager", check_every=check_every)
    gen.setup(AutoModelForCausalLM.from_pretrained(path), tok, torch.device("cpu"))
    gen.eos = torch.arange(0, gen.head.weight.shape[0], 6)  # skewed lengths
    step, gen.steps = gen.static.step, [0]

    def counted(*a):
        gen.steps[0] += 1
        return step(*a)

    gen.static.step = counted
    return gen, tok


def fixed(gen, prompts, sp, slots: int):
    """Fixed batches of ``slots`` prompts, each to its longest completion: the tokens of
    every row (the rollouts' masks applied) and the completion tokens."""
    out = []
    for s in range(0, len(prompts), slots):
        ro = gen.generate(prompts[s : s + slots], 1, sp, seed=0, row_offset=s)
        out += [r[m.bool()].tolist() for r, m in zip(ro.completion_ids, ro.completion_mask)]
    return out


def continuous(gen, prompts, sp, slots: int):
    """All prompts at once through ``slots`` slots."""
    ro = gen.generate(prompts, 1, replace(sp, batch_size=slots), seed=0)
    return [r[m.bool()].tolist() for r, m in zip(ro.completion_ids, ro.completion_mask)]


def main(argv: list[str] | None = None) -> int:
    import torch

    from grpo_core.rollout import SamplingParams
    from grpo_core.tiny import build_model

    args = parse(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as work:
        path = build_model(os.path.join(work, "tiny"), hidden=32, layers=2, seed=0)
        gen, tok = generator(path, args.check_every)
        prompts = [
            tok(f"{i}+{i % 7}=", add_special_tokens=False)["input_ids"] for i in range(args.rows)
        ]
        sp = SamplingParams(args.new_tokens, temperature=1.0)
        sides = {"fixed": fixed, "continuous": continuous}
        for run in sides.values():  # compile, warm up
            run(gen, prompts, sp, args.slots)
        rates: dict[str, list[float]] = {k: [] for k in sides}
        steps, tokens = {}, {}
        for _ in range(args.repeats):
            for name, run in sides.items():
                gen.steps[0] = 0
                t0 = time.perf_counter()
                tokens[name] = run(gen, prompts, sp, args.slots)
                rates[name].append(sum(map(len, tokens[name])) / (time.perf_counter() - t0))
                steps[name] = gen.steps[0]
    if tokens["fixed"] != tokens["continuous"]:
        print("the two sides gave different tokens", file=sys.stderr)
        return 1
    lengths = [len(t) for t in tokens["fixed"]]
    print(
        f"{args.rows} completions through {args.slots} slots, lengths mean "
        f"{statistics.mean(lengths):.1f}, max {max(lengths)}, budget {args.new_tokens} "
        f"(CPU, tiny model, one thread)"
    )
    median = {k: statistics.median(v) for k, v in rates.items()}
    for name in sides:
        print(f"{name:>10}: {median[name]:8.0f} tokens/s, {steps[name]} decode steps")
    print(f"continuous / fixed: {median['continuous'] / median['fixed']:.2f}x tokens/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
