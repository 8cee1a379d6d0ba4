"""A run's checkpoints: what of a run one holds (weights, optimizer, schedule, the KL
controller, the data position, the source of targets' state, in-flight rollouts, RNGs), when
one is written, and resuming from one. The files themselves: grpo_core.store."""

from __future__ import annotations

import os
import signal
from typing import TYPE_CHECKING

from grpo_core.config.file import unresolved
from grpo_core.engine import dist, schedules
from grpo_core.errors import UserError
from grpo_core.interrupt import Stopped
from grpo_core.log import log
from grpo_core.rollout import NEUTRAL
from grpo_core.store import checkpoint, persist

if TYPE_CHECKING:
    from grpo_core.run import Run


def save(run: Run, step: int, now: bool = False) -> str | None:
    """Every ``output.checkpoint_every`` steps, or ``now``: weights, optimizer, plugin state,
    RNGs. Returns the checkpoint's directory when one was written."""
    oc = run.config.output
    if not now and (not oc.checkpoint_every or (step + 1) % oc.checkpoint_every):
        return None
    root = os.path.join(run.dir, "checkpoints")
    written = unresolved(run.config.as_dict())  # ${env:NAME}, never the value
    meta = {
        "config": written,
        "config_hash": checkpoint.config_hash(written),
        "kl": run.kl.state_dict(),
        "data_position": run.stream.position,
        "data": run.stream.state_dict(),
        "progress": run.progress.state(),
    }
    targets = run.targets.state_dict()  # baseline.pt: a critic's tensors too
    # rollouts asked of the generator process for later steps: kept, so none is lost or
    # sampled twice (the data position is already past their prompts)
    inflight = run.sampler.inflight(step)
    if run.engine.shards:
        persist.save_sharded(
            run.engine,
            root,
            step + 1,
            run.run_id,
            run.main,
            run.tokenizer,
            run.scheduler,
            meta,
            oc.keep_last,
            targets,
        )
    elif run.main:
        checkpoint.save(
            root,
            step + 1,
            run.run_id,
            run.policy,
            run.tokenizer,
            persist.optimizer_state(run.policy, run.optimizer),
            run.scheduler,
            meta,
            oc.keep_last,
            run.save_dtype,
            targets,
            inflight,
        )
    dist.barrier()
    return os.path.join(root, f"{checkpoint.PREFIX}{step + 1:08d}")


def stop_signal(run: Run, signum: int) -> int:
    """The signal every rank stops on at this step boundary (0: none): a signal any rank
    received stops them all, at the same step."""
    if not dist.active():
        return signum
    got = dist.sum_named({"signal": signum}, run.device)["signal"]
    return signum or (int(signal.SIGTERM) if got else 0)


def stopped(run: Run, step: int, path: str | None, signum: int) -> Stopped:
    """The error a run stopped by ``signum`` after ``step`` ends with, once what it holds is
    released."""
    run.close()
    return Stopped(
        f"stopped by {signal.Signals(signum).name} after step {step + 1} of "
        f"{run.config.train.steps}; checkpoint saved in {path}; continue with "
        f"--resume",
        signum,
    )


def resume(run: Run, target: str | bool, force: bool) -> dict | None:
    """Load a checkpoint: the newest intact one of this run, or the directory given.
    Returns the in-flight rollouts of an asynchronous run it holds (None: none)."""
    path = persist.find(os.path.join(run.dir, "checkpoints"), target, run.run_id, _warner(run))
    state = checkpoint.read_state(path) or {}  # intact: persist.find checked
    for key, value in NEUTRAL.items():  # written before the setting existed: sampled without it
        (state.get("config") or {}).get("sampling", {}).setdefault(key, value)
    diffs = checkpoint.config_differences(state, unresolved(run.config.as_dict()))
    if diffs and not force:
        raise UserError(
            "cannot resume: the config differs from the checkpoint's in "
            + "; ".join(diffs)
            + " (use --force to resume anyway)"
        )
    persist.load(path, run.engine, run.policy, run.optimizer, run.scheduler)
    checkpoint.restore_rng(path, state)
    then = state.get("config") or {}
    lr = run.config.optimizer.lr
    if force and then.get("optimizer", {}).get("lr") not in (None, lr):
        schedules.set_peak_lr(run.scheduler, run.optimizer, lr)  # forced with a new rate
    run.kl.load_state_dict(state["kl"])
    targets = checkpoint.targets_state(path, state)
    if targets:
        run.targets.load_state_dict(targets)
    run.stream.load_state_dict(state.get("data") or {"position": state["data_position"]})
    # a checkpoint written before progress was kept has tokens_seen (or nothing) alone
    kept = state.get("progress") or {"tokens_seen": state.get("tokens_seen", 0)}
    run.progress.resumed(state["step"], kept)
    if run.main:
        log.info(
            "resumed from %s: %d steps done; the next is step %d in metrics.jsonl (which "
            "counts from 0)",
            path,
            run.progress.start,
            run.progress.start,
        )
        notice = persist.schedule_notice(
            run.scheduler,
            run.optimizer,
            run.config.optimizer.lr_schedule,
            then.get("train", {}).get("steps"),
            run.config.train.steps,
            run.progress.start,
        )
        if notice:
            log.info(notice)
    return checkpoint.inflight(path)


def _warner(run: Run):
    def warn(message: str) -> None:
        if run.main:
            log.warning("warning: %s", message)

    return warn
