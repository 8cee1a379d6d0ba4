"""The multi-turn CPU demo: a tiny model learns to use the ``calculator`` environment for
three-digit sums it cannot do in its head.

The task is ``a+b=`` with a, b in 100..999; the ``math`` reward (strict: a bare number)
scores the last model turn. A turn that writes ``<calc>EXPR</calc>`` gets
``<result>VALUE</result>`` back from the calculator and goes on; a turn without a call is
the final answer. A supervised warm start teaches both formats: it trains on trajectories
that call the tool (how to write a call and copy its result) and on trajectories that answer
in the head, but trains the *decision* to call (the first token of a call) on only a few of
them, so the model starts by answering in its head most of the time and is nearly always
wrong there. GRPO does the climb: the trajectories that called the tool are the ones that
score, and the tool-call rate rises with the reward.
"""

from __future__ import annotations

import os
import random
import time

import torch

from grpo_core import config as config_mod
from grpo_core.errors import UserError
from grpo_core.tiny import build_model, write_jsonl

STEPS = 150
WARM_STEPS = 500
TOOL_SHARE = 0.6  # warm-start trajectories that call the calculator (teaching its format)
CALL_SHARE = 0.07  # ... in which the decision to call it (the call's first token) is trained
OPEN, CLOSE, RESULT = "<calc>", "</calc>", ("<result>", "</result>")


def sum_rows(n: int, seed: int = 0) -> list[dict]:
    """``n`` problems a+b with a, b in 100..999."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        out.append({"prompt": f"{a}+{b}=", "answer": str(a + b)})
    return out


def trajectory(row: dict, tool: bool, eos: str, decide: bool = True) -> list[tuple[str, int]]:
    """A warm-start trajectory as (text, trained) pieces, exactly as an episode lays them
    out in plain text (the calculator's result between its delimiters); ``decide``: the
    call's first character is trained too."""
    answer = row["answer"]
    if not tool:
        return [(row["prompt"], 0), (answer + eos, 1)]
    expr = row["prompt"].rstrip("=")
    return [
        (row["prompt"], 0),
        (OPEN[:1], int(decide)),
        (OPEN[1:] + expr + CLOSE, 1),
        (RESULT[0] + answer + RESULT[1], 0),
        (answer + eos, 1),
    ]


def warm_start(
    path: str,
    rows: list[dict],
    steps: int = WARM_STEPS,
    seed: int = 0,
    tool_share: float = TOOL_SHARE,
    call_share: float = CALL_SHARE,
) -> None:
    """Supervised steps (batches of 32, AdamW 3e-3) on the model's pieces only."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rng = random.Random(seed)
    model.train()
    for _ in range(steps):
        ids, labels = [], []
        for row in rng.sample(rows, 32):
            i: list[int] = []
            la: list[int] = []
            tool = rng.random() < tool_share
            decide = rng.random() < call_share / tool_share
            for text, mine in trajectory(row, tool, tok.eos_token, decide):
                t = tok(text, add_special_tokens=False)["input_ids"]
                i += t
                la += t if mine else [-100] * len(t)
            ids.append(i)
            labels.append(la)
        width = max(map(len, ids))
        x = torch.tensor([i + [tok.pad_token_id] * (width - len(i)) for i in ids])
        y = torch.tensor([la + [-100] * (width - len(la)) for la in labels])
        att = (torch.arange(width)[None, :] < torch.tensor([len(i) for i in ids])[:, None]).long()
        loss = model(input_ids=x, attention_mask=att, labels=y).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(path)


def demo_config(out: str, steps: int) -> dict:
    return {
        "model": {"name_or_path": os.path.join(out, "model")},
        "data": {"path": os.path.join(out, "data", "train.jsonl"), "columns": ["answer"]},
        "sampling": {"group_size": 8, "max_new_tokens": 24, "temperature": 1.0},
        "environment": {
            "name": "calculator",
            "max_turns": 3,
            "max_total_tokens": 72,
            "timeout": 10,
        },
        "train": {"steps": steps, "prompts_per_step": 16, "micro_batch_groups": 16, "seed": 0},
        "optimizer": {"lr": 2e-4, "lr_schedule": "constant", "max_grad_norm": 1.0},
        "runtime": {"device": "cpu", "threads": 1},
        "reward": {"name": "math", "options": {"strict": True}},
        "baseline": {"name": "grpo"},
        "kl": {"name": "fixed", "options": {"coef": 0.0}},
        "output": {"dir": os.path.join(out, "run"), "samples_every": 25},
        "health": {"window": 20},
    }


def prepare(out: str, seed: int = 0) -> None:
    """Model, data and the warm start under ``out`` (skipped if already there)."""
    model_dir = os.path.join(out, "model")
    if os.path.exists(os.path.join(model_dir, "config.json")):
        return
    torch.set_num_threads(1)  # on a shared CPU one thread runs this small model fastest
    rows = sum_rows(4000, seed)
    write_jsonl(os.path.join(out, "data", "train.jsonl"), rows[:3500])
    write_jsonl(os.path.join(out, "data", "test.jsonl"), rows[3500:])
    # a small rotary base: sharp relative positions, which copying at a fixed offset needs
    build_model(model_dir, seed=seed, max_positions=128, rope_theta=100.0)
    warm_start(model_dir, rows[:3500], seed=seed)


def plot(run_dir: str, path: str, window: int = 10) -> str | None:
    """Reward and tool-call rate (trailing means) on one figure; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    from grpo_core.cli.plots import smooth
    from grpo_core.observe.metrics import read

    records = read(run_dir)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for key, label in (
        ("reward", "mean reward"),
        ("env/tool_call_frac", "tool-call rate"),
        ("env/tool_errors", "tool errors per episode"),
    ):
        ax.plot(
            [r["step"] for r in records], smooth([r[key] for r in records], window), label=label
        )
    ax.set(
        xlabel="step",
        ylim=(-0.02, 1.02),
        title=f"calculator demo (trailing mean over {window} steps)",
    )
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def run(out: str, steps: int | None = None, overrides: list[str] | None = None) -> int:
    t0 = time.time()
    print(f"building the tiny model and three-digit sums under {out} ...", flush=True)
    prepare(out)
    cfg_path = os.path.join(out, "config.yaml")
    import yaml

    with open(cfg_path, "w", encoding="utf-8") as f:
        yaml.safe_dump(demo_config(out, steps or STEPS), f, sort_keys=False)
    cfg = config_mod.load(cfg_path, overrides)
    from grpo_core.trainer import train

    summary = train(cfg, overwrite=True)
    if summary["first_reward"] is None:
        raise UserError("demo ran no steps")
    from grpo_core.observe.metrics import read

    records = read(summary["run_dir"])
    k = min(10, len(records))

    def mean(key: str, part: list[dict]) -> float:
        return sum(r[key] for r in part) / len(part)

    head, tail = records[:k], records[-k:]
    figure = plot(summary["run_dir"], os.path.join(summary["run_dir"], "calculator.png"))
    print(
        f"\ncalculator demo: mean reward {mean('reward', head):.3f} over the first {k} steps "
        f"-> {mean('reward', tail):.3f} over the last {k}; tool-call rate "
        f"{mean('env/tool_call_frac', head):.3f} -> {mean('env/tool_call_frac', tail):.3f}; "
        f"{len(records)} steps, {time.time() - t0:.0f} s in all ({summary['seconds']:.0f} s "
        f"of RL)"
    )
    print(f"run directory: {summary['run_dir']}" + (f"; figure: {figure}" if figure else ""))
    return 0
