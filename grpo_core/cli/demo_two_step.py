"""``grpo demo --task two-step``: the pretrained demo, then two stages that teach two-step word
problems (docs/recipes.md, the ninth round).

Stage 1 is ``grpo demo --task pretrained`` (one-step training problems, its recipe sampled at
``TEMPERATURE``, and ``--set`` overrides, which every later stage keeps). Stage 2 continues
from its final weights on two-step problems only, under a system prompt whose worked example
takes two calculations; stage 3 continues from stage 2 on problems half one-step and half
two-step, under a prompt with both worked examples. The order is what works: a policy trained
on one-step problems (a GRPO run of the SmolLM2 study) and then on mixed problems answered
two-step problems with one calculation (0.00).
Held-out greedy accuracy, overall and per kind, of the base model and of stage 3's final
model under stage 3's prompt closes the demo (``summary.json``); each stage's directory holds
its config, data and run.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace

import yaml

from grpo_core import config as config_mod
from grpo_core.cli import demo_pretrained, word_problems
from grpo_core.config.file import with_values
from grpo_core.config.view import view
from grpo_core.data.sources import read_rows
from grpo_core.tiny import write_jsonl

HEAD = (
    "You solve math word problems. Reply in one line: the calculations, then the answer in "
    "\\boxed{}.\n"
)
TWO_STEP_EXAMPLE = (
    "Example question: A bag holds 6 pears. Ann buys 4 bags and already had 5 pears. "
    "How many pears does Ann have now?\n"
    "Example reply: 6 * 4 = 24. 24 + 5 = 29. \\boxed{29}"
)
ONE_STEP_EXAMPLE = (
    "Example question: A bag holds 6 pears. Ann buys 4 bags. How many pears does Ann buy?\n"
    "Example reply: 6 * 4 = 24. \\boxed{24}\n"
)
PROMPTS = {
    "one-step example": demo_pretrained.SYSTEM_PROMPT,
    "two-step example": HEAD + TWO_STEP_EXAMPLE,
    "both examples": HEAD + ONE_STEP_EXAMPLE + TWO_STEP_EXAMPLE,
}
#: the sampling temperature the three stages were measured at (docs/recipes.md, the ninth
#: round), before the pretrained demo's recipe moved to 0.8; ``--set`` still overrides it
TEMPERATURE = 1.0
#: stages 2 and 3: (system prompt, training problems' templates (None: half of each kind),
#: the problems' seed, steps)
STAGES = (
    ("two-step example", word_problems.TWO_STEP, 7, 30),
    ("both examples", None, 11, 20),
)
STAGE_STEPS = tuple(stage[-1] for stage in STAGES)


def next_stage(prev: str, weights: str, out: str, prompt: str, rows: list[dict], steps: int) -> str:
    """The config of a stage that starts from ``weights`` (``prev``'s final model): ``prev``'s
    recipe, its model settings and overrides kept, with these training rows, this system
    prompt and the same held-out problems; a LoRA stage saves merged weights for the next."""
    os.makedirs(os.path.join(out, "data"), exist_ok=True)
    write_jsonl(os.path.join(out, "data", "train.jsonl"), rows)
    write_jsonl(os.path.join(out, "data", "test.jsonl"), written_held_out(prev))
    with open(os.path.join(prev, "config.yaml"), encoding="utf-8") as f:
        written = yaml.safe_load(f)
    values = {
        "model.name_or_path": weights,
        "model.gguf_file": None,  # a saved model now, not the GGUF file
        "data.path": os.path.join(out, "data", "train.jsonl"),
        "data.system_prompt": prompt,
        "eval.data": os.path.join(out, "data"),
        "output.dir": os.path.join(out, "run"),
        "train.steps": steps,
    }
    if view(config_mod.validate(written)).model.lora:
        values["model.lora.save_merged"] = True
    cfg = with_values(written, values)
    path = os.path.join(out, "config.yaml")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)
    os.replace(path + ".tmp", path)
    return path


def written_held_out(stage: str) -> list[dict]:
    """The held-out problems as ``stage`` wrote them (its ``data/test.jsonl``): handed on to
    the next stage and kept out of its training problems."""
    return read_rows(os.path.join(stage, "data", "test.jsonl"))


def judge(stage: str, model_path: str | None, prompt: str) -> tuple[dict[str, float], int]:
    """Greedy held-out accuracy, overall and per kind, under ``prompt`` of ``model_path``
    (None: ``stage``'s configured model) with ``stage``'s evaluation settings, and how many
    problems were judged (``eval.max_problems`` may cut the written ones)."""
    cfg = view(config_mod.load(os.path.join(stage, "config.yaml"), []))
    cfg = replace(cfg, data=replace(cfg.data, system_prompt=prompt))
    rows, (accuracy, records), _ = demo_pretrained.accuracies(cfg, model_path)
    return {"all": accuracy, **demo_pretrained.by_kind(rows, records)}, len(rows)


def run(
    out: str,
    steps: int | None = None,
    overrides: list[str] | None = None,
    heldout_n: int = demo_pretrained.N_HELDOUT,
    stage_steps: tuple[int, ...] = STAGE_STEPS,
) -> int:
    """The three stages in ``out/stage1..3``, then the closing figures (``summary.json``).
    ``steps``: stage 1's (the pretrained demo's); ``stage_steps``: stages 2 and 3's."""
    from grpo_core.trainer import train

    t0 = time.time()
    if os.path.exists(os.path.join(out, "summary.json")):  # an earlier run's: not this one's
        os.remove(os.path.join(out, "summary.json"))
    stages = [os.path.join(out, f"stage{i}") for i in (1, 2, 3)]
    first_overrides = [f"sampling.temperature={TEMPERATURE}", *(overrides or [])]
    demo_pretrained.run(stages[0], steps, first_overrides, heldout_n, gsm8k_n=0)
    with open(os.path.join(stages[0], "summary.json"), encoding="utf-8") as f:
        first = json.load(f)
    final = first["model_dir"]  # merged weights under LoRA; wherever output.dir put them
    exclude = frozenset(r["prompt"] for r in written_held_out(stages[0]))
    for prev, stage, (prompt, templates, seed, _), n in zip(
        stages[:-1], stages[1:], STAGES, stage_steps, strict=True
    ):
        print(f"\n{os.path.basename(stage)}: {n} steps under the {prompt} prompt", flush=True)
        rows = word_problems.problems(demo_pretrained.N_TRAIN, seed, templates, exclude)
        path = next_stage(prev, final, stage, PROMPTS[prompt], rows, n)
        cfg = config_mod.load(path)
        result = train(cfg, overwrite=True)
        lora = bool(view(cfg).model.lora)
        final = os.path.join(result["run_dir"], "final", *(["merged"] if lora else []))
    final_prompt = STAGES[-1][0]
    before, n = judge(stages[0], None, PROMPTS[final_prompt])
    after, _ = judge(stages[-1], final, PROMPTS[final_prompt])
    seconds = time.time() - t0
    summary = {
        "prompt": final_prompt,
        "heldout_n": n,
        "before": before,
        "after": after,
        "stage_steps": [first["steps"], *stage_steps],
        "seconds": seconds,
        "model_dir": final,
    }
    with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    per_kind = ", ".join(f"{k} {before[k]:.2f} -> {after[k]:.2f}" for k in after if k != "all")
    print(
        f"\nheld-out greedy accuracy under the {final_prompt} prompt {before['all']:.2f} -> "
        f"{after['all']:.2f} on {n} problems never trained on ({per_kind}); {seconds:.0f} s "
        f"in all\nsummary: {os.path.join(out, 'summary.json')}; model: {final}"
    )
    return 0
