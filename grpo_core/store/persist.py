"""Writing and reading a run's weights, optimizer and schedule, whole or sharded (what of a
run a checkpoint holds and when it is written: grpo_core.saving).

A run in one process writes checkpoints other tools load as models (grpo_core.store.checkpoint). A
run over several processes writes its model and optimizer from every rank in parallel
(``engine.save_shards``): ``dcp/`` for ddp and fsdp (``torch.distributed.checkpoint``),
``deepspeed/`` for a DeepSpeed engine, plus the same ``state.json`` and ``trainer.pt``; nothing
is gathered on one rank. A whole or ``dcp/`` checkpoint resumes on any number of processes
under ddp or fsdp (DCP reshards on load; a whole checkpoint's weights and optimizer, stored by
parameter name, are sharded as they load); a ``deepspeed/`` one under DeepSpeed with the same
stage and number of processes.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from grpo_core.engine import dist
from grpo_core.engine.update import TorchUpdate
from grpo_core.errors import UserError
from grpo_core.store import checkpoint

KINDS = ("dcp", "deepspeed")  # the folders of checkpoints every rank wrote (engine.shards)


def optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's state keyed by parameter name, whole: loads into any sharding."""
    return get_optimizer_state_dict(
        model, optimizer, options=StateDictOptions(full_state_dict=True)
    )


def save_sharded(
    engine: TorchUpdate,
    root: str,
    step: int,
    run_id: str,
    main: bool,
    tokenizer: Any,
    scheduler: Any,
    meta: dict,
    keep_last: int,
    targets: dict,
) -> None:
    """Checkpoint ``step`` written by every rank (``engine.shards``), finished by rank 0."""
    assert engine.shards is not None  # called for an engine that writes shards
    final = os.path.join(root, f"{checkpoint.PREFIX}{step:08d}")
    tmp = os.path.join(root, f".tmp-{checkpoint.PREFIX}{step:08d}-{run_id}")
    if main:
        os.makedirs(root, exist_ok=True)
        checkpoint.clear_leftovers(root)
        os.makedirs(tmp)
    dist.barrier()
    try:
        engine.save_shards(os.path.join(tmp, engine.shards))
    except Exception as exc:  # a rank's disk failed: every rank hears of it
        if main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise UserError(
            f"cannot write checkpoint {final}: {str(exc).splitlines()[0][:300]}; "
            f"earlier checkpoints are intact"
        ) from exc
    dist.barrier()
    if main:
        checkpoint.finish_save(
            root, tmp, final, step, run_id, tokenizer, scheduler, meta, keep_last, targets=targets
        )


def find(root: str, target: str | bool, run_id: str, warn: Callable[[str], None]) -> str:
    """The checkpoint to resume from: the newest intact one of run ``run_id`` under ``root``
    (``target`` True), or the directory ``target``, refused when missing or damaged."""
    if target is True:
        path = checkpoint.latest_intact(root, run_id, warn)
        if path is None:
            raise UserError(f"--resume: no intact checkpoint under {root}")
        return path
    path = str(target)
    if not os.path.isdir(path):
        raise UserError(f"--resume: {path} is not a checkpoint directory")
    problem = checkpoint.damage(path)
    if problem:
        raise UserError(f"--resume: checkpoint {path} is damaged ({problem})")
    return path


def load(
    path: str,
    engine: TorchUpdate,
    policy: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
) -> None:
    """Weights, optimizer and schedule, in whatever layout the checkpoint and run have."""
    written = next((k for k in KINDS if os.path.isdir(os.path.join(path, k))), None)
    if "deepspeed" in (written, engine.shards) and written != engine.shards:
        raise UserError(
            f"cannot resume from {path}: "
            + (
                "it was written by a DeepSpeed run and resumes only under deepspeed"
                if written == "deepspeed"
                else "a DeepSpeed run resumes only from checkpoints DeepSpeed wrote"
            )
        )
    if written:
        try:
            engine.load_shards(os.path.join(path, written))
        except UserError:
            raise
        except Exception as exc:  # another model, or shards missing
            raise UserError(f"cannot resume from {path}: {str(exc).splitlines()[0][:300]}") from exc
        scheduler.load_state_dict(checkpoint.trainer_state(path)["scheduler"])
    elif engine.sharded:
        _load_whole_into_shards(path, policy, optimizer, scheduler)
    else:
        checkpoint.load(path, policy, optimizer, scheduler)


def _load_whole_into_shards(
    path: str, policy: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any
) -> None:
    """A one-process checkpoint into a sharded model: every rank reads it whole and keeps its
    shards (optimizer state stored by parameter name)."""
    checkpoint.check_fits(path, policy)
    weights = checkpoint.read_weights(path)
    whole = StateDictOptions(full_state_dict=True)
    set_model_state_dict(
        policy, weights, options=StateDictOptions(full_state_dict=True, strict=False)
    )
    trainer = checkpoint.trainer_state(path)
    if not all(isinstance(k, str) for k in trainer["optimizer"].get("state", {})):
        raise UserError(
            f"cannot resume from {path} on several processes: it was written "
            f"before optimizer state was stored by parameter name"
        )
    set_optimizer_state_dict(policy, optimizer, trainer["optimizer"], options=whole)
    scheduler.load_state_dict(trainer["scheduler"])


def schedule_notice(
    scheduler: Any,
    optimizer: torch.optim.Optimizer,
    schedule: str,
    steps_then: int | None,
    steps_now: int,
    step: int,
) -> str | None:
    """The notice a changed ``train.steps`` gives on resume when it re-spreads the schedule
    over the new length (the learning rate then moves from where the checkpoint left it)."""
    if steps_then in (None, steps_now) or schedule in (
        "constant",
        "constant_with_warmup",
        "inverse_sqrt",
    ):
        return None
    was = optimizer.param_groups[0]["lr"]
    now = scheduler.base_lrs[0] * scheduler.lr_lambdas[0](scheduler.last_epoch)
    return (
        f"notice: train.steps changed from {steps_then} to {steps_now} on resume: the "
        f"{schedule} schedule now spans {steps_now} steps, so the learning rate goes from "
        f"{was:.3g} (where the checkpoint left it) to {now:.3g} at step {step}"
    )
