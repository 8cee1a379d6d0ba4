"""``grpo eval``: evaluate a model on held-out problems with a config's reward and data."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import torch

import grpo_core
from grpo_core import config as config_mod
from grpo_core.config.view import view
from grpo_core.env.episodes import EpisodeRunner
from grpo_core.errors import UserError
from grpo_core.observe.evaluate import accuracy_by, evaluate_configured, held_out_rows, write
from grpo_core.reward.isolation import build_reward
from grpo_core.store.models import load_model, load_tokenizer, pick_device, resolve_sampling


def evaluate_cli(args) -> int:
    """``grpo eval``: the config gives the reward, data layout, generator and the held-out
    evaluation (its ``eval`` section: problems, samples, temperature, batch, threshold),
    evaluated exactly as validation during training evaluates; flags replace those."""
    config = view(config_mod.load(args.config, args.set))
    if args.model:  # a trained model is a directory, not the GGUF file
        model_section = replace(config.model, name_or_path=args.model, gguf_file=None)
        config = replace(config, model=model_section)
    if args.n is not None and args.n < 1:
        raise UserError("--n: expected a number >= 1")
    if args.temperature is not None and not (0 <= args.temperature < float("inf")):
        raise UserError(
            f"--temperature: found {args.temperature}, expected 0 (greedy) or a positive number"
        )
    if args.max_problems is not None and args.max_problems < 1:
        raise UserError(
            f"--max-problems: found {args.max_problems}, expected a number >= 1 "
            f"(leave it out for all problems)"
        )
    if config.runtime.threads:  # training's thread count: a CPU sum's order can follow it
        torch.set_num_threads(config.runtime.threads)
    device = pick_device(config.runtime.device)
    tokenizer = load_tokenizer(config.model)
    model = load_model(config.model, device).eval()
    resolve_sampling(model, config.sampling, announce=True)
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
    rows, long = held_out_rows(
        config,
        tokenizer,
        model,
        args.data,
        args.split,
        args.max_problems,
        key="--data" if args.data else "eval.data" if config.eval.data else "data.path",
    )
    for column in args.by or []:
        missing = sum(column not in r for r in rows)
        if missing:
            raise UserError(
                f"--by {column}: {missing} of {len(rows)} held-out problems have no "
                f"{column!r} field (fields of the first: {', '.join(sorted(rows[0]))})"
            )
    report, records = evaluate_configured(  # as validation during training evaluates
        model,
        tokenizer,
        gen,
        rows,
        config,
        reward_fn,
        device,
        episodes=episodes,
        progress=True,
        n=args.n,
        temperature=args.temperature,
    )
    if episodes is not None:
        episodes.close()
    if args.by:
        report["by"] = {column: accuracy_by(rows, records, column) for column in args.by}
    report["model"] = config.model.name_or_path
    report["long_prompts"] = long
    out = args.out or os.path.join(config.output.dir, "eval")
    write(out, report, records)
    print(json.dumps(report, indent=2))
    print(f"wrote {out}/report.json and {out}/completions.jsonl")
    return 0
