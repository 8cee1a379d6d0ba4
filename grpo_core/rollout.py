"""A batch of sampled completions, grouped by prompt, and the sampling settings."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass
class SamplingParams:
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    greedy: bool = False
    batch_size: int | None = None  # most completions generated at once (None: all)


@dataclass
class Rollout:
    """G completions for each of P prompts; row i belongs to group ``group[i]``.

    prompt_ids, prompt_mask: [P, Lp], left-padded.
    completion_ids, completion_mask: [B, T], right-padded; the mask covers EOS.
    logprobs: [B, T], log-probs under the sampling policy (temperature applied), 0 on padding.
    truncated: [B] bool, True when no EOS came within the budget (an episode: when it was
    cut by ``environment.max_turns`` or the token budget).
    group: [B] long, the prompt index of each completion.
    action_mask: [B, T], 1 where the model produced the token, 0 on padding and on an
    environment's tokens (context only: no loss, KL or entropy); left out, the
    completion_mask (a single-turn rollout's tokens are all the model's).
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    logprobs: torch.Tensor
    truncated: torch.Tensor
    group: torch.Tensor
    action_mask: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.action_mask is None:
            self.action_mask = self.completion_mask

    @property
    def size(self) -> int:
        return self.completion_ids.shape[0]

    def rows(self, index: torch.Tensor) -> Rollout:
        """The completions at ``index`` (prompts kept whole; ``group`` still indexes them)."""
        return Rollout(self.prompt_ids, self.prompt_mask, self.completion_ids[index],
                       self.completion_mask[index], self.logprobs[index], self.truncated[index],
                       self.group[index], self.action_mask[index])

    def to(self, device) -> Rollout:
        return Rollout(*(getattr(self, f.name).to(device) for f in fields(self)))


def pad_right(rows: list[torch.Tensor], value) -> torch.Tensor:
    """Stack [B, T_i] tensors into [sum B, max T], padding on the right."""
    width = max(r.shape[1] for r in rows)
    return torch.cat([torch.nn.functional.pad(r, (0, width - r.shape[1]), value=value)
                      for r in rows])


def merge(a: Rollout, b: Rollout) -> Rollout:
    """Append ``b``'s completions to ``a``'s; both must index the same prompts."""
    return Rollout(a.prompt_ids, a.prompt_mask,
                   pad_right([a.completion_ids, b.completion_ids], 0),
                   pad_right([a.completion_mask, b.completion_mask], 0),
                   pad_right([a.logprobs, b.logprobs], 0.0),
                   torch.cat([a.truncated, b.truncated]), torch.cat([a.group, b.group]),
                   pad_right([a.action_mask, b.action_mask], 0))
