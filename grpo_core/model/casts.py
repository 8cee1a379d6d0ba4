"""Weight casts made once per optimizer update, not once per micro-batch; for a frozen
model, once.

Under bf16 autocast over float32 master weights (a run's numerics on a GPU) every forward
casts each weight it multiplies to bf16. Autocast keeps those casts (of leaf tensors that
require grad) in a cache, but clears it whenever its outermost region exits: with one region
per micro-batch forward, every micro-batch casts the whole model again, a read of the
float32 weights and a write of their bf16 copy each time. The weights only change at the
optimizer step, so one cache can serve all of an update's micro-batches: a disabled autocast
region around them keeps the nesting above zero, and the cache alive, while each forward
still enters and leaves its own enabled region (backward runs outside it, as autocast
advises). The gradients are the same: a cached cast is the same differentiable copy. A frozen
model (the reference) never changes, so its matrices are stored cast (``stored_as_computed``).
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


def stored_as_computed(model: torch.nn.Module, autocast) -> torch.nn.Module:
    """Store a frozen ``model``'s matrix weights in the dtype ``autocast`` computes them in.

    Under bf16 autocast every linear layer casts its float32 weight (and bias) to bf16 at each
    call, and inside ``inference_mode`` autocast caches none of those casts: a frozen
    reference re-reads and re-writes the whole model on every forward. Stored in bf16 the
    same layers skip the cast and hold half the bytes, and compute exactly what they did: the
    stored copy is the cast autocast would have made. Only plain ``nn.Linear`` layers change
    (a quantized subclass keeps its own storage); a weight shared with an embedding (a tied
    output head) and every other parameter or buffer (norms, embeddings, rotary tables, which
    autocast leaves in float32) keeps its dtype. Returns ``model``, changed in place."""
    if not getattr(autocast, "_enabled", False):
        return model
    dtype = autocast.fast_dtype
    tied = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    for m in model.modules():
        if type(m) is torch.nn.Linear and id(m.weight) not in tied:
            m.weight.data = m.weight.data.to(dtype)
            if m.bias is not None:
                m.bias.data = m.bias.data.to(dtype)
    return model
