"""Held-out evaluation: accuracy, unbiased pass@k, reward per dimension, completion length."""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import replace

from tqdm import tqdm

from grpo_core.data.prompts import make_batch, reward_inputs
from grpo_core.env.episodes import EpisodeRunner
from grpo_core.hookspecs import Generator, Reward
from grpo_core.observe.metrics import strict_json, terminal_width
from grpo_core.rollout import SamplingParams
from grpo_core.scores import Scores


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021):
    1 - C(n - c, k) / C(n, k)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def ks_for(n: int) -> list[int]:
    return [k for k in (1, 2, 4, 8, 16, 32, 64, 128) if k <= n]


def evaluate(
    model,
    tokenizer,
    generator: Generator,
    rows: list[dict],
    data_cfg: dict,
    reward_fn: Reward,
    n: int = 1,
    temperature: float = 0.0,
    max_new_tokens: int = 64,
    batch_prompts: int = 16,
    pass_threshold: float = 1.0,
    correct_dimension: str | None = None,
    seed: int = 1234,
    progress: bool = False,
    episodes: EpisodeRunner | None = None,
    settings: SamplingParams | None = None,
) -> tuple[dict, list[dict]]:
    """Generate ``n`` completions per problem (with ``episodes``: ``n`` environment episodes,
    each scored on its last turn) and score them; returns (report, records). ``progress``:
    a progress bar when stderr is a terminal. ``settings``:
    the run's sampling (top-k/p, min-p, repetition penalty, stop strings), whose
    temperature, token budget and batch size are replaced by this evaluation's."""
    sampling = replace(
        settings or SamplingParams(),
        max_new_tokens=max_new_tokens,
        temperature=temperature or 1.0,
        greedy=temperature == 0,
        batch_size=None,
    )
    records, per_problem = [], []
    dims: dict[str, list[float]] = {}
    t0 = time.time()
    # a tqdm bar on a terminal only: a log gets no carriage returns (the report follows)
    bar = tqdm(
        total=len(rows),
        desc="eval",
        unit="problem",
        file=sys.stderr,
        disable=not (progress and sys.stderr.isatty()),
        **terminal_width(),
    )
    for s in range(0, len(rows), batch_prompts):
        chunk = rows[s : s + batch_prompts]
        batch = make_batch(chunk, data_cfg, tokenizer)
        if episodes is None:
            ro, transcripts = (
                generator.generate(batch.prompt_ids, n, sampling, seed=seed, row_offset=s * n),
                None,
            )
        else:
            ro, transcripts = episodes.sample(batch, chunk, n, sampling, seed, s * n)
        prompts, texts, columns = reward_inputs(tokenizer, batch, ro, transcripts)
        g, lengths = columns["group_ids"], columns["completion_tokens"]
        scores = reward_fn(prompts, texts, **columns)
        dimensions = scores.dimensions if isinstance(scores, Scores) else {}
        judged = dimensions.get(correct_dimension, scores) if correct_dimension else scores
        correct_by_prompt = [0] * len(chunk)
        for i, text in enumerate(texts):
            ok = float(judged[i]) >= pass_threshold
            correct_by_prompt[g[i]] += ok
            records.append(
                {
                    "problem": s + g[i],
                    "prompt": batch.raw[g[i]],
                    "completion": text,
                    "reward": float(scores[i]),
                    "correct": ok,
                    "tokens": lengths[i],
                    "dimensions": {k: float(v[i]) for k, v in dimensions.items()},
                    **{k: columns[k][i] for k in batch.columns},
                    **({"messages": columns["messages"][i]} if transcripts else {}),
                }
            )
            for k, v in dimensions.items():
                dims.setdefault(k, []).append(float(v[i]))
        per_problem += correct_by_prompt
        bar.update(len(chunk))
    bar.close()
    total = len(records)
    report = {
        "problems": len(rows),
        "samples_per_problem": n,
        "temperature": temperature,
        "accuracy": sum(r["correct"] for r in records) / max(total, 1),
        "reward": sum(r["reward"] for r in records) / max(total, 1),
        "completion_len": sum(r["tokens"] for r in records) / max(total, 1),
        **{
            f"pass@{k}": sum(pass_at_k(n, c, k) for c in per_problem) / max(len(rows), 1)
            for k in ks_for(n)
        },
        **{f"reward/{k}": sum(v) / len(v) for k, v in dims.items()},
        "seconds": time.time() - t0,
    }
    return report, records


def write(out_dir: str, report: dict, records: list[dict]) -> None:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "report.json"), "w", encoding="utf-8") as f:
        f.write(strict_json(report, indent=2))
    with open(os.path.join(out_dir, "completions.jsonl"), "w", encoding="utf-8") as f:
        for r in records:
            f.write(strict_json(r, default=str) + "\n")
