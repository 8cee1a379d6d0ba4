"""How accumulated gradients become a weight update, and what the rest of the run may ask of
the model's distributed layout: whole weights for generation and saving, and its state in a
checkpoint. ``TorchUpdate``: plain torch, one process or FSDP2-wrapped (ddp, fsdp:
grpo_core.engine.parallel); grpo_core.engine.zero: a DeepSpeed ZeRO engine. All see the same
per-micro-batch losses, whose denominators are global, so the summed gradient is the full
batch's gradient."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
from torch.distributed.tensor import DTensor

from grpo_core.config.view import OptimizerSection
from grpo_core.engine import dist, parallel


def build_optimizer(params: list, oc: OptimizerSection, how: str = "none") -> torch.optim.Optimizer:
    """The ``optimizer`` section's optimizer over ``params``, by ``optimizer.name``:

    adamw: AdamW; in one process its fused kernel (one pass over each parameter instead of a
      dozen ops, the update up to rounding; transformers' Trainer defaults to it too) unless
      ``optimizer.fused`` is false. Sharded runs (ddp, fsdp, deepspeed) keep the default one.
    sgd: plain SGD with ``momentum`` and (coupled, L2) ``weight_decay``; no moment state.
    adafactor: transformers' Adafactor at the configured learning rate (no relative step, no
      parameter scaling): factored second moments, much less state than AdamW's."""
    if oc.name == "sgd":
        return torch.optim.SGD(params, lr=oc.lr, momentum=oc.momentum, weight_decay=oc.weight_decay)
    if oc.name == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(
            params,
            lr=oc.lr,
            weight_decay=oc.weight_decay,
            scale_parameter=False,
            relative_step=False,
            warmup_init=False,
        )
    fused = (
        how == "none"
        and oc.fused
        and all(torch.is_floating_point(p) and p.device.type in ("cpu", "cuda") for p in params)
    )
    return torch.optim.AdamW(
        params,
        lr=oc.lr,
        betas=tuple(oc.betas),
        weight_decay=oc.weight_decay,
        fused=True if fused else None,
    )


def _local(t: torch.Tensor) -> int:
    return t.to_local().numel() if isinstance(t, DTensor) else t.numel()


class TorchUpdate:
    """The optimizer + LR schedule; gradients reduced on the last micro-batch only, clipped,
    and a step with a non-finite loss or gradient norm on any rank skipped on every rank."""

    #: the LM head is applied as the model's own module (all logits at once) rather than in
    #: chunks from its weight: True where that weight is whole only inside the module's call
    head_module = False

    def __init__(
        self, model, params, opt, sched, max_grad_norm: float | None, reshard: bool = False
    ):
        self.model, self.params, self.opt, self.sched = model, params, opt, sched
        self.max_norm = max_grad_norm or float("inf")
        self.sharded = bool(parallel.units(model))
        self.reshard = reshard  # fsdp frees gathered layers after each forward (parallel)

    @property
    def shards(self) -> str | None:
        """The folder of a checkpoint written by every rank (None: rank 0 writes it whole)."""
        return "dcp" if self.sharded else None

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

    @contextlib.contextmanager
    def gathered(self) -> Iterator[None]:
        """Whole weights on every rank while the body runs (generation); every rank enters."""
        with parallel.gathered(self.model, self.reshard):
            yield

    def full_state_dict(self) -> dict | None:
        """The whole model's weights on rank 0 when the model holds shards (every rank calls
        this); None when ``model.state_dict()`` is already whole."""
        return parallel.full_state_dict(self.model) if self.sharded else None

    def parameter_sums(self) -> torch.Tensor:
        """[parameters] float64: each whole parameter's sum (gathered one at a time)."""
        with torch.no_grad():
            return torch.stack(
                [
                    (p.full_tensor() if isinstance(p, DTensor) else p).double().sum()
                    for p in self.model.parameters()
                ]
            ).reshape(-1)

    def held(self) -> tuple[int, int]:
        """Parameter and optimizer-state elements this rank holds."""
        state = sum(
            _local(v)
            for s in self.opt.state.values()
            for v in s.values()
            if isinstance(v, torch.Tensor) and v.dim() > 0
        )
        return sum(_local(p) for p in self.model.parameters()), state

    def save_shards(self, folder: str) -> None:
        """Every rank writes its shards of the weights and optimizer (torch.distributed.checkpoint,
        in parallel; nothing gathered)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.opt)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=folder)

    def load_shards(self, folder: str) -> None:
        """Read what ``save_shards`` wrote, resharded to this run's layout."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.opt)
        dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id=folder)
        set_state_dict(self.model, self.opt, model_state_dict=model_sd, optim_state_dict=optim_sd)
