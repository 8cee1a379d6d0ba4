"""Weight casts made once per optimizer update, not once per micro-batch.

Under bf16 autocast over float32 master weights (a run's numerics on a GPU) every forward
casts each weight it multiplies to bf16. Autocast keeps those casts (of leaf tensors that
require grad) in a cache, but clears it whenever its outermost region exits: with one region
per micro-batch forward, every micro-batch casts the whole model again, a read of the
float32 weights and a write of their bf16 copy each time. The weights only change at the
optimizer step, so one cache can serve all of an update's micro-batches: a disabled autocast
region around them keeps the nesting above zero, and the cache alive, while each forward
still enters and leaves its own enabled region (backward runs outside it, as autocast
advises). The gradients are the same: a cached cast is the same differentiable copy.
"""

from __future__ import annotations

import contextlib

import torch


def casts_kept(autocast, sharded: bool) -> contextlib.AbstractContextManager:
    """A region in which ``autocast``'s (a ``torch.autocast``) regions share one cast cache,
    cleared when it exits. Not for ``sharded`` weights (FSDP, ZeRO-3), whose gathered copies
    are freed after each use: the cache would hold a whole bf16 model for the update."""
    if sharded or not getattr(autocast, "_enabled", False):
        return contextlib.nullcontext()
    return torch.autocast(autocast.device, enabled=False)
