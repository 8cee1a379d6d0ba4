"""Data parallelism through torch.distributed (torchrun / accelerate launch set the env)."""

from __future__ import annotations

import os

import torch
import torch.distributed as td


def init(device: torch.device) -> tuple[int, int]:
    """Join the process group when launched with WORLD_SIZE > 1; returns (rank, world)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not td.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        td.init_process_group(backend)
    if td.is_initialized():
        return td.get_rank(), td.get_world_size()
    return 0, 1


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def world_size() -> int:
    return td.get_world_size() if td.is_initialized() else 1


def active() -> bool:
    return td.is_initialized() and td.get_world_size() > 1


def all_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum over ranks (in place where possible); identity on one process."""
    if active():
        td.all_reduce(t, op=td.ReduceOp.SUM)
    return t


def sum_named(values: dict[str, float], device: torch.device | str = "cpu") -> dict[str, float]:
    """Sum each named number over ranks, in one all-reduce; identity on one process."""
    names = sorted(values)
    t = torch.tensor([float(values[k]) for k in names], dtype=torch.float64, device=device)
    return dict(zip(names, all_sum(t).tolist()))


def all_max(t: torch.Tensor) -> float:
    """Largest value over ranks."""
    t = t.double().reshape(1)
    if active():
        td.all_reduce(t, op=td.ReduceOp.MAX)
    return float(t)


def reduce_gradients(params) -> None:
    """Sum gradients over ranks: each rank's loss already divides by the global denominators."""
    if not active():
        return
    grads = [p.grad for p in params if p.grad is not None]
    if grads:
        flat = torch.cat([g.reshape(-1) for g in grads])
        td.all_reduce(flat, op=td.ReduceOp.SUM)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()


def weights_in_sync(params) -> bool:
    """Whether every rank holds the same weights (a float64 checksum per rank, compared)."""
    if not active():
        return True
    with torch.no_grad():
        local = torch.stack([p.detach().double().sum() for p in params]).reshape(-1)
        mine = torch.cat([local, (local * torch.arange(1, len(local) + 1,
                                                        dtype=torch.float64)).sum().reshape(1)])
    everyone = [torch.empty_like(mine) for _ in range(td.get_world_size())]
    td.all_gather(everyone, mine)
    return all(torch.equal(everyone[0], e) for e in everyone[1:])


def barrier() -> None:
    if active():
        td.barrier()


def finish() -> None:
    if td.is_initialized():
        td.destroy_process_group()
