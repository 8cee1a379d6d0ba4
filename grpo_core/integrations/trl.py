"""Any registered grpo-core reward as a TRL reward function.

TRL's GRPOTrainer calls ``reward_func(prompts=..., completions=..., **kwargs)`` with the
dataset's other columns as keyword lists (plus its own extras such as ``completion_ids`` and
``trainer_state``) and expects a list of floats. Completions are strings, or, for
conversational datasets, lists of messages whose last assistant message is the text.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpo_core

#: keyword arguments TRL adds that are not dataset columns
TRL_EXTRAS = ("completion_ids", "trainer_state", "log_extra", "log_metric", "environments")


def _text(completion: Any) -> str:
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):  # conversational: [{"role": ..., "content": ...}, ...]
        for message in reversed(completion):
            if isinstance(message, dict) and message.get("role", "assistant") == "assistant":
                content = message.get("content", "")
                if isinstance(content, list):  # multimodal content blocks
                    return "".join(c.get("text", "") for c in content if isinstance(c, dict))
                return str(content)
    return str(completion)


def trl_reward(name: str, options: dict | None = None) -> Callable[..., list[float]]:
    """Build reward plugin ``name`` and wrap it in TRL's reward-function signature."""
    reward = grpo_core.create("reward", name, options)

    def reward_func(prompts: list, completions: list, **kwargs) -> list[float]:
        ids, state = kwargs.get("completion_ids"), kwargs.get("trainer_state")
        columns = {k: v for k, v in kwargs.items() if k not in TRL_EXTRAS}
        if ids is not None:
            columns["completion_ids"] = [list(x) for x in ids]
            columns["completion_tokens"] = [len(x) for x in ids]
        if state is not None:  # our reserved column's form (grpo_core.reward.call)
            columns["trainer_state"] = {
                "global_step": state.global_step,
                "max_steps": getattr(state, "max_steps", None),
            }
        scores = reward(prompts, [_text(c) for c in completions], **columns)
        return [float(s) for s in scores]

    reward_func.__name__ = f"grpo_core_{name}"  # TRL logs rewards under the function's name
    return reward_func
