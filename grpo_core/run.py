"""A training run's state, built once before the loop (:func:`start`) and summed up after
it (:func:`finish`): models, plugins, data, optimizer, and what the loop carries between
steps."""

from __future__ import annotations

import copy
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from grpo_core.building import create
from grpo_core.config.file import unresolved
from grpo_core.config.redact import redact
from grpo_core.config.view import Config, view
from grpo_core.data.prompts import (
    PromptStream,
    StreamedPrompts,
    check_fields,
    column_map,
    column_problems,
    fit_prompt,
    fit_prompts,
)
from grpo_core.data.sources import Source, open_stream, read_rows
from grpo_core.engine import dist, parallel, schedules
from grpo_core.engine.update import TorchUpdate, build_optimizer
from grpo_core.engine.zero import DeepSpeedUpdate, deepspeed_config
from grpo_core.env.episodes import EpisodeRunner, completion_budget
from grpo_core.env.episodes import problems as episode_problems
from grpo_core.errors import UserError
from grpo_core.hookspecs import Baseline, Generator, KLController, Objective, Reward
from grpo_core.loss import groups
from grpo_core.observe import tracking
from grpo_core.observe.callbacks import Callbacks
from grpo_core.observe.health import HealthMonitor
from grpo_core.observe.metrics import (
    MetricsWriter,
    memory_limit_mb,
    peak_memory_mb,
    strict_json,
    truncate_step_files,
)
from grpo_core.observe.pitfalls import run_settings
from grpo_core.overlap import RemoteGenerator, enabled
from grpo_core.overlap import problems as overlap_problems
from grpo_core.reward.isolation import build_reward
from grpo_core.rollout import SamplingParams
from grpo_core.store import hub, persist, rundir
from grpo_core.store.models import (
    context_length,
    is_peft,
    load_model,
    load_tokenizer,
    pick_device,
    resolve_sampling,
    save_model,
    saved_dtype,
)


@dataclass
class Run:
    """Everything the phases of a step read, and the little they carry from step to step."""

    cfg: dict  # the validated config document: sections handed on whole, plugins' options
    config: Config  # the same, typed: what the spine reads
    run_id: str  # this run's id (rundir marker); checkpoints carry it
    save_dtype: torch.dtype  # what checkpoints and the final model are written in
    rank: int
    world: int
    device: torch.device
    tokenizer: Any
    policy: Any
    reference: Any  # None when the KL coefficient can never be non-zero
    reward: Reward
    baseline: Baseline
    kl: KLController
    generator: Generator
    objective: Objective
    stream: PromptStream | StreamedPrompts  # the prompts, in order (data.streaming: read as needed)
    eval_rows: list[dict] | None
    optimizer: torch.optim.Optimizer
    scheduler: Any
    engine: TorchUpdate
    sampling: SamplingParams
    autocast: Any
    metrics: MetricsWriter | None
    health: HealthMonitor | None
    start_step: int = 0
    first: dict | None = None  # the first step's metrics record (of this process)
    last: dict | None = None  # the latest one
    steps_run: int = 0  # steps this process ran (a resumed run starts at start_step)
    best: float | None = None  # best eval metric so far (eval.keep_best)
    nonfinite_run: int = 0  # steps in a row whose update was skipped
    tokens_seen: int = 0  # prompt and completion tokens of every step so far (resumed too)
    callbacks: Callbacks | None = None  # the config's callback plugins (built on rank 0)
    started: float = field(default_factory=time.time)
    memory_limit: float | None = None  # MiB the device has (metrics.memory_limit_mb)
    episodes: EpisodeRunner | None = None  # multi-turn sampling when an environment is set
    remote: RemoteGenerator | None = None  # generation in its own process (grpo_core.overlap)

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def prompts(self) -> int:
        """Prompts this rank handles per step."""
        return self.config.train.prompts_per_step // self.world

    @property
    def dir(self) -> str:
        return self.config.output.dir


def _plugin(kind: str, section: dict) -> Any:
    return create(kind, section["name"], section["options"])


def _rows(path: str, split: str, data_cfg: dict, key: str = "data.path") -> list[dict]:
    """A data set's rows, checked; the training set's source (same path) keeps its
    configuration name and data_files."""
    same = path == data_cfg["path"]
    rows = read_rows(
        path,
        split,
        data_cfg["name"] if same else None,
        data_cfg["data_files"] if same else None,
        key=key,
    )
    check_fields(rows, [data_cfg["prompt_field"], *column_map(data_cfg)], path)
    return rows


def _stream(cfg: dict, tokenizer, limit: int, main: bool) -> PromptStream | StreamedPrompts:
    """The prompts in training order: held in memory and fitted to the prompt limit now, or
    (data.streaming) read, checked and fitted as they are needed."""
    dc, seed = cfg["data"], cfg["train"]["seed"]
    if dc["streaming"]:
        ds = open_stream(
            Source(dc["path"], dc["split"], dc["name"], dc["data_files"]),
            seed if dc["shuffle"] else None,
            dc["shuffle_buffer"],
        )

        def epoch(e: int):
            ds.set_epoch(e)  # a seeded shuffle orders each epoch differently
            return ds

        return StreamedPrompts(
            epoch,
            lambda row, i: fit_prompt(row, i, tokenizer, dc, limit),
            [dc["prompt_field"], *column_map(dc)],
            dc["path"],
        )
    rows, long = fit_prompts(_rows(dc["path"], dc["split"], dc), tokenizer, dc, limit)
    if long and main:
        print(
            f"warning: {long} of {len(rows) + long} prompts are longer than {limit} tokens; "
            f"data.long_prompts: {dc['long_prompts']}",
            file=sys.stderr,
        )
    return PromptStream(rows, seed, dc["shuffle"], long)


def start(
    cfg: dict, resume: str | bool | None = None, force: bool = False, overwrite: bool = False
) -> Run:
    """Set up a run: devices and processes, the run directory (claimed: see rundir), models,
    plugins, data, the optimizer, and a checkpoint's state when resuming (True: the newest
    intact one; or a directory). ``overwrite`` empties an earlier run's directory first."""
    device, rank, world = _processes(cfg)
    run_id = _claim(cfg, rank, resume, overwrite)
    tokenizer = load_tokenizer(cfg["model"])
    policy = load_model(cfg["model"], device)
    # null sampling settings take the model's generation_config values, before anything reads
    # them (the loss's temperature too); config.json keeps them as written
    resolve_sampling(policy, cfg["sampling"], rank == 0)
    config = view(cfg)  # typed, with the sampling settings as resolved
    kl = _plugin("kl", cfg["kl"])
    reference = _reference(kl, policy, config, device)
    how = parallel.strategy(cfg, world)
    if how in ("ddp", "fsdp"):  # the reference is spread the same way
        for model in {id(m): m for m in (policy, reference) if m is not None}.values():
            parallel.shard(model, how, cfg["distributed"], device)
    # the trained parameters, taken now: a forward without gradients (a plugin's set-up) leaves
    # an FSDP2 unit holding gathered copies in their place until it shards again
    params = [p for p in policy.parameters() if p.requires_grad]
    generator = _plugin("generator", cfg["generator"])
    stream = _stream(cfg, tokenizer, _prompt_limit(cfg, policy), rank == 0)
    eval_rows = _eval_rows(cfg)
    optimizer = build_optimizer(params, cfg["optimizer"], how)
    scheduler = schedules.build(optimizer, cfg["optimizer"], schedules.total_updates(cfg["train"]))
    run = Run(
        cfg=cfg,
        config=config,
        run_id=run_id,
        save_dtype=saved_dtype(cfg["model"], config.output.save_dtype),
        rank=rank,
        world=world,
        device=device,
        tokenizer=tokenizer,
        policy=policy,
        reference=reference,
        reward=build_reward(cfg["reward"]),
        baseline=_plugin("baseline", cfg["baseline"]),
        kl=kl,
        generator=generator,
        objective=_plugin("objective", cfg["objective"]),
        stream=stream,
        eval_rows=eval_rows,
        optimizer=optimizer,
        scheduler=scheduler,
        engine=_engine(cfg, policy, reference, params, optimizer, scheduler, world, how),
        sampling=SamplingParams.from_config(cfg["sampling"]),
        autocast=torch.autocast(
            "cuda",
            dtype=torch.bfloat16,
            enabled=device.type == "cuda" and config.model.dtype == "auto",
        ),
        metrics=None,
        health=HealthMonitor(window=config.health.window) if config.health.enabled else None,
        memory_limit=memory_limit_mb(device),
        callbacks=Callbacks(cfg["callbacks"], rank == 0),
    )
    _attach(run, how)
    inflight = persist.resume(run, resume, force) if resume else None
    generator.setup(policy, tokenizer, device)  # last: an engine starts from resumed weights
    _launch(run, inflight)
    if run.main:
        if resume:  # drop what the steps that will be run again wrote
            truncate_step_files(run.dir, run.start_step)
        run.metrics = MetricsWriter(
            run.dir,
            config.train.steps,
            config.output.progress,
            tracking.Trackers.start(cfg, run_id, run.start_step),
        )
        run.callbacks.begin(run.dir, unresolved(cfg), run.start_step)
    return run


def _processes(cfg: dict) -> tuple[torch.device, int, int]:
    """This process's device, rank and the number of processes (each rank its own GPU), and
    the checks that need only those and the config."""
    train, runtime = cfg["train"], cfg["runtime"]
    if runtime["threads"]:
        torch.set_num_threads(runtime["threads"])
    device, rank, world = dist.init(pick_device(runtime["device"]))
    torch.manual_seed(train["seed"])
    if train["prompts_per_step"] % world:
        raise UserError(
            f"train.prompts_per_step: {train['prompts_per_step']} is not divisible "
            f"by the {world} processes"
        )
    if world > 1 and (train["prompts_per_step"] // world) % train["mini_batches"]:
        raise UserError(
            f"train.mini_batches: {train['mini_batches']} does not divide the "
            f"{train['prompts_per_step'] // world} prompts each of the {world} processes holds"
        )
    problems = column_problems(cfg["data"]) + tracking.problems(cfg["output"])
    problems += hub.problems(cfg["output"])
    problems += episode_problems(cfg) + groups.problems(cfg) + overlap_problems(cfg, world)
    if problems:
        raise UserError(problems[0])
    return device, rank, world


def _claim(cfg: dict, rank: int, resume: str | bool | None, overwrite: bool) -> str:
    """Claim the run directory (rank 0, see rundir) and write the config as written there
    (``${env:NAME}``, never the value); returns the run's id on every rank."""
    out = cfg["output"]["dir"]
    run_id = (
        rundir.claim(out, bool(resume), overwrite, rundir.input_paths(cfg) if overwrite else [])
        if rank == 0
        else ""
    )
    dist.barrier()
    run_id = run_id or rundir.run_id(out)
    if rank == 0:
        with open(os.path.join(out, "config.json"), "w", encoding="utf-8") as f:
            json.dump(unresolved(cfg), f, indent=2)
    return run_id


def _reference(kl: KLController, policy: Any, config: Config, device: torch.device) -> Any:
    """The frozen reference: none when the KL coefficient stays 0; with LoRA the base model
    (the policy with its adapter disabled, no second copy); else a copy of the policy."""
    if not kl.needs_reference():
        return None
    if is_peft(policy):
        return policy
    where = "cpu" if config.model.reference_device == "cpu" else device
    return copy.deepcopy(policy).to(where).eval().requires_grad_(False)


def _prompt_limit(cfg: dict, policy: Any) -> int:
    """The longest prompt in tokens: data.max_prompt_tokens, or the model's context minus the
    completion budget; a budget that leaves no room is refused."""
    budget_key, budget = completion_budget(cfg)
    limit = cfg["data"]["max_prompt_tokens"] or (context_length(policy) or 10**9) - budget
    if limit < 1:
        raise UserError(
            f"{budget_key}: {budget} leaves no room for a prompt in the model's context"
        )
    return limit


def _eval_rows(cfg: dict) -> list[dict] | None:
    """The held-out rows validation reads (None when validation is off)."""
    ec = cfg["eval"]
    if not (ec["data"] and ec["every_n_steps"]):
        return None
    return _rows(ec["data"], ec["split"], cfg["data"], "eval.data")[: ec["max_problems"] or None]


def _attach(run: Run, how: str) -> None:
    """What the run's parts need of each other once it exists: the health monitor the run's
    settings (its advice names them), a critic (PPO, built before a checkpoint loads), an
    environment's episode runner."""
    cfg = run.cfg
    if run.health:
        run.health.settings = run_settings(cfg)
    if run.baseline.needs_values:
        problem = critic_problem(cfg, run.world, how, is_peft(run.policy), run.objective)
        if problem:
            raise UserError(problem)
        run.baseline.attach(run.policy)
    if cfg["environment"]:
        run.episodes = EpisodeRunner(
            _plugin("environment", cfg["environment"]), run.generator, run.tokenizer, cfg
        )


def _launch(run: Run, inflight: dict | None) -> None:
    """Start the generator process when generation runs beside training, primed with a
    checkpoint's in-flight rollouts; a checkpoint that holds some needs it."""
    if not enabled(run.cfg):
        if inflight:
            raise UserError(
                f"--resume: the checkpoint holds {len(inflight['steps'])} rollouts of an "
                f"asynchronous run; resume with its sampling.max_staleness"
            )
        return
    if run.baseline.needs_greedy:
        raise UserError(
            f"baseline.name: {run.cfg['baseline']['name']} (greedy completions) is not "
            f"supported with asynchronous generation (sampling.generation: process)"
        )
    run.remote = RemoteGenerator(run.cfg, run.sampling, run.policy, run.start_step, inflight)


def critic_problem(
    cfg: dict, world: int, how: str, lora: bool, objective: Objective | None = None
) -> str | None:
    """Why a baseline with a critic (``needs_values``: PPO) cannot run as configured, in one
    line; None when it can. Its critic is a whole copy of the policy in this process."""
    name = f"baseline.name: {cfg['baseline']['name']}"
    if world > 1 or how != "none" or cfg["deepspeed"]:
        return f"{name} (a critic) runs in one process only, not sharded or data parallel"
    if lora or cfg["model"]["lora"]:
        return f"{name} (a critic) is not supported with model.lora"
    if objective is not None and not objective.token_advantages:
        return (
            f"{name} gives per-token advantages; objective {cfg['objective']['name']!r} "
            f"does not take them"
        )
    return None


def _engine(cfg: dict, policy, reference, params, opt, sched, world: int, how: str) -> TorchUpdate:
    """Plain torch (one process, or FSDP2 for ddp/fsdp), or a DeepSpeed engine."""
    tc = cfg["train"]
    if how != "deepspeed":
        return TorchUpdate(
            policy,
            params,
            opt,
            sched,
            cfg["optimizer"]["max_grad_norm"],
            how == "fsdp" and cfg["distributed"]["reshard_after_forward"],
        )
    per = tc["prompts_per_step"] // world // tc["mini_batches"]  # groups per update, here
    return DeepSpeedUpdate(
        policy,
        params,
        opt,
        sched,
        deepspeed_config(cfg["deepspeed"]),
        -(-per // tc["micro_batch_groups"]),
        tc["micro_batch_groups"] * cfg["sampling"]["group_size"],
        cfg["optimizer"]["max_grad_norm"],
        None if cfg["model"]["reference_device"] == "cpu" else reference,
    )


def _held(run: Run) -> list[float]:
    """What this rank holds: parameter and optimizer-state elements, and its peak memory."""
    params, state = run.engine.held()
    return [float(params), float(state), peak_memory_mb(run.device)]


def finish(run: Run) -> dict:
    """Check the ranks agree, write the final model and the summary; returns the summary."""
    in_sync = dist.weights_in_sync(run.engine.parameter_sums())
    if not in_sync and run.main:
        print("\nwarning: ranks ended with different weights", file=sys.stderr)
    first, last = run.first or {}, run.last or {}
    summary = {
        "run_dir": run.dir,
        "steps": run.steps_run,
        "seconds": time.time() - run.started,
        "world_size": run.world,
        "ranks_in_sync": in_sync,
        "first_reward": first.get("reward"),
        "final_reward": last.get("reward"),
        "reference_model": run.reference is not None,
        "peak_memory_mb": peak_memory_mb(run.device),
        "per_rank": [
            dict(zip(("parameters", "optimizer_state", "peak_memory_mb"), r))
            for r in dist.gather_numbers(_held(run))
        ],
        "long_prompts": run.stream.long_prompts,
        "health": run.health.summary() if run.health else [],
    }
    # every rank takes part in gathering a sharded model; rank 0 holds it
    whole = run.engine.full_state_dict() if run.cfg["output"]["save_model"] else None
    if run.main and run.cfg["output"]["save_model"]:
        final = os.path.join(run.dir, "final")
        save_model(run.policy, run.tokenizer, final, run.save_dtype, whole)  # LoRA: adapter
        if is_peft(run.policy) and run.cfg["model"]["lora"]["save_merged"]:
            save_model(
                run.policy.merge_and_unload(),
                run.tokenizer,
                os.path.join(final, "merged"),
                run.save_dtype,
            )
    run.reward.close()
    if run.episodes is not None:
        run.episodes.close()
    if run.remote is not None:
        run.remote.close()
    if run.main:
        run.metrics.close()
        _write_summary(run.dir, summary)
        rundir.release(run.dir)
    dist.barrier()
    oc = run.config.output
    if run.main and oc.push_to_hub:  # last: a failed upload leaves the run complete
        summary["hub_commit"] = hub.push(
            os.path.join(run.dir, "final"),
            oc.hub_model_id,
            oc.hub_private,
            f"grpo-core run {run.run_id}: {run.steps_run} steps",
        )
        _write_summary(run.dir, summary)
    return summary


def _write_summary(run_dir: str, summary: dict) -> None:
    with open(os.path.join(run_dir, "summary.json"), "w", encoding="utf-8") as f:
        f.write(redact(strict_json(summary, indent=2)))  # null where a value is NaN
