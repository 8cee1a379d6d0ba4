"""``grpo eval``: evaluate a model on held-out problems with a config's reward and data."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace

import torch

import grpo_core
from grpo_core import config as config_mod
from grpo_core.config.view import Config, view
from grpo_core.data.prompts import check_fields, column_map, fit_prompts
from grpo_core.data.sources import read_rows
from grpo_core.env.episodes import EpisodeRunner
from grpo_core.errors import UserError
from grpo_core.observe.evaluate import evaluate, write
from grpo_core.reward.isolation import build_reward
from grpo_core.rollout import SamplingParams
from grpo_core.store.models import (
    context_length,
    load_model,
    load_tokenizer,
    pick_device,
    resolve_sampling,
)


def evaluate_cli(args) -> int:
    """``grpo eval``: the config gives the reward, data layout and generator."""
    config = view(config_mod.load(args.config, args.set))
    if args.model:  # a trained model is a directory, not the GGUF file
        model_section = replace(config.model, name_or_path=args.model, gguf_file=None)
        config = replace(config, model=model_section)
    if args.n < 1:
        raise UserError("--n: expected a number >= 1")
    if not (args.temperature >= 0 and args.temperature < float("inf")):
        raise UserError(
            f"--temperature: found {args.temperature}, expected 0 (greedy) or a positive number"
        )
    if args.max_problems is not None and args.max_problems < 1:
        raise UserError(
            f"--max-problems: found {args.max_problems}, expected a number >= 1 "
            f"(leave it out for all problems)"
        )
    device = pick_device(config.runtime.device)
    tokenizer = load_tokenizer(config.model)
    model = load_model(config.model, device).eval()
    sampling = resolve_sampling(model, config.sampling, announce=True)
    gen = grpo_core.create("generator", config.generator.name, config.generator.options)
    gen.setup(model, tokenizer, device)
    reward_fn = build_reward(config.reward)
    episodes = None
    env = config.environment
    if env:  # episodes, scored on their last turn as in training
        if not gen.supports_episodes:
            raise UserError(
                f"generator.name: {config.generator.name!r} cannot sample "
                f"multi-turn episodes; use hf or vllm"
            )
        episodes = EpisodeRunner(
            grpo_core.create("environment", env.name, env.options),
            gen,
            tokenizer,
            env,
            config.data,
        )
    path, dc = args.data or config.data.path, config.data
    same = path == dc.path  # the training set's source keeps its configuration, data_files
    rows = read_rows(
        path,
        args.split,
        dc.name if same else None,
        dc.data_files if same else None,
        key="--data" if args.data else "data.path",
    )
    check_fields(rows, [dc.prompt_field, *column_map(dc)], path)
    rows, long = _fit(rows, config, tokenizer, model)
    rows = rows[: args.max_problems] if args.max_problems else rows
    with torch.no_grad():
        report, records = evaluate(
            model,
            tokenizer,
            gen,
            rows,
            dc,
            reward_fn,
            n=args.n,
            batch_prompts=config.eval.batch_prompts,
            temperature=args.temperature,
            max_new_tokens=sampling.max_new_tokens,
            progress=True,
            episodes=episodes,
            settings=SamplingParams.from_config(sampling),
        )
    if episodes is not None:
        episodes.close()
    report["model"] = config.model.name_or_path
    report["long_prompts"] = long
    out = args.out or os.path.join(config.output.dir, "eval")
    write(out, report, records)
    print(json.dumps(report, indent=2))
    print(f"wrote {out}/report.json and {out}/completions.jsonl")
    return 0


def _fit(rows: list[dict], config: Config, tokenizer, model) -> tuple[list[dict], int]:
    """``data.long_prompts`` applied as training applies it (the same prompt limit), so a
    model is evaluated on the prompts it could have trained on; says how many were long."""
    budget_key, budget = config.completion_budget
    dc = config.data
    limit = dc.max_prompt_tokens or (context_length(model) or 10**9) - budget
    if limit < 1:
        raise UserError(
            f"{budget_key}: {budget} leaves no room for a prompt in the model's context"
        )
    kept, long = fit_prompts(rows, tokenizer, dc, limit)
    if long:
        print(
            f"warning: {long} of {len(rows)} prompts are longer than {limit} tokens; "
            f"data.long_prompts: {dc.long_prompts}",
            file=sys.stderr,
        )
    return kept, long
