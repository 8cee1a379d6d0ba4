"""The asynchronous loop's shared weights file leaves nothing in /dev/shm (issue #53): its
name is gone as soon as the trainer maps it, and names left by dead runs are removed at the
next start (the owner's PID is in the name)."""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import pytest
import torch

from grpo_core.overlap import weights
from grpo_core.overlap.weights import PREFIX, WeightRing, remove_stale

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs Linux /proc")


def mine() -> list[str]:
    return glob.glob(os.path.join(weights._shm_dir(), f"{PREFIX}{os.getpid()}-*"))


def test_no_name_is_left_once_the_trainer_has_mapped_it():
    before = mine()
    entries, size = [weights.Entry("w", (4,), "float32", weights.ALIGN)], 2 * weights.ALIGN
    ring = WeightRing(entries, size, slots=2)
    assert mine() == before  # a SIGKILL from here on leaves nothing behind
    other = WeightRing(entries, size, 2, ring.path)  # what the generator maps (same fd number)
    model = torch.nn.Module()
    model.register_buffer("w", torch.arange(4.0))
    ring.write(model, 1)
    got = torch.nn.Module()
    got.register_buffer("w", torch.zeros(4))
    other.read(got, 1)
    assert torch.equal(got.w, model.w)
    ring.close()
    assert ring.fd == -1


def test_stale_names_of_dead_owners_are_removed(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # reaped: its PID names no process
    stale = tmp_path / f"{PREFIX}{dead.pid}-abc"
    live = tmp_path / f"{PREFIX}{os.getpid()}-def"
    other = tmp_path / "grpo-weights-notapid"
    for f in (stale, live, other):
        f.write_bytes(b"x" * 64)
    assert remove_stale(str(tmp_path)) == [str(stale)]
    assert not stale.exists() and live.exists() and other.exists()
