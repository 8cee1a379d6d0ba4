"""Batch-invariant sampling: the noise for a token depends only on (seed, row, step, token id).

Gumbel-max with counter-based noise gives the same completions whether a group is generated
in one batch or in pieces, on one process or several, and needs no RNG state to checkpoint.
"""

from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mixer (lowbias32) on int64 tensors holding values below 2**32."""
    x = x & _M32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def gumbel_noise(seed: int, rows: torch.Tensor, step: int, vocab: int) -> torch.Tensor:
    """Standard Gumbel noise [len(rows), vocab] determined by (seed, row id, step, token id)."""
    dev = rows.device
    key = _hash32(torch.tensor(seed & _M32, device=dev) ^ _hash32(rows.long() * 0x9E3779B1 + step))
    h = _hash32(key[:, None] * 0x85EBCA77 + torch.arange(vocab, device=dev)[None, :])
    h = _hash32(h ^ key[:, None])
    u = (h.double() + 0.5) / 4294967296.0
    return -torch.log(-torch.log(u))


def filter_logits(z: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Set logits outside the top-k / nucleus (top-p) set to -inf. z: [R, V]."""
    if top_k and top_k < z.shape[-1]:
        kth = torch.topk(z, top_k, dim=-1).values[:, -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    if top_p < 1.0:
        sorted_z, order = torch.sort(z, descending=True, dim=-1)
        cum = torch.softmax(sorted_z, dim=-1).cumsum(-1)
        drop_sorted = cum - torch.softmax(sorted_z, dim=-1) > top_p  # keep the token crossing p
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        z = z.masked_fill(drop, float("-inf"))
    return z


def sample(z: torch.Tensor, seed: int, rows: torch.Tensor, step: int, top_k: int = 0,
           top_p: float = 1.0) -> torch.Tensor:
    """Sample one token per row from temperature-scaled logits z [R, V] -> [R]."""
    z = filter_logits(z.float(), top_k, top_p)
    return torch.argmax(z.double() + gumbel_noise(seed, rows, step, z.shape[-1]), dim=-1)
