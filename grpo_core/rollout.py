"""A batch of sampled completions, grouped by prompt, and the sampling settings."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # the config imports this module (its sampling settings' schema)
    from grpo_core.config.view import SamplingSection


@dataclass
class SamplingParams:
    """How completions are sampled; the defaults are the neutral values (no effect).

    Applied in this order (as transformers does): the repetition penalty on the raw logits,
    the temperature, then top-k, top-p and min-p (grpo_core.sampling). ``greedy`` takes the
    argmax after the penalty. A completion ends at an EOS id or at the token that completes
    one of the ``stop`` strings (that token is kept, like EOS)."""

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    greedy: bool = False
    batch_size: int | None = None  # most completions generated at once (None: all)
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, sampling: SamplingSection, **override) -> SamplingParams:
        """From a config's ``sampling`` section whose model defaults are resolved
        (grpo_core.store.models.resolve_sampling); ``override`` replaces fields."""
        kw: dict = {k: getattr(sampling, k) for k in MODEL_DEFAULTED}
        kw.update(
            max_new_tokens=sampling.max_new_tokens,
            stop=tuple(sampling.stop),
            batch_size=sampling.generation_batch_size,
        )
        return cls(**{**kw, **override})


def _from_model(name: str, kind: str, what: str, **limits) -> tuple[str, dict]:
    """The config schema of a sampling setting that null leaves to the model."""
    neutral = next(f.default for f in fields(SamplingParams) if f.name == name)
    return name, {
        "type": [kind, "null"],
        "default": None,
        **limits,
        "description": f"{what} (null: the model's generation_config value, else {neutral})",
    }


#: config ``sampling`` entries a model's generation_config may supply (see
#: grpo_core.store.models.resolve_sampling); the neutral values are SamplingParams' defaults
MODEL_SETTINGS = dict(
    [
        _from_model(
            "temperature",
            "number",
            "sampling temperature, log-probs use the same",
            exclusiveMinimum=0,
        ),
        _from_model("top_p", "number", "nucleus sampling mass", exclusiveMinimum=0, maximum=1),
        _from_model("top_k", "integer", "sample among the k likeliest tokens, 0: all", minimum=0),
        _from_model(
            "min_p",
            "number",
            "keep tokens at least min_p times as likely as the likeliest",
            minimum=0,
            maximum=1,
        ),
        _from_model(
            "repetition_penalty",
            "number",
            "tokens already in the prompt or completion "
            "get positive logits divided by it, negative ones multiplied",
            exclusiveMinimum=0,
        ),
    ]
)
MODEL_DEFAULTED = tuple(MODEL_SETTINGS)
NEUTRAL: dict[str, Any] = {
    f.name: f.default for f in fields(SamplingParams) if f.name in MODEL_SETTINGS
}


@dataclass
class Rollout:
    """G completions for each of P prompts; row i belongs to group ``group[i]``.

    prompt_ids, prompt_mask: [P, Lp], left-padded.
    completion_ids, completion_mask: [B, T], right-padded; the mask covers EOS.
    logprobs: [B, T], log-probs of the sampled tokens under the policy at the sampling
    temperature, log softmax(logits / T), 0 on padding: what the trainer recomputes, and
    what vLLM returns by default. The repetition penalty and the top-k/top-p/min-p filters
    shape which token is drawn but are left out of these log-probs (so the ratio against the
    trainer's log-probs is 1 at the first update).
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
    # None given: the completion mask (__post_init__), so a Rollout always holds a tensor here
    action_mask: torch.Tensor = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.action_mask is None:
            self.action_mask = self.completion_mask

    @property
    def size(self) -> int:
        return self.completion_ids.shape[0]

    def rows(self, index: torch.Tensor) -> Rollout:
        """The completions at ``index`` (prompts kept whole; ``group`` still indexes them)."""
        return Rollout(
            self.prompt_ids,
            self.prompt_mask,
            self.completion_ids[index],
            self.completion_mask[index],
            self.logprobs[index],
            self.truncated[index],
            self.group[index],
            self.action_mask[index],
        )

    def to(self, device) -> Rollout:
        return Rollout(*(getattr(self, f.name).to(device) for f in fields(self)))


def pad_left(prompts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-id lists as [P, max len] ids and attention mask, left-padded (the layout every
    generator prefills from)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p) :] = 1
    return ids, mask


def pad_right(rows: list[torch.Tensor], value) -> torch.Tensor:
    """Stack [B, T_i] tensors into [sum B, max T], padding on the right."""
    width = max(r.shape[1] for r in rows)
    return torch.cat(
        [torch.nn.functional.pad(r, (0, width - r.shape[1]), value=value) for r in rows]
    )


def merge(a: Rollout, b: Rollout) -> Rollout:
    """Append ``b``'s completions to ``a``'s; both must index the same prompts."""
    return Rollout(
        a.prompt_ids,
        a.prompt_mask,
        pad_right([a.completion_ids, b.completion_ids], 0),
        pad_right([a.completion_mask, b.completion_mask], 0),
        pad_right([a.logprobs, b.logprobs], 0.0),
        torch.cat([a.truncated, b.truncated]),
        torch.cat([a.group, b.group]),
        pad_right([a.action_mask, b.action_mask], 0),
    )
