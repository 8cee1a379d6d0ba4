"""Held-out evaluation: accuracy, unbiased pass@k, reward per dimension, completion length.

One evaluation serves validation during training, ``grpo eval`` and the pretrained demo's
before and after (:func:`held_out_rows`, :func:`evaluate_configured`): the same problems,
settings, seed, batches and numerics, so the same weights get the same figure wherever they
are evaluated (docs/recipes.md, "One evaluation").
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import replace

import torch
from tqdm import tqdm

from grpo_core.config.view import Config, DataSection
from grpo_core.data.prompts import check_fields, column_map, fit_prompts, make_batch, reward_inputs
from grpo_core.data.sources import read_rows
from grpo_core.env.episodes import EpisodeRunner
from grpo_core.errors import UserError
from grpo_core.hookspecs import Generator, Reward
from grpo_core.observe.metrics import strict_json, terminal_width
from grpo_core.rollout import SamplingParams
from grpo_core.scores import Scores
from grpo_core.store.models import context_length, numerics, resolve_sampling


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
    data: DataSection,
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
        batch = make_batch(chunk, data, tokenizer)
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
            ok = judged[i] is not None and float(judged[i]) >= pass_threshold  # None: no reward
            correct_by_prompt[g[i]] += ok
            records.append(
                {
                    "problem": s + g[i],
                    "prompt": batch.raw[g[i]],
                    "completion": text,
                    "reward": None if scores[i] is None else float(scores[i]),
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
    scored = [r["reward"] for r in records if r["reward"] is not None]  # None: no reward
    report = {
        "problems": len(rows),
        "samples_per_problem": n,
        "temperature": temperature,
        "accuracy": sum(r["correct"] for r in records) / max(total, 1),
        "reward": sum(scored) / max(len(scored), 1),
        "completion_len": sum(r["tokens"] for r in records) / max(total, 1),
        **{
            f"pass@{k}": sum(pass_at_k(n, c, k) for c in per_problem) / max(len(rows), 1)
            for k in ks_for(n)
        },
        **{f"reward/{k}": sum(v) / len(v) for k, v in dims.items()},
        "seconds": time.time() - t0,
    }
    return report, records


def evaluate_configured(
    model,
    tokenizer,
    generator: Generator,
    rows: list[dict],
    config: Config,
    reward_fn: Reward,
    device: torch.device,
    episodes: EpisodeRunner | None = None,
    progress: bool = False,
    n: int | None = None,
    temperature: float | None = None,
) -> tuple[dict, list[dict]]:
    """:func:`evaluate` as ``config`` sets it: the ``eval`` section's samples per problem,
    temperature, batch, pass threshold and correctness dimension (``n`` and ``temperature``
    replace the first two when given), the ``sampling`` section's settings and token budget
    (nulls resolved from the model, as training resolves them), the fixed evaluation seed,
    and training's numerics (:func:`grpo_core.store.models.numerics`: bfloat16 autocast on a
    GPU with ``model.dtype: auto``). Validation during training and the evaluation of a saved
    model both call this, so they compute the same thing."""
    ec = config.eval
    sampling = resolve_sampling(model, config.sampling, announce=False)
    with torch.no_grad(), numerics(device, config.model.dtype):
        return evaluate(
            model,
            tokenizer,
            generator,
            rows,
            config.data,
            reward_fn,
            n=ec.n if n is None else n,
            temperature=ec.temperature if temperature is None else temperature,
            max_new_tokens=sampling.max_new_tokens,
            batch_prompts=ec.batch_prompts,
            pass_threshold=ec.pass_threshold,
            correct_dimension=ec.correct_dimension,
            progress=progress,
            episodes=episodes,
            settings=SamplingParams.from_config(sampling),
        )


def held_out_rows(
    config: Config,
    tokenizer,
    model,
    path: str | None = None,
    split: str | None = None,
    max_problems: int | None = None,
    key: str = "eval.data",
) -> tuple[list[dict], int]:
    """The held-out problems and how many of them were long: ``path`` (default ``eval.data``,
    else the training data's ``data.path``) at ``split`` (default ``eval.split``), checked,
    fitted to training's prompt limit by ``data.long_prompts`` (a model is judged on prompts
    it could have trained on), then the first ``max_problems`` (default
    ``eval.max_problems``). ``key``: the setting named in an error about the source."""
    ec, dc = config.eval, config.data
    path = path or ec.data or dc.path
    same = path == dc.path  # the training set's source keeps its configuration, data_files
    rows = read_rows(
        path,
        split or ec.split,
        dc.name if same else None,
        dc.data_files if same else None,
        key=key,
    )
    check_fields(rows, [dc.prompt_field, *column_map(dc)], path)
    budget_key, budget = config.completion_budget
    limit = dc.max_prompt_tokens or (context_length(model) or 10**9) - budget
    if limit < 1:
        raise UserError(
            f"{budget_key}: {budget} leaves no room for a prompt in the model's context"
        )
    kept, long = fit_prompts(rows, tokenizer, dc, limit)
    if long:
        print(
            f"warning: {long} of {len(rows)} held-out prompts are longer than {limit} tokens; "
            f"data.long_prompts: {dc.long_prompts}",
            file=sys.stderr,
        )
    cut = max_problems or ec.max_problems
    return kept[:cut] if cut else kept, long


def accuracy_by(rows: list[dict], records: list[dict], column: str) -> dict[str, dict]:
    """Accuracy per value of a data column (MATH-500's ``level``, the word problems'
    ``kind``): ``{value: {"problems", "accuracy"}}`` in sorted order of the values as text,
    each accuracy the share of correct completions of that value's problems (the report's
    ``accuracy`` restricted to them). ``records`` are :func:`evaluate`'s, each naming its
    row of ``rows`` by position; every row must hold ``column``."""
    right: dict[str, list[bool]] = {}
    problems: dict[str, set[int]] = {}
    for r in records:
        value = str(rows[r["problem"]][column])
        right.setdefault(value, []).append(bool(r["correct"]))
        problems.setdefault(value, set()).add(r["problem"])
    return {
        v: {"problems": len(problems[v]), "accuracy": sum(right[v]) / len(right[v])}
        for v in sorted(right)
    }


def write(out_dir: str, report: dict, records: list[dict]) -> None:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "report.json"), "w", encoding="utf-8") as f:
        f.write(strict_json(report, indent=2))
    with open(os.path.join(out_dir, "completions.jsonl"), "w", encoding="utf-8") as f:
        for r in records:
            f.write(strict_json(r, default=str) + "\n")
