"""Data parallelism through torch.distributed (torchrun / accelerate launch set the env)."""

from __future__ import annotations

import os

import torch
import torch.distributed as td

from grpo_core.errors import UserError


def init(device: torch.device) -> tuple[torch.device, int, int]:
    """This process's device (:func:`own_device`, made current first, so that the process
    group and everything after it use it), then the process group when launched with
    WORLD_SIZE > 1; returns (device, rank, world)."""
    device = own_device(device)
    if launched_world() > 1 and not td.is_initialized():
        # on GPUs one group with two backends: NCCL for tensors on the device, gloo beside it
        # for CPU tensors and objects (flags, sums, the reward grid), chosen by the tensor
        td.init_process_group("cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo")
    if td.is_initialized():
        return device, td.get_rank(), td.get_world_size()
    return device, 0, 1


def own_device(device: torch.device) -> torch.device:
    """The device this process computes on. Under a launcher (WORLD_SIZE > 1) every rank of
    a node gets the GPU numbered by its LOCAL_RANK — without this all of them would allocate
    on GPU 0 — and that GPU is made current (torch.cuda.set_device), so NCCL, FSDP's meshes
    and anything written as plain "cuda" land on it. One process keeps the configured index.
    A CPU device is returned as it is."""
    if device.type != "cuda":
        return device
    index = local_rank() if launched_world() > 1 else (device.index or 0)
    count = torch.cuda.device_count()
    if index >= count:
        raise UserError(
            f"runtime.device: this process needs CUDA device {index} (LOCAL_RANK "
            f"{local_rank()}), but {count} are visible; start at most {count} "
            f"processes per machine"
        )
    chosen = torch.device("cuda", index)
    torch.cuda.set_device(chosen)
    return chosen


def launched_world() -> int:
    """The number of processes the launcher started (WORLD_SIZE; 1 without one)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def rank() -> int:
    return td.get_rank() if td.is_initialized() else 0


def world_size() -> int:
    return td.get_world_size() if td.is_initialized() else 1


def active() -> bool:
    return td.is_initialized() and td.get_world_size() > 1


def all_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum over ranks (in place where possible); identity on one process."""
    if active():
        td.all_reduce(t, op=td.ReduceOp.SUM)
    return t


def sum_named(
    values: dict[str, float | torch.Tensor], device: torch.device | str = "cpu"
) -> dict[str, float]:
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


def gather_grid(grid: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Every rank's [P_rank, G_rank] reward grid stacked into the global [P, G_max] one (NaN
    where a rank's groups are shorter), and where this rank's rows start. Statistics taken on
    it (a batch mean, a batch std) are the same however many processes share the batch."""
    if not active():
        return grid, 0
    shape = torch.tensor([grid.shape[0], grid.shape[1]], dtype=torch.long)
    shapes = [torch.empty_like(shape) for _ in range(td.get_world_size())]
    td.all_gather(shapes, shape)
    rows, width = max(int(s[0]) for s in shapes), max(int(s[1]) for s in shapes)
    padded = torch.full((rows, width), torch.nan, dtype=torch.float64)
    padded[: grid.shape[0], : grid.shape[1]] = grid
    parts = [torch.empty_like(padded) for _ in shapes]
    td.all_gather(parts, padded)
    full = torch.cat([p[: int(s[0])] for p, s in zip(parts, shapes)])
    start = sum(int(s[0]) for s in shapes[: td.get_rank()])
    return full.to(grid.dtype), start


def gather_numbers(values: list[float]) -> list[list[float]]:
    """Each rank's list of numbers (same length on every rank), in rank order."""
    mine = torch.tensor(values, dtype=torch.float64)
    if not active():
        return [mine.tolist()]
    everyone = [torch.empty_like(mine) for _ in range(td.get_world_size())]
    td.all_gather(everyone, mine)
    return [t.tolist() for t in everyone]


def weights_in_sync(sums: torch.Tensor) -> bool:
    """Whether every rank holds the same weights, from each whole parameter's float64 sum
    (``sums``, [parameters]) and a position-weighted total, compared across ranks."""
    if not active():
        return True
    weighted = (sums * torch.arange(1, len(sums) + 1, dtype=torch.float64)).sum().reshape(1)
    mine = torch.cat([sums, weighted])
    everyone = [torch.empty_like(mine) for _ in range(td.get_world_size())]
    td.all_gather(everyone, mine)
    return all(torch.equal(everyone[0], e) for e in everyone[1:])


def barrier() -> None:
    if active():
        td.barrier()


def finish() -> None:
    if td.is_initialized():
        td.destroy_process_group()
