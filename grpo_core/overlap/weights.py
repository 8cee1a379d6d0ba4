"""The policy's weights in shared memory: k + 1 slots, each a version header and every
tensor of the state dict at a fixed offset, in a file under /dev/shm both processes map.

Slot reuse is safe without locks: version v sits in slot v % (k + 1) and is overwritten by
version v + k + 1, which the trainer writes only after training step v + k, whose rollout the
generator sampled from version v after copying it. The header is checked after each copy, so
a broken protocol shows as an error, not as silently wrong weights.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from dataclasses import dataclass

import torch

ALIGN = 64  # bytes: every tensor starts at a multiple of this (dtype views need alignment)


@dataclass(frozen=True)
class Entry:
    """One tensor's place in a slot."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # e.g. "float32": torch.<dtype>
    offset: int  # bytes from the slot's start


def _round(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def layout(model: torch.nn.Module) -> tuple[list[Entry], int]:
    """Where each state-dict tensor of ``model`` goes in a slot, and the slot's size in
    bytes (the first ALIGN bytes hold the version)."""
    entries, at = [], ALIGN
    for name, t in model.state_dict().items():
        entries.append(Entry(name, tuple(t.shape), str(t.dtype).removeprefix("torch."), at))
        at += _round(t.numel() * t.element_size())
    return entries, at


def _shm_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


class WeightRing:
    """``slots`` copies of the weights in one shared file: ``path`` None makes the file (the
    trainer), else the existing one is mapped (the generator)."""

    def __init__(self, entries: list[Entry], slot_bytes: int, slots: int, path: str | None = None):
        self.entries, self.slot_bytes, self.slots = entries, slot_bytes, slots
        size = slot_bytes * slots
        if path is None:
            path = os.path.join(_shm_dir(), f"grpo-weights-{os.getpid()}-{uuid.uuid4().hex}")
            with open(path, "wb") as f:
                f.truncate(size)
        self.path = path
        self.buffer = torch.from_file(path, shared=True, size=size, dtype=torch.uint8)

    def unlink(self) -> None:
        """Remove the file's name (the mappings stay valid): nothing is left behind once
        both sides have mapped it, however they end."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def _slot(self, version: int) -> torch.Tensor:
        start = (version % self.slots) * self.slot_bytes
        return self.buffer[start : start + self.slot_bytes]

    def _view(self, slot: torch.Tensor, e: Entry) -> torch.Tensor:
        dtype = getattr(torch, e.dtype)
        n = torch.Size(e.shape).numel() * torch.empty((), dtype=dtype).element_size()
        return slot[e.offset : e.offset + n].view(dtype).view(e.shape)

    def write(self, model: torch.nn.Module, version: int) -> None:
        """Copy ``model``'s state dict into version ``version``'s slot, then its header."""
        slot, state = self._slot(version), model.state_dict()
        with torch.no_grad():
            for e in self.entries:
                self._view(slot, e).copy_(state[e.name].detach().to("cpu"))
        slot[:8].view(torch.int64)[0] = version

    def read(self, model: torch.nn.Module, version: int) -> None:
        """Load version ``version`` into ``model``; raises when its slot holds another."""
        slot, state = self._slot(version), model.state_dict()
        self._check(slot, version)
        with torch.no_grad():
            for e in self.entries:
                state[e.name].copy_(self._view(slot, e))
        self._check(slot, version)  # not overwritten while copied

    @staticmethod
    def _check(slot: torch.Tensor, version: int) -> None:
        found = int(slot[:8].view(torch.int64)[0])
        if found != version:
            raise RuntimeError(f"weights slot holds version {found}, expected {version}")
