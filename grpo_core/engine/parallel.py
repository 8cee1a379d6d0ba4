"""How the policy is spread over processes (``distributed.strategy``).

- ``none``: one process, the model as it is.
- ``ddp``: every rank holds the whole model; gradients are summed across ranks (FSDP2 with a
  replicate-only mesh: torch's all-reduce in buckets, overlapped with backward).
- ``fsdp``: FSDP2 (``torch.distributed.fsdp.fully_shard``), one unit per decoder layer plus
  the root: parameters, gradients and optimizer state are split across ranks and gathered
  layer by layer when used.
- ``deepspeed``: a DeepSpeed ZeRO engine (grpo_core.engine.zero).

In every case the loss of each rank already divides by the global token (or sequence) count,
so gradients are *summed* over ranks, never averaged; and gradients are synchronised only on
the last micro-batch of each update.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as td

from grpo_core.config.view import Config, DistributedSection
from grpo_core.errors import UserError


def strategy(config: Config, world: int) -> str:
    """The strategy a run uses: the configured one, or for ``auto`` DeepSpeed when a
    ``deepspeed`` config is given, data parallel on several processes, else none."""
    chosen = config.distributed.strategy
    if chosen == "auto":
        return "deepspeed" if config.deepspeed else ("ddp" if world > 1 else "none")
    if chosen == "deepspeed" and not config.deepspeed:
        raise UserError("distributed.strategy: deepspeed needs a deepspeed config section")
    return chosen


def _layer_types(model) -> tuple[type[torch.nn.Module], ...]:
    """The transformer block classes (the model's own ``_no_split_modules``)."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    for m in model.modules():  # a peft model keeps the list on its base model
        names |= set(getattr(m, "_no_split_modules", None) or [])
    found = tuple({type(m) for m in model.modules() if type(m).__name__ in names})
    if not found:
        raise UserError(
            "distributed.strategy: cannot find the model's decoder layers to shard "
            "(its class lists no _no_split_modules)"
        )
    return found


def shard(model, how: str, distributed: DistributedSection, device: torch.device) -> None:
    """Apply FSDP2 in place: each decoder layer, then the root. ``how``: ddp or fsdp."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    world = td.get_world_size()
    kind = "cuda" if device.type == "cuda" else "cpu"
    if how == "ddp":  # replicate across ranks, shard within a group of one: plain DDP
        mesh = init_device_mesh(kind, (world, 1), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh(kind, (world,), mesh_dim_names=("shard",))
    options: dict = {"mesh": mesh}
    if device.type == "cuda" and distributed.mixed_precision:
        options["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32
        )
    if how == "fsdp" and distributed.cpu_offload:
        options["offload_policy"] = CPUOffloadPolicy()
    reshard = how == "fsdp" and distributed.reshard_after_forward
    layers = _layer_types(model)
    for module in list(model.modules()):
        if isinstance(module, layers):
            fully_shard(module, reshard_after_forward=reshard, **options)
    # the root keeps its parameters (embeddings, head) from forward to backward: the head is
    # used right after the forward, and backward gathers them again at once anyway
    fully_shard(model, reshard_after_forward=False, **options)
    for unit in units(model):
        unit.set_gradient_divide_factor(1.0)  # a sum: the losses have global denominators
        unit.set_force_sum_reduction_for_comms(True)  # plain SUM (gloo has no pre-scaled sum)


def units(model) -> list:
    """The FSDP2 units inside ``model`` (none when it is not sharded)."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def set_gradient_sync(model, on: bool) -> None:
    """Accumulate micro-batches locally (off), reduce on the last one (on)."""
    for unit in units(model):
        unit.set_requires_gradient_sync(on, recurse=False)


@contextlib.contextmanager
def gathered(model, reshard_after_forward: bool) -> Iterator[None]:
    """Hold every unit's full parameters while the body runs — generation calls the decoder
    directly, token by token, and must neither see shards nor gather each layer at every
    step — then shard them again."""
    shards = units(model)
    layers = [u for u in shards if u is not model]  # the root keeps its own setting
    if reshard_after_forward:
        for unit in layers:
            unit.set_reshard_after_forward(False, recurse=False)
    for unit in shards:
        unit.unshard()
    try:
        yield
    finally:
        for unit in shards:
            unit.reshard()
        if reshard_after_forward:
            for unit in layers:
                unit.set_reshard_after_forward(True, recurse=False)


def full_state_dict(model) -> dict:
    """The whole model's state on rank 0 (CPU), empty elsewhere: for the final save."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
