"""A training run's state, built once before the loop (:func:`start`) and summed up after
it (:func:`finish`): models, plugins, data, optimizer, and what the loop carries between
steps."""

from __future__ import annotations

import copy
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch

import grpo_core
from grpo_core import checkpoint, dist, rundir
from grpo_core.data import RESERVED_COLUMNS, PromptStream, check_fields, fit_prompts, read_rows
from grpo_core.episodes import EpisodeRunner, completion_budget, problems
from grpo_core.errors import UserError
from grpo_core.health import HealthMonitor
from grpo_core.hookspecs import Baseline, Generator, KLController, Objective, Reward
from grpo_core.isolation import build_reward
from grpo_core.metrics import MetricsWriter, memory_limit_mb, peak_memory_mb, truncate_metrics
from grpo_core.models import (
    context_length,
    is_peft,
    load_model,
    load_tokenizer,
    pick_device,
    save_model,
    saved_dtype,
)
from grpo_core.rollout import SamplingParams
from grpo_core.update import DeepSpeedUpdate, TorchUpdate, deepspeed_config


@dataclass
class Run:
    """Everything the phases of a step read, and the little they carry from step to step."""

    cfg: dict
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
    rows: list[dict]
    stream: PromptStream
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
    started: float = field(default_factory=time.time)
    memory_limit: float | None = None  # MiB the device has (metrics.memory_limit_mb)
    episodes: EpisodeRunner | None = None  # multi-turn sampling when an environment is set

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def prompts(self) -> int:
        """Prompts this rank handles per step."""
        return self.cfg["train"]["prompts_per_step"] // self.world

    @property
    def dir(self) -> str:
        return self.cfg["output"]["dir"]


def lr_lambda(schedule: str, warmup: int, total: int):
    """Multiplier of the base learning rate at update ``i``: linear warm-up, then constant or
    a half cosine down to 0 at ``total``."""
    def f(i: int) -> float:
        if i < warmup:
            return (i + 1) / warmup
        if schedule == "cosine":
            return 0.5 * (1 + math.cos(math.pi * min(1.0, (i - warmup) / max(1, total - warmup))))
        return 1.0

    return f


def _plugin(kind: str, section: dict) -> Any:
    return grpo_core.create(kind, section["name"], section["options"])


def _rows(path: str, split: str, data_cfg: dict) -> list[dict]:
    rows = read_rows(path, split)
    check_fields(rows, [data_cfg["prompt_field"], *data_cfg["columns"]], path)
    return rows


def start(cfg: dict, resume: str | bool | None = None, force: bool = False,
          overwrite: bool = False) -> Run:
    """Set up a run: devices and processes, the run directory (claimed: see rundir), models,
    plugins, data, the optimizer, and a checkpoint's state when resuming (True: the newest
    intact one; or a directory). ``overwrite`` empties an earlier run's directory first."""
    tc, rt, oc = cfg["train"], cfg["runtime"], cfg["output"]
    if rt["threads"]:
        torch.set_num_threads(rt["threads"])
    device = pick_device(rt["device"])
    if device.type == "cuda" and dist.active():
        device = torch.device("cuda", dist.local_rank())
    rank, world = dist.init(device)
    torch.manual_seed(tc["seed"])
    if tc["prompts_per_step"] % world:
        raise UserError(f"train.prompts_per_step: {tc['prompts_per_step']} is not divisible by "
                        f"the {world} processes")
    reserved = set(cfg["data"]["columns"]) & set(RESERVED_COLUMNS)
    if reserved:
        raise UserError(f"data.columns: {sorted(reserved)} are reserved names the trainer "
                        f"passes to rewards; rename the dataset field")
    if problems(cfg):
        raise UserError(problems(cfg)[0])
    run_id = rundir.claim(oc["dir"], bool(resume), overwrite) if rank == 0 else ""
    dist.barrier()
    run_id = run_id or rundir.run_id(oc["dir"])
    if rank == 0:
        with open(os.path.join(oc["dir"], "config.json"), "w", encoding="utf-8") as f:
            json.dump(cfg, f, indent=2)

    tokenizer = load_tokenizer(cfg["model"])
    policy = load_model(cfg["model"], device)
    kl = _plugin("kl", cfg["kl"])
    generator = _plugin("generator", cfg["generator"])
    generator.setup(policy, tokenizer, device)
    reference = None
    if kl.needs_reference():  # no reference model at all when the coefficient stays 0
        if is_peft(policy):  # LoRA: the base model with the adapter disabled, no second copy
            reference = policy
        else:
            where = "cpu" if cfg["model"]["reference_device"] == "cpu" else device
            reference = copy.deepcopy(policy).to(where).eval().requires_grad_(False)
    rows = _rows(cfg["data"]["path"], cfg["data"]["split"], cfg["data"])
    budget_key, budget = completion_budget(cfg)
    limit = cfg["data"]["max_prompt_tokens"] or (context_length(policy) or 10**9) - budget
    if limit < 1:
        raise UserError(f"{budget_key}: {budget} leaves no room for a prompt in the model's "
                        f"context")
    rows, long = fit_prompts(rows, tokenizer, cfg["data"], limit)
    if long and rank == 0:
        print(f"warning: {long} of {len(rows) + long} prompts are longer than {limit} tokens; "
              f"data.long_prompts: {cfg['data']['long_prompts']}", file=sys.stderr)
    ec = cfg["eval"]
    eval_rows = None
    if ec["data"] and ec["every_n_steps"]:
        eval_rows = _rows(ec["data"], ec["split"], cfg["data"])[:ec["max_problems"] or None]

    params = [p for p in policy.parameters() if p.requires_grad]
    oc_ = cfg["optimizer"]
    opt = torch.optim.AdamW(params, lr=oc_["lr"], betas=tuple(oc_["betas"]),
                            weight_decay=oc_["weight_decay"])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(
        oc_["lr_schedule"], oc_["warmup_steps"], tc["steps"] * tc["inner_iterations"]))
    run = Run(cfg, run_id, saved_dtype(cfg["model"], oc["save_dtype"]), rank, world, device,
              tokenizer, policy, reference,
              build_reward(cfg["reward"]), _plugin("baseline", cfg["baseline"]), kl,
              generator, _plugin("objective", cfg["objective"]), rows,
              PromptStream(len(rows), tc["seed"], cfg["data"]["shuffle"]), eval_rows, opt, sched,
              _engine(cfg, policy, params, opt, sched, world),
              SamplingParams(cfg["sampling"]["max_new_tokens"], cfg["sampling"]["temperature"],
                             cfg["sampling"]["top_p"], cfg["sampling"]["top_k"],
                             batch_size=cfg["sampling"]["generation_batch_size"]),
              torch.autocast("cuda", dtype=torch.bfloat16,
                             enabled=device.type == "cuda" and cfg["model"]["dtype"] == "auto"),
              None, HealthMonitor(window=cfg["health"]["window"])
              if cfg["health"]["enabled"] else None)
    run.memory_limit = memory_limit_mb(device)
    if cfg["environment"]:
        run.episodes = EpisodeRunner(_plugin("environment", cfg["environment"]), generator,
                                     tokenizer, cfg)
    if resume:
        _resume(run, resume, force)
    if run.main:
        if resume:  # drop the metric lines of steps that will be run again
            truncate_metrics(oc["dir"], run.start_step)
        run.metrics = MetricsWriter(oc["dir"], tc["steps"], oc["progress"], oc["tensorboard"],
                                    oc["wandb_project"], cfg)
    return run


def _engine(cfg: dict, policy, params, opt, sched, world: int) -> TorchUpdate:
    """Plain torch (data parallel through torch.distributed), or a DeepSpeed engine."""
    ds_cfg = deepspeed_config(cfg["deepspeed"])
    tc = cfg["train"]
    if ds_cfg is None:
        return TorchUpdate(params, opt, sched, cfg["optimizer"]["max_grad_norm"])
    if cfg["output"]["checkpoint_every"]:
        raise UserError("output.checkpoint_every: checkpoints are not yet supported with "
                        "deepspeed; set it to 0")
    per = tc["prompts_per_step"] // world
    return DeepSpeedUpdate(policy, params, opt, sched, ds_cfg, -(-per // tc["micro_batch_groups"]),
                           tc["micro_batch_groups"] * cfg["sampling"]["group_size"],
                           cfg["optimizer"]["max_grad_norm"])


def _resume(run: Run, resume: str | bool, force: bool) -> None:
    """Load a checkpoint: the newest intact one of this run, or the directory given."""
    root = os.path.join(run.dir, "checkpoints")
    if resume is True:
        path = checkpoint.latest_intact(root, run.run_id, lambda m: _warn(run, m))
        if path is None:
            raise UserError(f"--resume: no intact checkpoint under {root}")
    else:
        path = str(resume)
        if not os.path.isdir(path):
            raise UserError(f"--resume: {path} is not a checkpoint directory")
        problem = checkpoint.damage(path)
        if problem:
            raise UserError(f"--resume: checkpoint {path} is damaged ({problem})")
    state = checkpoint.read_state(path)
    diffs = checkpoint.config_differences(state, run.cfg)
    if diffs and not force:
        raise UserError("cannot resume: the config differs from the checkpoint's in "
                        + "; ".join(diffs) + " (use --force to resume anyway)")
    state = checkpoint.load(path, run.policy, run.optimizer, run.scheduler)
    if force and (state.get("config") or {}).get("optimizer", {}).get("lr") not in (
            None, run.cfg["optimizer"]["lr"]):  # forced with a new learning rate: apply it
        sched = run.scheduler
        sched.base_lrs = [run.cfg["optimizer"]["lr"]] * len(sched.base_lrs)
        for group, f in zip(run.optimizer.param_groups, sched.lr_lambdas):
            group["lr"] = run.cfg["optimizer"]["lr"] * f(sched.last_epoch)
        sched._last_lr = [g["lr"] for g in run.optimizer.param_groups]
    run.kl.load_state_dict(state["kl"])
    if state.get("baseline"):
        run.baseline.load_state_dict(state["baseline"])
    run.stream.position, run.start_step = state["data_position"], state["step"]


def _warn(run: Run, message: str) -> None:
    if run.main:
        print(f"warning: {message}", file=sys.stderr)


def save_checkpoint(run: Run, step: int) -> None:
    """Every ``output.checkpoint_every`` steps: weights, optimizer, plugin state, RNGs."""
    every = run.cfg["output"]["checkpoint_every"]
    if not every or (step + 1) % every:
        return
    if run.main:
        checkpoint.save(os.path.join(run.dir, "checkpoints"), step + 1, run.run_id, run.policy,
                        run.tokenizer, run.optimizer, run.scheduler, {
                            "config": run.cfg, "config_hash": checkpoint.config_hash(run.cfg),
                            "kl": run.kl.state_dict(), "baseline": run.baseline.state_dict(),
                            "data_position": run.stream.position},
                        run.cfg["output"]["keep_last"], run.save_dtype)
    dist.barrier()


def finish(run: Run) -> dict:
    """Check the ranks agree, write the final model and the summary; returns the summary."""
    in_sync = dist.weights_in_sync([p.to(run.device) for p in run.policy.parameters()])
    if not in_sync and run.main:
        print("\nwarning: ranks ended with different weights", file=sys.stderr)
    first, last = run.first or {}, run.last or {}
    summary = {"run_dir": run.dir, "steps": run.steps_run,
               "seconds": time.time() - run.started, "world_size": run.world,
               "ranks_in_sync": in_sync, "first_reward": first.get("reward"),
               "final_reward": last.get("reward"), "reference_model": run.reference is not None,
               "peak_memory_mb": peak_memory_mb(run.device),
               "health": run.health.summary() if run.health else []}
    if run.main and run.cfg["output"]["save_model"]:
        final = os.path.join(run.dir, "final")
        save_model(run.policy, run.tokenizer, final, run.save_dtype)  # LoRA: the adapter
        if is_peft(run.policy) and run.cfg["model"]["lora"]["save_merged"]:
            save_model(run.policy.merge_and_unload(), run.tokenizer,
                       os.path.join(final, "merged"), run.save_dtype)
    run.reward.close()
    if run.episodes is not None:
        run.episodes.close()
    if run.main:
        with open(os.path.join(run.dir, "summary.json"), "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2)
        rundir.release(run.dir)
    dist.barrier()
    return summary
