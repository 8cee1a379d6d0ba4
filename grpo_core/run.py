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
from grpo_core import checkpoint, dist
from grpo_core.data import RESERVED_COLUMNS, PromptStream, check_fields, read_rows
from grpo_core.errors import UserError
from grpo_core.health import HealthMonitor
from grpo_core.hookspecs import Baseline, Generator, KLController, Objective, Reward
from grpo_core.metrics import MetricsWriter, peak_memory_mb, truncate_metrics
from grpo_core.models import is_peft, load_model, load_tokenizer, pick_device
from grpo_core.rollout import SamplingParams
from grpo_core.update import DeepSpeedUpdate, TorchUpdate, deepspeed_config


@dataclass
class Run:
    """Everything the phases of a step read, and the little they carry from step to step."""

    cfg: dict
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


def start(cfg: dict, resume: str | bool | None = None, force: bool = False) -> Run:
    """Set up a run: devices and processes, the run directory, models, plugins, data, the
    optimizer, and a checkpoint's state when resuming (True: the newest; or a directory)."""
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
    if rank == 0:
        os.makedirs(oc["dir"], exist_ok=True)
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
    run = Run(cfg, rank, world, device, tokenizer, policy, reference,
              _plugin("reward", cfg["reward"]), _plugin("baseline", cfg["baseline"]), kl,
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
    if resume:
        _resume(run, resume, force)
    if run.main:  # a fresh run starts its metrics over; a resumed one drops steps it will redo
        truncate_metrics(oc["dir"], run.start_step)
        if not resume:
            for name in ("samples.jsonl", "samples.txt"):
                if os.path.exists(os.path.join(oc["dir"], name)):
                    os.remove(os.path.join(oc["dir"], name))
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
    root = os.path.join(run.dir, "checkpoints")
    path = checkpoint.latest(root) if resume is True else resume
    if path is None:
        raise UserError(f"--resume: no complete checkpoint under {root}")
    meta = checkpoint.load(path, run.policy, run.optimizer, run.scheduler)
    checkpoint.check_compatible(meta["fingerprint"], run.cfg, force)
    run.kl.load_state_dict(meta["kl"])
    if meta.get("baseline"):
        run.baseline.load_state_dict(meta["baseline"])
    run.stream.position, run.start_step = meta["data_position"], meta["step"]


def save_checkpoint(run: Run, step: int) -> None:
    """Every ``output.checkpoint_every`` steps: weights, optimizer, plugin state, RNGs."""
    every = run.cfg["output"]["checkpoint_every"]
    if not every or (step + 1) % every:
        return
    if run.main:
        checkpoint.save(os.path.join(run.dir, "checkpoints"), step + 1, run.policy,
                        run.optimizer, run.scheduler, {
                            "fingerprint": checkpoint.config_fingerprint(run.cfg),
                            "config_hash": checkpoint.config_hash(run.cfg),
                            "kl": run.kl.state_dict(), "baseline": run.baseline.state_dict(),
                            "data_position": run.stream.position}, run.cfg["output"]["keep_last"])
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
        run.policy.save_pretrained(final)  # a LoRA run writes the adapter
        run.tokenizer.save_pretrained(final)
        if is_peft(run.policy) and run.cfg["model"]["lora"]["save_merged"]:
            merged = os.path.join(final, "merged")
            run.policy.merge_and_unload().save_pretrained(merged)
            run.tokenizer.save_pretrained(merged)
        with open(os.path.join(run.dir, "summary.json"), "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2)
    dist.barrier()
    return summary
