"""Seconds per GRPO step: grpo-core against TRL's GRPOTrainer, alternating in one process.

    python bench/step_vs_trl.py [--case tiny|gsm8k|both] [--steps 10] [--data ../shared/data]

Same model, task and hyperparameters on both sides: 4 prompts x 8 completions, KL coefficient
0.04 (so each keeps a reference model), lr 1e-4, one thread, gradient checkpointing off on
both (TRL 1.16 turns it on by default; it would only slow TRL down here), token-mean loss
(TRL ``loss_type="dapo"``), the same ``math`` reward. Cases: ``tiny`` (2-layer 64-wide model,
16 new tokens) and ``gsm8k`` (4-layer 256-wide model, GSM8K questions cut to 150 tokens, 64 new
tokens). Each side runs in blocks of warm-up + steps/2 measured steps, alternating
TRL, ours, TRL, ours, so drift hits both; the median step time of each side and the ratio are
printed. Needs the benchmark extra (trl, datasets).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch

WARMUP = 2


def build(path: str, hidden: int, layers: int) -> str:
    from grpo_core.cli.demo import build_model

    return build_model(path, hidden=hidden, layers=layers, max_positions=512)


def rows_for(case: str, data_root: str) -> list[dict]:
    if case == "tiny":
        return [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10)
                for b in range(10)]
    from grpo_core.data import read_rows

    path = os.path.join(data_root, "gsm8k", "train.jsonl")
    if not os.path.exists(path):
        raise SystemExit(f"gsm8k case needs {path} (pass --data)")
    return [{"prompt": r["question"].encode()[:150].decode("utf-8", "ignore"),
             "answer": r["answer"]} for r in read_rows(path)[:256]]


def trl_block(model_dir: str, rows: list[dict], new_tokens: int, steps: int, out: str):
    import datasets
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    from grpo_core.integrations.trl import trl_reward

    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t)

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    args = trl.GRPOConfig(output_dir=out, per_device_train_batch_size=32, num_generations=8,
                          max_completion_length=new_tokens, max_steps=steps, beta=0.04,
                          learning_rate=1e-4, loss_type="dapo", logging_steps=1,
                          report_to=[], use_cpu=True, bf16=False, save_strategy="no",
                          gradient_checkpointing=False, temperature=1.0, seed=0,
                          disable_tqdm=True)
    trainer = trl.GRPOTrainer(model=model, processing_class=tok, args=args,
                              reward_funcs=[trl_reward("math")],
                              train_dataset=datasets.Dataset.from_list(rows),
                              callbacks=[Clock()])
    trainer.train()
    return times[WARMUP:]


def ours_block(model_dir: str, rows: list[dict], new_tokens: int, steps: int, out: str):
    from grpo_core import config
    from grpo_core.cli.demo import write_jsonl
    from grpo_core.trainer import train

    data = os.path.join(out, "data.jsonl")
    write_jsonl(data, rows)
    cfg = config.validate({
        "model": {"name_or_path": model_dir},
        "data": {"path": data, "columns": ["answer"]},
        "sampling": {"group_size": 8, "max_new_tokens": new_tokens, "temperature": 1.0},
        "train": {"steps": steps, "prompts_per_step": 4, "micro_batch_groups": 4},
        "optimizer": {"lr": 1e-4, "max_grad_norm": 1.0},
        "runtime": {"device": "cpu", "threads": 1},
        "reward": {"name": "math"},
        "kl": {"name": "fixed", "options": {"coef": 0.04}},
        "output": {"dir": os.path.join(out, "run"), "progress": False, "save_model": False,
                   "samples_every": 0, "tensorboard": "off"},
        "health": {"enabled": False}})
    train(cfg)
    with open(os.path.join(out, "run", "metrics.jsonl")) as f:
        return [json.loads(x)["time/step"] for x in f][WARMUP:]


def run_case(case: str, steps: int, data_root: str) -> None:
    hidden, layers, new_tokens = (64, 2, 16) if case == "tiny" else (256, 4, 64)
    work = tempfile.mkdtemp(prefix=f"vs_trl_{case}_")
    model_dir = build(os.path.join(work, "model"), hidden, layers)
    rows = rows_for(case, data_root)
    per_block = WARMUP + steps // 2
    trl_times, our_times = [], []
    for i in range(2):
        trl_times += trl_block(model_dir, rows, new_tokens, per_block,
                               os.path.join(work, f"trl{i}"))
        our_times += ours_block(model_dir, rows, new_tokens, per_block,
                                os.path.join(work, f"ours{i}"))
    t, o = statistics.median(trl_times), statistics.median(our_times)
    print(f"| {case} ({layers} layers x {hidden}, 4 x 8 completions, {new_tokens} new tokens) | "
          f"{t:.3f} | {o:.3f} | {o / t:.2f} |", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", choices=["tiny", "gsm8k", "both"], default="both")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--data", default=os.path.join(os.path.dirname(__file__), "..", "..",
                                                   "shared", "data"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    import transformers

    transformers.utils.logging.set_verbosity_error()
    import trl

    print(f"TRL {trl.__version__}, transformers {transformers.__version__}, torch "
          f"{torch.__version__}; 1 thread; median of {args.steps} steps per side after "
          f"{WARMUP} warm-up steps per block")
    print("| case | TRL s/step | grpo-core s/step | ratio (ours / TRL) |")
    print("|---|---|---|---|")
    for case in (["tiny", "gsm8k"] if args.case == "both" else [args.case]):
        run_case(case, args.steps, args.data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
