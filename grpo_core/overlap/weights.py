"""The policy's weights in shared memory: k + 1 slots, each a version header and every
tensor of the state dict at a fixed offset, in a file under /dev/shm both processes map.

Slot reuse is safe without locks: version v sits in slot v % (k + 1) and is overwritten by
version v + k + 1, which the trainer writes only after training step v + k, whose rollout the
generator sampled from version v after copying it. The header is checked after each copy, so
a broken protocol shows as an error, not as silently wrong weights.

Nothing is left in /dev/shm however the run ends, SIGKILL included: on Linux the trainer
removes the file's name the moment it has mapped it and keeps a descriptor, which the
generator process inherits and maps through ``/proc/self/fd``; elsewhere the name goes once
both sides have mapped it. A name left by a run killed in that moment (or by an older
version) holds its owner's PID and is removed by the next run once that process is gone.
"""

from __future__ import annotations

import glob
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


PREFIX = "grpo-weights-"  # then the owner's PID: grpo-weights-<pid>-<random>


def _shm_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's: alive
        return True
    return True


def remove_stale(directory: str | None = None) -> list[str]:
    """Remove the weight files whose owner process has ended; returns their paths."""
    removed = []
    for path in glob.glob(os.path.join(directory or _shm_dir(), PREFIX + "*")):
        pid = os.path.basename(path)[len(PREFIX) :].partition("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            try:
                os.unlink(path)
                removed.append(path)
            except OSError:  # gone already, or not ours to remove
                pass
    return removed


class WeightRing:
    """``slots`` copies of the weights in one shared file: ``path`` None makes the file (the
    trainer; ``fd`` is then the descriptor a child process inherits, -1 where there is no
    /proc), else the existing one is mapped (the generator)."""

    def __init__(self, entries: list[Entry], slot_bytes: int, slots: int, path: str | None = None):
        self.entries, self.slot_bytes, self.slots = entries, slot_bytes, slots
        size, self.fd, self.name = slot_bytes * slots, -1, None
        if path is None:
            remove_stale()
            self.name = os.path.join(_shm_dir(), f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex}")
            self.fd = os.open(self.name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            os.ftruncate(self.fd, size)
            path = self.name
            if os.path.isdir("/proc/self/fd"):
                path = f"/proc/self/fd/{self.fd}"  # the same number in a child given it
        self.path = path
        self.buffer = torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
        if path != self.name:
            self.unlink()  # mapped, and the descriptor stays open: the name is not needed

    def unlink(self) -> None:
        """Remove the file's name (the mappings stay valid): nothing is left behind once
        both sides have mapped it, however they end."""
        if self.name is not None:
            try:
                os.unlink(self.name)
            except FileNotFoundError:
                pass
            self.name = None

    def close(self) -> None:
        """Remove the name and close the descriptor (once the other side has mapped it)."""
        self.unlink()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

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
