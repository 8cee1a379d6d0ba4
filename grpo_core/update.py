"""How accumulated gradients become a weight update: plain torch (data parallel through
torch.distributed), or a DeepSpeed ZeRO engine. Both see the same per-micro-batch losses,
whose denominators are global, so the summed gradient is the full batch's gradient."""

from __future__ import annotations

import json
import math
import os

import torch
from torch.distributed.tensor import DTensor

from grpo_core import dist, parallel
from grpo_core.errors import UserError


class TorchUpdate:
    """AdamW + LR schedule over a model that is whole (one process) or FSDP2-wrapped (ddp,
    fsdp: grpo_core.parallel); gradients reduced on the last micro-batch only, clipped, and a
    step with a non-finite loss or gradient norm on any rank skipped on every rank."""

    def __init__(self, model, params, opt, sched, max_grad_norm: float | None):
        self.model, self.params, self.opt, self.sched = model, params, opt, sched
        self.max_norm = max_grad_norm or float("inf")
        self.sharded = bool(parallel.units(model))

    def zero_grad(self) -> None:
        self.opt.zero_grad(set_to_none=True)

    def backward(self, loss: torch.Tensor, last: bool = True) -> None:
        """Accumulate this micro-batch's gradient; ``last``: reduce across ranks now."""
        if self.sharded:
            parallel.set_gradient_sync(self.model, last)
        loss.backward()

    def step(self, loss_finite: bool) -> tuple[float, bool]:
        """Apply the update; returns (grad norm, applied)."""
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_norm)
        gnorm = float(norm.full_tensor() if isinstance(norm, DTensor) else norm)
        finite = dist.all_sum(torch.tensor([0.0 if loss_finite else 1.0])).item() == 0
        if not (math.isfinite(gnorm) and finite):
            self.opt.zero_grad(set_to_none=True)
            return gnorm, False
        self.opt.step()
        self.sched.step()
        return gnorm, True


class DeepSpeedUpdate(TorchUpdate):
    """A DeepSpeed engine (ZeRO stage 1 or 2) owns the optimizer step and the reduction."""

    def __init__(self, model, params, opt, sched, ds_config: dict, micro_batches: int,
                 micro_batch_size: int, max_grad_norm: float | None):
        try:
            import deepspeed
        except ImportError as exc:
            raise UserError("deepspeed: configured but not installed "
                            "(pip install 'grpo-core[deepspeed]')") from exc
        cfg = dict(ds_config)
        stage = cfg.get("zero_optimization", {}).get("stage", 0)
        if stage not in (0, 1, 2):
            raise UserError(f"deepspeed.zero_optimization.stage: {stage} is not supported by the "
                            f"hf generator (it samples with full weights); use 1 or 2")
        cfg.update({"gradient_accumulation_steps": micro_batches,
                    "train_micro_batch_size_per_gpu": micro_batch_size,
                    "zero_allow_untested_optimizer": True})
        cfg.pop("train_batch_size", None)
        if max_grad_norm:
            cfg.setdefault("gradient_clipping", max_grad_norm)
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt,
                                                    lr_scheduler=sched, config=cfg)
        self.world = dist.world_size()
        self.skipped = False
        super().__init__(model, params, opt, sched, None)

    def zero_grad(self) -> None:
        self.skipped = False

    def backward(self, loss: torch.Tensor, last: bool = True) -> None:
        if not torch.isfinite(loss):  # the engine cannot skip a step: zero this one's gradient
            loss = loss.nan_to_num(0.0, 0.0, 0.0) * 0.0
            self.skipped = True
        # DeepSpeed averages over ranks; our denominators are already global: undo the mean
        self.engine.backward(loss * self.world, scale_wrt_gas=False)
        self.engine.step()

    def step(self, loss_finite: bool) -> tuple[float, bool]:
        norm = self.engine.get_global_grad_norm()
        return (float(norm) if norm is not None else 0.0), not self.skipped


def deepspeed_config(value) -> dict | None:
    """The ``deepspeed`` config entry: a dict, or a path to a DeepSpeed JSON file."""
    if value is None or isinstance(value, dict):
        return value
    if not os.path.exists(value):
        raise UserError(f"deepspeed: config file not found: {value}")
    try:
        with open(value, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as exc:
        raise UserError(f"deepspeed: {value} is not valid JSON ({exc.msg})") from exc
