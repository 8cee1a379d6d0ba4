"""Calling a reward plugin inside the loop: shape and finiteness checks, failure policies.

A reward's None for a completion means it has no reward (missing: NaN, left out of its
group's statistics and of the loss, as TRL treats it). Policies for a reward that raises,
returns the wrong length, or returns NaN/inf:
``raise`` stops the run naming the plugin and the first bad item; ``zero`` scores the bad
items 0; ``drop_group`` marks every completion of an affected group as missing (NaN), so the
group gets no advantage and leaves the loss. A NaN never reaches the loss.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from grpo_core.config.sections import RewardOverlongSection, RewardSection
from grpo_core.data.prompts import Batch, reward_inputs
from grpo_core.errors import UserError
from grpo_core.faults import Fault, describe
from grpo_core.hookspecs import Reward
from grpo_core.reward.isolation import IsolatedReward
from grpo_core.rollout import Rollout
from grpo_core.scores import Scores

FLOAT32_MAX = 3.4028234663852886e38


class RewardFailure(UserError):
    """A reward plugin misbehaved under the ``raise`` policy; ``fault`` says where, when it
    raised (the CLI shows its traceback)."""

    def __init__(self, message: str, fault: Fault | None = None):
        super().__init__(message)
        self.fault = fault


@dataclass
class Rewards:
    """A rollout's rewards as the reward plugin gave them (phase 2's raw result)."""

    rewards: torch.Tensor  # [B] float32; NaN = missing (dropped)
    dimensions: dict = field(default_factory=dict)  # name -> [B] list
    extras: dict = field(default_factory=dict)
    problem: str | None = None  # first failure, for the warning


def call_bounded(fn: Callable, args: tuple, kwargs: dict, timeout: float | None, key: str) -> Any:
    """``fn(*args, **kwargs)`` in a daemon thread, waiting at most ``timeout`` seconds (None:
    forever); past it a TimeoutError names the config ``key``. Python cannot stop a thread: a
    hung call (a reward, an environment) is abandoned, not killed, and the run goes on."""
    if timeout is None:
        return fn(*args, **kwargs)
    box: dict = {}

    def run() -> None:
        try:
            box["out"] = fn(*args, **kwargs)
        except BaseException as exc:  # handed to the caller below
            box["exc"] = exc

    t = threading.Thread(target=run, daemon=True, name=key)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise TimeoutError(f"did not return within {timeout:g} s ({key})")
    if "exc" in box:
        raise box["exc"]
    return box["out"]


def score(
    fn: Reward,
    name: str,
    prompts: list[str],
    completions: list[str],
    columns: dict,
    group: torch.Tensor,
    policy: str = "raise",
    timeout: float | None = None,
) -> Rewards:
    """Score completions; ``group`` [B] maps each completion to its prompt's group."""
    B = len(completions)
    try:
        out = call_bounded(fn, (prompts, completions), columns, timeout, "reward.timeout")
    except (Exception, SystemExit) as exc:  # a plugin's bug must not end the run silently
        fault = describe(exc, ("reward", name))
        return _fail(
            f"reward {name!r} raised {fault.within(f'reward {name!r}')}", B, group, policy, fault
        )
    problem: str | None
    if isinstance(out, (str, bytes, dict, set)) or not hasattr(out, "__iter__"):
        problem = (
            f"reward {name!r} returned a {type(out).__name__}, expected a list of {B} "
            f"numbers"
        )  # list("1111") would score one character per completion
        return _fail(problem, B, group, policy)
    try:
        values = list(out)
    except (Exception, SystemExit) as exc:
        problem = f"reward {name!r} returned {type(out).__name__} that cannot be read: {exc}"
        return _fail(problem, B, group, policy)
    if len(values) != B:
        problem = f"reward {name!r} returned {len(values)} scores for {B} completions"
        return _fail(problem, B, group, policy)
    bad = []
    for i, v in enumerate(values):
        if v is None:  # no reward for this completion: missing, not a failure
            values[i] = math.nan
            continue
        try:
            v = float(v)
        except (TypeError, ValueError, OverflowError):  # 10**400 is no float
            v = math.nan
        values[i] = v
        if not math.isfinite(v) or abs(v) > FLOAT32_MAX:
            bad.append(i)
    rewards = torch.tensor(values, dtype=torch.float32)
    problem = None
    if bad:
        problem = (
            f"reward {name!r} returned {values[bad[0]]} for completion {bad[0]} "
            f"({len(bad)} non-finite of {B})"
        )
        rewards = _apply(problem, rewards, torch.tensor(bad), group, policy)
    if isinstance(out, Scores):
        dims, dim_problem = _per_item(out.dimensions, B, numeric=True)
        extras, extra_problem = _per_item(out.extras, B, numeric=False)
        side = dim_problem or extra_problem
        if side:
            problem = f"{problem}; {side}" if problem else f"reward {name!r}: {side}"
        return Rewards(rewards, dims, extras, problem)
    return Rewards(rewards, problem=problem)


def _per_item(named: dict, B: int, numeric: bool) -> tuple[dict, str | None]:
    """A reward's named per-completion lists, keeping those of the right length (numbers
    for dimensions, as floats; NaN where not a number); says what was left out."""
    kept, problem = {}, None
    for key, values in named.items():
        if not isinstance(values, (list, tuple)) or len(values) != B:
            problem = problem or (
                f"{'dimension' if numeric else 'extra'} {str(key)[:40]!r} is "
                f"not a list of {B}; left out"
            )
            continue
        odd = [v for v in values if not _numeric(v)] if numeric else []
        if odd:
            problem = problem or (
                f"dimension {str(key)[:40]!r} holds {type(odd[0]).__name__} "
                f"{str(odd[0])[:40]!r}, expected numbers; left out"
            )
            continue
        kept[str(key)] = [_number(v) for v in values] if numeric else list(values)
    return kept, problem


def _numeric(v) -> bool:
    """A number, or None (a missing score); not text that happens to parse as one."""
    return (
        v is None
        or (isinstance(v, (int, float)) and not isinstance(v, bool))
        or (hasattr(v, "__float__") and not isinstance(v, (str, bytes)))
    )


def _number(v) -> float:
    try:
        v = float(v)
    except (TypeError, ValueError, OverflowError):
        return math.nan
    return v if math.isfinite(v) else math.nan


def score_rollout(
    fn: Reward,
    section: RewardSection,
    tokenizer,
    batch: Batch,
    ro: Rollout,
    transcripts: list | None = None,
    progress: tuple[int, int] | None = None,
) -> Rewards:
    """Decode a rollout and score it as the ``reward`` config section says (failure policy,
    time limit). Episodes (``transcripts``) that failed under ``environment.failure: drop``
    get no reward (NaN: left out of their group's statistics and of the loss). ``progress``:
    (steps done, steps planned), passed as the reserved column ``trainer_state``."""
    prompts, texts, columns = reward_inputs(tokenizer, batch, ro, transcripts)
    if progress is not None:
        columns["trainer_state"] = {"global_step": progress[0], "max_steps": progress[1]}
    timeout = None if isinstance(fn, IsolatedReward) else section.timeout  # it kills
    scored = score(
        fn,
        section.name,
        prompts,
        texts,
        columns,
        ro.group.cpu(),
        section.failure,
        timeout,
    )
    dropped = [i for i, t in enumerate(transcripts or []) if t.dropped]
    if dropped:
        scored.rewards[dropped] = torch.nan
    return scored


def overlong_penalty(
    lengths: torch.Tensor, max_tokens: int, buffer: int, factor: float = 1.0
) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13), a reward added to the task's:
    0 up to ``L_max - L_cache`` tokens, then falling linearly to ``-factor`` at ``L_max``
    (and ``-factor`` past it), so a long answer is discouraged before the budget cuts it:

        R(y) = 0                                 |y| <= L_max - L_cache
               ((L_max - L_cache) - |y|) / L_cache   L_max - L_cache < |y| <= L_max
               -1                                L_max < |y|

    lengths [B] (completion tokens), ``max_tokens`` L_max, ``buffer`` L_cache -> [B] float32.
    """
    free = max_tokens - buffer
    return ((free - lengths.float()) / buffer).clamp(-1.0, 0.0) * factor


def with_overlong(
    got: Rewards, ro: Rollout, overlong: RewardOverlongSection | None, budget: int
) -> Rewards:
    """``got`` with the soft overlong penalty (the ``reward.overlong`` section; None: off)
    added to each reward and kept as the dimension ``overlong``; ``budget``: L_max when the
    section leaves ``max_tokens`` null (the completion budget)."""
    if not overlong:
        return got
    lengths = ro.action_mask.sum(-1).cpu()
    pen = overlong_penalty(lengths, overlong.max_tokens or budget, overlong.buffer, overlong.factor)
    return Rewards(
        got.rewards + pen,
        {**got.dimensions, "overlong": pen.tolist()},
        got.extras,
        got.problem,
    )


def _fail(
    problem: str, B: int, group: torch.Tensor, policy: str, fault: Fault | None = None
) -> Rewards:
    """Every completion failed (the call raised or gave the wrong length)."""
    return Rewards(
        _apply(problem, torch.zeros(B), torch.arange(B), group, policy, fault), problem=problem
    )


def _apply(
    problem: str,
    rewards: torch.Tensor,
    bad: torch.Tensor,
    group: torch.Tensor,
    policy: str,
    fault: Fault | None = None,
) -> torch.Tensor:
    if policy == "raise":
        raise RewardFailure(problem + " (reward.failure: raise)", fault)
    rewards = rewards.clone()
    rewards[bad] = 0.0
    if policy == "drop_group":
        rewards[torch.isin(group, group[bad])] = torch.nan
    return rewards
