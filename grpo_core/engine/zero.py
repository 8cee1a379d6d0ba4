"""DeepSpeed ZeRO as the update engine (``distributed.strategy: deepspeed``).

Stages 1 and 2 split the optimizer state (and gradients) across ranks; every rank keeps the
whole weights, so generation and the log-prob passes see an ordinary model. Stage 3 also
splits the weights: DeepSpeed's hooks gather each layer as it runs and free it after, so

- generation, which calls the decoder token by token, runs with every weight gathered once
  and the hooks lifted (DeepSpeed's ``unwrap_model_for_generation``);
- the LM head runs as the model's own module (``head_module``): its weight exists whole only
  inside that module's forward and backward, never for a chunked head built from it;
- saving the final model gathers one module's weights at a time onto rank 0;
- the reference model is partitioned the same way (an engine without an optimizer), unless
  ``model.reference_device`` puts it on the CPU.

Checkpoints are DeepSpeed's own (``engine.save_checkpoint``: each rank its partitions of the
fp32 weights and the optimizer), inside our atomic checkpoint directory; they resume under the
same DeepSpeed stage and number of processes.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator

import torch

from grpo_core.engine import dist
from grpo_core.engine.update import TorchUpdate
from grpo_core.errors import TrainingError, UserError
from grpo_core.rollout import Rollout


class DeepSpeedUpdate(TorchUpdate):
    """A DeepSpeed engine owns the reduction, the clipping and the optimizer step."""

    def __init__(
        self,
        model,
        params,
        opt,
        sched,
        ds_config: dict,
        micro_batches: int,
        micro_batch_size: int,
        max_grad_norm: float | None,
        reference=None,
    ):
        try:
            import deepspeed
        except ImportError as exc:
            raise UserError(
                "deepspeed: configured but not installed (pip install 'grpo-core[deepspeed]')"
            ) from exc
        cfg = dict(ds_config)
        self.stage = cfg.get("zero_optimization", {}).get("stage", 0)  # checked: preflight
        cfg.update(
            {
                "gradient_accumulation_steps": micro_batches,
                "train_micro_batch_size_per_gpu": micro_batch_size,
                "zero_allow_untested_optimizer": True,
            }
        )
        cfg.pop("train_batch_size", None)
        if max_grad_norm:
            cfg.setdefault("gradient_clipping", max_grad_norm)
        self.engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=opt, lr_scheduler=sched, config=cfg
        )
        self.reference = None  # kept: a dropped engine takes its partitioning hooks with it
        if self.stage == 3 and reference is not None and reference is not model:
            # the reference partitioned as the policy is, its layers gathered as they run
            self.reference, _, _, _ = deepspeed.initialize(
                model=reference,
                config={k: v for k, v in cfg.items() if k not in ("optimizer", "scheduler")},
            )
        self.world = dist.world_size()
        super().__init__(model, params, opt, sched, None)
        self.head_module = self.stage == 3

    @property
    def shards(self) -> str:
        return "deepspeed"

    def zero_grad(self) -> None:
        """Nothing: the engine clears its gradients after each update."""

    def backward(self, loss: torch.Tensor, last: bool = True) -> None:
        from deepspeed.runtime.base_optimizer import ZeROOptimizer

        # DeepSpeed cannot skip an update, and a non-finite loss leaves NaN in the gradients
        # it would apply: every rank stops here together, the last checkpoint intact
        if dist.all_sum(torch.tensor([0.0 if torch.isfinite(loss) else 1.0])).item():
            raise TrainingError(
                "non-finite loss under deepspeed, which cannot skip an update: "
                "resume from the last checkpoint with a lower optimizer.lr, or "
                "check the rewards"
            )
        # what engine.forward would arrange, as we call the model itself: whether this
        # micro-batch ends the update (ZeRO reads it during backward: partitioned gradients,
        # offload) ...
        self.engine.set_gradient_accumulation_boundary(last)
        # DeepSpeed averages over ranks; our denominators are already global: undo the mean
        self.engine.backward(loss * self.world, scale_wrt_gas=False)
        self.engine.step()
        if isinstance(self.engine.optimizer, ZeROOptimizer):  # ... and that the next one adds
            self.engine.optimizer.clear_backward_seen_flag()  # to it (ZeRO-3 would overwrite)

    def step(self, loss_finite: bool) -> tuple[float, bool]:
        norm = self.engine.get_global_grad_norm()
        return (float(norm) if norm is not None else 0.0), self.engine.was_step_applied()

    @contextlib.contextmanager
    def gathered(self) -> Iterator[None]:
        if self.stage < 3:
            yield
            return
        from deepspeed.runtime.zero.stage3 import unwrap_model_for_generation

        with unwrap_model_for_generation(self.engine):
            yield

    def _whole(self, params: list) -> contextlib.AbstractContextManager:
        """These parameters whole on every rank while the body runs (ZeRO-3)."""
        import deepspeed

        return deepspeed.zero.GatheredParameters(params, enabled=self.stage == 3)

    def full_state_dict(self) -> dict | None:
        if self.stage < 3:
            return None
        main = dist.rank() == 0
        whole = dict(self.model.state_dict()) if main else {}  # buffers; parameters below
        for prefix, module in self.model.named_modules(remove_duplicate=False):
            own = list(module.named_parameters(recurse=False, remove_duplicate=False))
            with self._whole([p for _, p in own]):  # one module at a time
                if main:
                    whole.update(
                        {
                            f"{prefix}.{name}" if prefix else name: p.detach().cpu().clone()
                            for name, p in own
                        }
                    )
        return whole

    def parameter_sums(self) -> torch.Tensor:
        """Under ZeRO-3 each weight exists once, split across ranks: every rank sums the same
        gathered tensor, so this checks the gathering, not a divergence."""
        sums = []
        with torch.no_grad():
            for p in self.model.parameters():
                with self._whole([p]):
                    sums.append(p.double().sum())
        return torch.stack(sums).reshape(-1)

    def held(self) -> tuple[int, int]:
        params, state = super().held()
        if self.stage == 3:  # a partitioned parameter keeps its part in ds_tensor
            params = sum(p.ds_tensor.numel() for p in self.model.parameters())
        return params, state

    def save_shards(self, folder: str) -> None:
        self.engine.save_checkpoint(
            os.path.dirname(folder), tag=os.path.basename(folder), save_latest=False
        )

    def load_shards(self, folder: str) -> None:
        where = os.path.dirname(folder)
        try:
            loaded, _ = self.engine.load_checkpoint(
                where, tag=os.path.basename(folder), load_lr_scheduler_states=False
            )  # trainer.pt
        except Exception as exc:  # another stage or number of processes, files missing
            raise UserError(
                f"cannot resume from {where}: {str(exc).splitlines()[0][:300]} "
                f"(a DeepSpeed checkpoint resumes under the same ZeRO stage and "
                f"number of processes)"
            ) from exc
        if loaded is None:
            raise UserError(f"cannot resume from {where}: DeepSpeed found no checkpoint in it")


def logprobs_through_head(
    model, inputs: dict, ro: Rollout, temperature: float, entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``grpo_core.model.logprobs.completion_logprobs`` from one call of the whole model on
    ``inputs`` (each prompt + completion), its own LM head making the [B, T, V] logits: under
    ZeRO-3 a module's weights are whole only inside that module's call and its backward. No
    prompt sharing, no chunks. [B, T] each."""
    T = ro.completion_ids.shape[1]
    # called even with no completion tokens: the other ranks gather weights in this call
    # (logits_to_keep=0 would mean every position: keep one, then none)
    logits = model(**inputs, logits_to_keep=max(T, 1)).logits[:, 1 if T == 0 else 0 :]
    logp = torch.log_softmax(
        logits.to(torch.float64 if logits.dtype == torch.float64 else torch.float32) / temperature,
        -1,
    )
    mask = ro.completion_mask.to(logp.dtype)
    lp = logp.gather(2, ro.completion_ids[..., None]).squeeze(2) * mask
    return lp, ((-(logp.exp() * logp).sum(-1) * mask) if entropy else None)


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
