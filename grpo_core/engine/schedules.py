"""The learning-rate schedule, by the names ``transformers.get_scheduler`` knows, so that a
schedule written for the Trainer or TRL means the same here.

``constant`` is warm-up (when ``optimizer.warmup_steps`` is set) then constant: transformers'
``constant_with_warmup`` (its own ``constant`` ignores warm-up, which no config written for
this project expected). Every schedule offered is a ``LambdaLR``, so a checkpoint stores its
position and a forced resume can give it a new peak learning rate (:func:`set_peak_lr`).
"""

from __future__ import annotations

import math

import torch

from grpo_core.config.schema import SCHEDULES  # noqa: F401  (the names offered)
from grpo_core.config.view import OptimizerSection, TrainSection
from grpo_core.errors import UserError


def build(
    optimizer: torch.optim.Optimizer, section: OptimizerSection, total: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """The ``optimizer`` section's schedule over ``total`` optimizer updates; a schedule
    missing one of its own options (``warmup_stable_decay`` without ``num_decay_steps``,
    ``cosine_with_min_lr`` without ``min_lr_rate``) is a one-line error."""
    from transformers import get_scheduler

    name = section.lr_schedule
    options = dict(section.scheduler_options)
    if options and name in ("constant", "constant_with_warmup"):  # transformers ignores them
        raise UserError(
            f"optimizer.scheduler_options: lr_schedule {name} takes no options "
            f"(found {sorted(options)})"
        )
    try:
        sched = get_scheduler(
            "constant_with_warmup" if name == "constant" else name,
            optimizer,
            num_warmup_steps=warmup(section, total),
            num_training_steps=total,
            scheduler_specific_kwargs=options,
        )
    except (TypeError, ValueError) as exc:
        reason = " ".join(str(exc).split())
        raise UserError(
            f"optimizer.scheduler_options: lr_schedule {name} with "
            f"{options or 'no options'}: {reason}"
        ) from exc
    if not isinstance(sched, torch.optim.lr_scheduler.LambdaLR):
        raise UserError(f"optimizer.lr_schedule: {name} is not a per-update schedule")
    return sched


def total_updates(train: TrainSection) -> int:
    """Optimizer updates in a whole run: per step, ``mini_batches`` in each of
    ``inner_iterations`` passes."""
    return train.steps * train.inner_iterations * train.mini_batches


def warmup(section: OptimizerSection, total: int) -> int:
    """Warm-up updates: ``warmup_steps``, or ``warmup_ratio`` of the ``total`` updates."""
    ratio = section.warmup_ratio
    if ratio is None:
        return section.warmup_steps
    if section.warmup_steps:
        raise UserError(
            f"optimizer.warmup_ratio: {ratio} set beside optimizer.warmup_steps "
            f"{section.warmup_steps}; keep one"
        )
    return math.ceil(ratio * total)


def problems(section: OptimizerSection, total: int) -> list[str]:
    """Why the schedule cannot be built (checked on a throwaway optimizer, before a model
    loads)."""
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=section.lr)
    try:
        build(opt, section, total)
    except UserError as exc:
        return [str(exc)]
    return []


def set_peak_lr(
    scheduler: torch.optim.lr_scheduler.LambdaLR, optimizer: torch.optim.Optimizer, lr: float
) -> None:
    """Give a resumed schedule a new peak learning rate, at the position it had reached."""
    scheduler.base_lrs = [lr] * len(scheduler.base_lrs)
    for group, f in zip(optimizer.param_groups, scheduler.lr_lambdas):
        group["lr"] = lr * f(scheduler.last_epoch)
    scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]
