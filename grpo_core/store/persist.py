"""Saving a run's state and resuming it, whole or sharded.

A run in one process writes checkpoints other tools load as models (grpo_core.store.checkpoint). A
run over several processes writes its model and optimizer from every rank in parallel
(``run.engine.save_shards``): ``dcp/`` for ddp and fsdp (``torch.distributed.checkpoint``),
``deepspeed/`` for a DeepSpeed engine, plus the same ``state.json`` and ``trainer.pt``; nothing
is gathered on one rank. A whole or ``dcp/`` checkpoint resumes on any number of processes
under ddp or fsdp (DCP reshards on load; a whole checkpoint's weights and optimizer, stored by
parameter name, are sharded as they load); a ``deepspeed/`` one under DeepSpeed with the same
stage and number of processes.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys

from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from grpo_core.config.file import unresolved
from grpo_core.engine import dist, schedules
from grpo_core.errors import UserError
from grpo_core.interrupt import Stopped
from grpo_core.rollout import NEUTRAL
from grpo_core.store import checkpoint

KINDS = ("dcp", "deepspeed")  # the folders of checkpoints every rank wrote (engine.shards)


def optimizer_state(model, optimizer) -> dict:
    """The optimizer's state keyed by parameter name, whole: loads into any sharding."""
    return get_optimizer_state_dict(
        model, optimizer, options=StateDictOptions(full_state_dict=True)
    )


def save(run, step: int, now: bool = False) -> str | None:
    """Every ``output.checkpoint_every`` steps, or ``now``: weights, optimizer, plugin state,
    RNGs. Returns the checkpoint's directory when one was written."""
    every = run.cfg["output"]["checkpoint_every"]
    if not now and (not every or (step + 1) % every):
        return None
    root = os.path.join(run.dir, "checkpoints")
    written = unresolved(run.cfg)  # a checkpoint holds ${env:NAME}, never the value
    meta = {
        "config": written,
        "config_hash": checkpoint.config_hash(written),
        "kl": run.kl.state_dict(),
        "data_position": run.stream.position,
        "data": run.stream.state_dict(),
        "tokens_seen": run.tokens_seen,
    }
    baseline = run.baseline.state_dict()  # baseline.pt: a critic's tensors too
    # rollouts asked of the generator process for later steps: kept, so none is lost or
    # sampled twice (the data position is already past their prompts)
    inflight = run.remote.inflight(step) if run.remote is not None else None
    if run.engine.shards:
        _save_sharded(run, root, step + 1, meta, baseline)
    elif run.main:
        checkpoint.save(
            root,
            step + 1,
            run.run_id,
            run.policy,
            run.tokenizer,
            optimizer_state(run.policy, run.optimizer),
            run.scheduler,
            meta,
            run.cfg["output"]["keep_last"],
            run.save_dtype,
            baseline,
            inflight,
        )
    dist.barrier()
    return os.path.join(root, f"{checkpoint.PREFIX}{step + 1:08d}")


def stop_signal(run, signum: int) -> int:
    """The signal every rank stops on at this step boundary (0: none): a signal any rank
    received stops them all, at the same step."""
    if not dist.active():
        return signum
    got = dist.sum_named({"signal": signum}, run.device)["signal"]
    return signum or (int(signal.SIGTERM) if got else 0)


def stopped(run, step: int, path: str, signum: int) -> Stopped:
    """The error a run stopped by ``signum`` after ``step`` ends with, once its reward
    workers and trackers are closed."""
    run.reward.close()
    if run.episodes is not None:
        run.episodes.close()
    if run.remote is not None:
        run.remote.close()
    if run.main:
        run.metrics.close()
    return Stopped(
        f"stopped by {signal.Signals(signum).name} after step {step + 1} of "
        f"{run.cfg['train']['steps']}; checkpoint saved in {path}; continue with "
        f"--resume",
        signum,
    )


def _save_sharded(run, root: str, step: int, meta: dict, baseline: dict) -> None:
    final = os.path.join(root, f"{checkpoint.PREFIX}{step:08d}")
    tmp = os.path.join(root, f".tmp-{checkpoint.PREFIX}{step:08d}-{run.run_id}")
    if run.main:
        os.makedirs(root, exist_ok=True)
        checkpoint.clear_leftovers(root)
        os.makedirs(tmp)
    dist.barrier()
    try:
        run.engine.save_shards(os.path.join(tmp, run.engine.shards))
    except Exception as exc:  # a rank's disk failed: every rank hears of it
        if run.main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise UserError(
            f"cannot write checkpoint {final}: {str(exc).splitlines()[0][:300]}; "
            f"earlier checkpoints are intact"
        ) from exc
    dist.barrier()
    if run.main:
        checkpoint.finish_save(
            root,
            tmp,
            final,
            step,
            run.run_id,
            run.tokenizer,
            run.scheduler,
            meta,
            run.cfg["output"]["keep_last"],
            baseline=baseline,
        )


def resume(run, target: str | bool, force: bool) -> dict | None:
    """Load a checkpoint: the newest intact one of this run, or the directory given.
    Returns the in-flight rollouts of an asynchronous run it holds (None: none)."""
    root = os.path.join(run.dir, "checkpoints")
    if target is True:
        path = checkpoint.latest_intact(root, run.run_id, lambda m: _warn(run, m))
        if path is None:
            raise UserError(f"--resume: no intact checkpoint under {root}")
    else:
        path = str(target)
        if not os.path.isdir(path):
            raise UserError(f"--resume: {path} is not a checkpoint directory")
        problem = checkpoint.damage(path)
        if problem:
            raise UserError(f"--resume: checkpoint {path} is damaged ({problem})")
    state = checkpoint.read_state(path)
    for key, value in NEUTRAL.items():  # written before the setting existed: sampled without it
        (state.get("config") or {}).get("sampling", {}).setdefault(key, value)
    diffs = checkpoint.config_differences(state, unresolved(run.cfg))
    if diffs and not force:
        raise UserError(
            "cannot resume: the config differs from the checkpoint's in "
            + "; ".join(diffs)
            + " (use --force to resume anyway)"
        )
    _load(path, run)
    checkpoint.restore_rng(path, state)
    if force and (state.get("config") or {}).get("optimizer", {}).get("lr") not in (
        None,
        run.cfg["optimizer"]["lr"],
    ):  # forced with a new learning rate: apply it
        schedules.set_peak_lr(run.scheduler, run.optimizer, run.cfg["optimizer"]["lr"])
    run.kl.load_state_dict(state["kl"])
    baseline = checkpoint.baseline_state(path, state)
    if baseline:
        run.baseline.load_state_dict(baseline)
    run.stream.load_state_dict(state.get("data") or {"position": state["data_position"]})
    run.start_step = state["step"]
    run.tokens_seen = state.get("tokens_seen", 0)  # 0: written before it was kept
    if run.main:
        print(
            f"resumed from {path}: {run.start_step} steps done; the next is step "
            f"{run.start_step} in metrics.jsonl (which counts from 0)",
            file=sys.stderr,
        )
        _schedule_notice(run, (state.get("config") or {}).get("train", {}).get("steps"))
    return checkpoint.inflight(path)


def _schedule_notice(run, steps_then: int | None) -> None:
    """Say so when a changed ``train.steps`` re-spreads a schedule over the new length: the
    learning rate then moves from where the checkpoint left it."""
    steps_now, schedule = run.cfg["train"]["steps"], run.cfg["optimizer"]["lr_schedule"]
    if steps_then in (None, steps_now) or schedule in (
        "constant",
        "constant_with_warmup",
        "inverse_sqrt",
    ):
        return
    sched = run.scheduler
    was = run.optimizer.param_groups[0]["lr"]
    now = sched.base_lrs[0] * sched.lr_lambdas[0](sched.last_epoch)
    print(
        f"notice: train.steps changed from {steps_then} to {steps_now} on resume: the "
        f"{schedule} schedule now spans {steps_now} steps, so the learning rate goes from "
        f"{was:.3g} (where the checkpoint left it) to {now:.3g} at step {run.start_step}",
        file=sys.stderr,
    )


def _load(path: str, run) -> None:
    """Weights, optimizer and schedule, in whatever layout the checkpoint and run have."""
    written = next((k for k in KINDS if os.path.isdir(os.path.join(path, k))), None)
    if "deepspeed" in (written, run.engine.shards) and written != run.engine.shards:
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
            run.engine.load_shards(os.path.join(path, written))
        except UserError:
            raise
        except Exception as exc:  # another model, or shards missing
            raise UserError(f"cannot resume from {path}: {str(exc).splitlines()[0][:300]}") from exc
        run.scheduler.load_state_dict(checkpoint.trainer_state(path)["scheduler"])
    elif run.engine.sharded:
        _load_whole_into_shards(path, run)
    else:
        checkpoint.load(path, run.policy, run.optimizer, run.scheduler)


def _load_whole_into_shards(path: str, run) -> None:
    """A one-process checkpoint into a sharded model: every rank reads it whole and keeps its
    shards (optimizer state stored by parameter name)."""
    checkpoint.check_fits(path, run.policy)
    weights = checkpoint.read_weights(path)
    whole = StateDictOptions(full_state_dict=True)
    set_model_state_dict(
        run.policy, weights, options=StateDictOptions(full_state_dict=True, strict=False)
    )
    trainer = checkpoint.trainer_state(path)
    if not all(isinstance(k, str) for k in trainer["optimizer"].get("state", {})):
        raise UserError(
            f"cannot resume from {path} on several processes: it was written "
            f"before optimizer state was stored by parameter name"
        )
    set_optimizer_state_dict(run.policy, run.optimizer, trainer["optimizer"], options=whole)
    run.scheduler.load_state_dict(trainer["scheduler"])


def _warn(run, message: str) -> None:
    if run.main:
        print(f"warning: {message}", file=sys.stderr)
