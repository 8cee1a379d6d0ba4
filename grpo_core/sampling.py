"""Batch-invariant sampling: the randomness for a token depends only on (seed, row, step).

Each row draws one uniform number from a counter-based hash of (seed, completion id,
position) and picks the token where the cumulative probability passes it (inverse-CDF
sampling). The same seed gives the same completions whether a group is generated in one
batch or in pieces, on one process or several, and there is no RNG state to checkpoint.
"""

from __future__ import annotations

import math

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


def uniform(seed: int, rows: torch.Tensor, step: int | torch.Tensor) -> torch.Tensor:
    """One float64 in (0, 1) per row, determined by (seed, row id, step); 53 random bits.
    ``step`` may be a tensor that broadcasts against ``rows`` ([T, 1]: every step's numbers
    at once, [T, R], the same as T calls: the hash is elementwise)."""
    key = _hash32(
        torch.tensor(seed & _M32, device=rows.device) ^ _hash32(rows.long() * 0x9E3779B1 + step)
    )
    hi = _hash32(key * 0x85EBCA77 + 1)
    lo = _hash32(key * 0xC2B2AE3D + 2) >> 11  # 21 bits
    return ((hi * 2097152 + lo).double() + 0.5) / 9007199254740992.0


def apply_repetition_penalty(z: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """The repetition penalty of CTRL (Keskar et al. 2019) as transformers and vLLM apply it:
    for each token already in the row (``seen`` [R, V] bool: prompt and completion so far), a
    positive logit is divided by ``penalty`` and a negative one multiplied by it, so
    penalty > 1 makes repeats less likely either way. Raw logits z [R, V], before temperature."""
    if penalty == 1.0:
        return z
    return torch.where(seen, torch.where(z > 0, z / penalty, z * penalty), z)


def filter_logits(
    z: torch.Tensor, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0
) -> torch.Tensor:
    """Set logits outside the kept set to -inf. z: [R, V], temperature already applied.

    The order is transformers': top-k (the k likeliest), then top-p (the smallest set whose
    probability reaches p, renormalized after top-k), then min-p (tokens whose probability
    is at least ``min_p`` times the likeliest one's; renormalizing does not move this ratio).
    The repetition penalty and the temperature come before (see :func:`sample`). vLLM's V1
    sampler applies min-p before top-k/top-p: the two differ only when top_p < 1 and
    min_p > 0 are both set, in which tokens the nucleus holds."""
    if top_k and top_k < z.shape[-1]:
        kth = torch.topk(z, top_k, dim=-1).values[:, -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    if top_p < 1.0:
        sorted_z, order = torch.sort(z, descending=True, dim=-1)
        probs = torch.softmax(sorted_z, dim=-1)
        drop_sorted = probs.cumsum(-1) - probs > top_p  # keep the token crossing p
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        z = z.masked_fill(drop, float("-inf"))
    if min_p > 0.0:  # p_i >= min_p * p_max  <=>  z_i - z_max >= log(min_p)
        z = z.masked_fill(z - z.max(-1, keepdim=True).values < math.log(min_p), float("-inf"))
    return z


def sample(
    z: torch.Tensor,
    seed: int,
    rows: torch.Tensor,
    step: int | torch.Tensor,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
) -> torch.Tensor:
    """Sample one token per row from temperature-scaled logits z [R, V] -> [R] (a repetition
    penalty, when set, is applied to the logits before the temperature)."""
    return draw(z, uniform(seed, rows, step), top_k, top_p, min_p)


def draw(
    z: torch.Tensor, u: torch.Tensor, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0
) -> torch.Tensor:
    """:func:`sample` with each row's uniform number ``u`` [R] given (a decode loop draws
    every step's at once: the hash is a few dozen small ops per call)."""
    z = filter_logits(z.float(), top_k, top_p, min_p)
    cdf = torch.softmax(z.double(), dim=-1).cumsum(-1)
    tok = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(1)
    return tok.clamp(max=z.shape[-1] - 1)


def stop_window(stop: tuple[str, ...]) -> int:
    """How many of the newest tokens can hold a stop string: at most 4 tokens per character
    (byte-level tokenizers), and a few more for a token that merges with its neighbours."""
    return 4 * max((len(s) for s in stop), default=0) + 4


def hits_stop(tokenizer, tail: list[int], stop: tuple[str, ...]) -> bool:
    """Whether the decoded text of a completion's newest tokens holds a stop string. Checked
    after every token, so a stop string found here was completed by the newest token."""
    text = tokenizer.decode(tail, skip_special_tokens=False)
    return any(s in text for s in stop)
