"""Two plugins a grpo-core user can install by name.

``no_repetition`` (reward): 1 minus the share of repeated word n-grams in a completion, the
usual guard against degenerate loops in RL-trained models. ``grpo_median`` (baseline): GRPO
made robust to outlier rewards: (r - median) / (MAD * 1.4826 + eps) within each group.
"""

from __future__ import annotations

import torch

from grpo_core.hookspecs import Baseline, Reward, hookimpl

GRPO_CORE_API = (2,)


class NoRepetition(Reward):
    max_value = 1.0  # no n-gram repeats

    def __init__(self, n: int = 3, min_words: int = 6):
        self.n, self.min_words = n, min_words

    def score(self, text: str) -> float:
        words = text.split()
        if len(words) < max(self.min_words, self.n):
            return 1.0
        grams = [tuple(words[i : i + self.n]) for i in range(len(words) - self.n + 1)]
        return len(set(grams)) / len(grams)

    def __call__(self, prompts, completions, **columns):
        return [self.score(c) for c in completions]


class MedianBaseline(Baseline):
    def __init__(self, eps: float = 1e-6):
        self.eps = eps

    def advantages(self, rewards: torch.Tensor, greedy_rewards=None) -> torch.Tensor:
        out = torch.zeros_like(rewards)
        for p in range(rewards.shape[0]):
            ok = torch.isfinite(rewards[p])
            r = rewards[p][ok].double()
            if r.numel() < 2:
                continue
            med = r.median()
            mad = (r - med).abs().median() * 1.4826
            spread = mad if mad > 0 else r.std()
            if spread > 0:
                out[p][ok] = ((r - med) / (spread + self.eps)).to(rewards.dtype)
        return out


@hookimpl
def reward(register):
    register(
        "no_repetition",
        NoRepetition,
        schema={
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "n": {"type": "integer", "minimum": 1, "default": 3},
                "min_words": {"type": "integer", "minimum": 1, "default": 6},
            },
        },
        description="1 - share of repeated word n-grams",
    )


@hookimpl
def baseline(register):
    register(
        "grpo_median",
        MedianBaseline,
        schema={
            "type": "object",
            "additionalProperties": False,
            "properties": {"eps": {"type": "number", "exclusiveMinimum": 0, "default": 1e-6}},
        },
        description="(r - group median) / (scaled MAD + eps): GRPO robust to outliers",
    )
