"""Environment episodes: the turn loop between the generator and an environment plugin.

Each of the G trajectories of a prompt runs its own episode; all episodes of a batch advance
together, one model turn at a time (the generator decodes every trajectory still in its
episode at once), and the environment answers each turn. An episode ends when the
environment says ``done``, after ``environment.max_turns`` model turns, or when its tokens
after the prompt (model's and environment's) reach ``environment.max_total_tokens``.

What it leaves: a :class:`~grpo_core.rollout.Rollout` whose completion is the whole
trajectory and whose ``action_mask`` marks the model's tokens (the environment's are context
only: no loss, no KL, no entropy, log-prob 0), and one :class:`Transcript` per trajectory:
the conversation as chat messages, the last model turn's text (what rewards score as the
completion) and the counts behind the ``env/*`` metrics.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from grpo_core.config.view import Config, DataSection, EnvironmentSection
from grpo_core.data.prompts import EPISODE_COLUMNS, Batch
from grpo_core.engine import dist
from grpo_core.env.observations import EnvironmentFailure, Renderer, first_messages
from grpo_core.hookspecs import Environment, Generator, Observation, Turn
from grpo_core.reward.call import call_bounded
from grpo_core.rollout import Rollout, SamplingParams, pad_left


@dataclass
class Transcript:
    """One trajectory's episode as rewards and metrics see it."""

    messages: list[dict]  # first messages, then assistant and observation messages in turn
    final: str = ""  # the text of the last model turn
    turns: int = 0  # model turns
    tool_calls: int = 0
    tool_errors: int = 0
    model_tokens: int = 0
    env_tokens: int = 0
    cut: str | None = None  # "turns", "tokens" or "failed"; None: the environment ended it
    dropped: bool = False  # failed under environment.failure: drop (its reward goes missing)


class EpisodeRunner:
    """Runs a batch's episodes (``sample``) with the configured environment, generator and
    ``environment`` section; keeps the time spent in environment calls and the first failure
    of the step for the metrics and the warning."""

    def __init__(
        self,
        env: Environment,
        generator: Generator,
        tokenizer,
        environment: EnvironmentSection,
        data: DataSection,
    ):
        self.env, self.gen, self.tok = env, generator, tokenizer
        self.ec, self.system = environment, data.system_prompt
        self.renderer = Renderer(tokenizer, env, data.chat_template)
        pad = tokenizer.pad_token_id
        self.pad = pad if pad is not None else tokenizer.eos_token_id
        self.seconds = 0.0
        self.problem: str | None = None  # the step's first environment failure

    def sample(
        self,
        batch: Batch,
        rows: list[dict],
        n: int,
        sampling: SamplingParams,
        seed: int = 0,
        row_offset: int = 0,
    ) -> tuple[Rollout, list[Transcript]]:
        """``n`` episodes of each prompt, in chunks of whole prompts of at most
        ``sampling.batch_size`` trajectories (at least one prompt's)."""
        self.seconds, self.problem = 0.0, None
        per = max(1, (sampling.batch_size or len(rows) * n) // n)
        out: list[tuple[list[int], list[int], list[float], Transcript]] = []
        for s in range(0, len(rows), per):
            out += self._chunk(
                batch.prompt_ids[s : s + per],
                batch.raw[s : s + per],
                rows[s : s + per],
                n,
                sampling,
                seed,
                row_offset + s * n,
            )
        return self._rollout(batch.prompt_ids, n, out), [o[3] for o in out]

    def _chunk(self, prompt_ids, raws, rows, n, sampling, seed, row_offset):
        B, total, ec = len(rows) * n, self.ec.max_total_tokens, self.ec
        tr = [Transcript(first_messages(raws[b // n], self.system)) for b in range(B)]
        ids: list[list[int]] = [[] for _ in range(B)]
        flags: list[list[int]] = [[] for _ in range(B)]
        lps: list[list[float]] = [[] for _ in range(B)]
        states: list[Any] = [None] * B
        active = []
        for b in range(B):
            ok, states[b] = self._call(tr[b], "reset", self.env.reset, rows[b // n])
            if ok:
                active.append(b)
        context: list[list[int]] = [[] for _ in active]
        sampler = self.gen.start_episodes(prompt_ids, n, sampling, seed, row_offset)
        stop = tuple(self.env.stop_strings) + sampling.stop  # a turn ends at either
        try:
            while active:
                budgets = [min(sampling.max_new_tokens, total - len(ids[b])) for b in active]
                turns = sampler.turn(active, context, budgets, stop)
                nxt: list[tuple[int, list[int]]] = []
                for b, turn in zip(active, turns):
                    ids[b] += turn.ids
                    flags[b] += [1] * len(turn.ids)
                    lps[b] += turn.logprobs
                    ctx = self._react(tr[b], states[b], turn, len(ids[b]), ec)
                    if ctx is not None:
                        ids[b] += ctx
                        flags[b] += [0] * len(ctx)
                        lps[b] += [0.0] * len(ctx)
                        nxt.append((b, ctx))
                active, context = [b for b, _ in nxt], [c for _, c in nxt]
        finally:
            sampler.close()
        return list(zip(ids, flags, lps, tr))

    def _react(
        self, t: Transcript, state: Any, turn: Turn, used: int, ec: EnvironmentSection
    ) -> list[int] | None:
        """Record a model turn and get the environment's answer: the context tokens to
        append, or None when the episode is over."""
        text = self.tok.decode(turn.ids, skip_special_tokens=True)
        t.messages.append({"role": "assistant", "content": text})
        t.final, t.turns, t.model_tokens = text, t.turns + 1, t.model_tokens + len(turn.ids)
        if turn.finish == "length" and used >= ec.max_total_tokens:
            t.cut = "tokens"
            return None
        ok, obs = self._call(t, "step", self.env.step, state, text)
        if not ok:
            return None
        t.tool_calls += bool(obs.tool_call)
        t.tool_errors += bool(obs.tool_error)
        message = {
            "role": self.renderer.role,
            "content": obs.text,
            "tool_call": bool(obs.tool_call),
            "tool_error": bool(obs.tool_error),
        }
        if obs.done:
            if obs.text:
                t.messages.append(message)
            return None
        if t.turns >= ec.max_turns:
            t.cut = "turns"
            return None
        ctx = self.renderer.tokens(
            obs.text, turn.ids[-1] if turn.finish == "eos" and turn.ids else None
        )
        if used + len(ctx) >= ec.max_total_tokens:  # no room left for a model token
            t.cut = "tokens"
            return None
        t.messages.append(message)
        t.env_tokens += len(ctx)
        return ctx

    def _call(self, t: Transcript, what: str, fn: Callable, *args) -> tuple[bool, Any]:
        """An environment call under ``environment.timeout`` and ``environment.failure``."""
        t0 = time.time()
        try:
            out = call_bounded(fn, args, {}, self.ec.timeout, "environment.timeout")
            if what == "step" and not isinstance(out, Observation):
                raise TypeError(f"returned {type(out).__name__}, expected an Observation")
            return True, out
        except Exception as exc:  # a plugin's bug or hang, reported by name below
            problem = (
                f"environment {self.ec.name!r} {what} "
                f"{'' if isinstance(exc, TimeoutError) else type(exc).__name__ + ': '}"
                f"{str(exc)[:200]}"
            )
            if self.ec.failure == "raise":
                raise EnvironmentFailure(problem + " (environment.failure: raise)") from exc
            self.problem = self.problem or problem
            t.cut, t.dropped = "failed", self.ec.failure == "drop"
            return False, None
        finally:
            self.seconds += time.time() - t0

    def _rollout(self, prompt_ids: list[list[int]], n: int, out: list) -> Rollout:
        pids, pmask = pad_left(prompt_ids, self.pad)
        B, T = len(out), max([1] + [len(o[0]) for o in out])
        ids = torch.full((B, T), self.pad, dtype=torch.long)
        mask, action = torch.zeros((B, T), dtype=torch.long), torch.zeros((B, T), dtype=torch.long)
        logps = torch.zeros((B, T), dtype=torch.float32)
        for b, (i, f, lp, _) in enumerate(out):
            ids[b, : len(i)], mask[b, : len(i)] = torch.tensor(i, dtype=torch.long), 1
            action[b, : len(i)], logps[b, : len(i)] = (
                torch.tensor(f, dtype=torch.long),
                torch.tensor(lp, dtype=torch.float32),
            )
        cut = torch.tensor([o[3].cut in ("turns", "tokens") for o in out])
        return Rollout(pids, pmask, ids, mask, logps, cut, torch.arange(B) // n, action)

    def close(self) -> None:
        self.env.close()


def episode_metrics(
    transcripts: list[Transcript], seconds: float, device: torch.device
) -> dict[str, float]:
    """The step's ``env/*`` metrics, summed over ranks: per-episode means of turns, tool
    calls, tool errors and tokens by source; the share of episodes that called a tool at
    least once, that were cut by the token budget or by max_turns, that failed."""
    s = dist.sum_named(
        {
            "n": len(transcripts),
            "turns": sum(t.turns for t in transcripts),
            "calls": sum(t.tool_calls for t in transcripts),
            "callers": sum(t.tool_calls > 0 for t in transcripts),
            "errors": sum(t.tool_errors for t in transcripts),
            "model": sum(t.model_tokens for t in transcripts),
            "env": sum(t.env_tokens for t in transcripts),
            "tokens": sum(t.cut == "tokens" for t in transcripts),
            "max_turns": sum(t.cut == "turns" for t in transcripts),
            "failed": sum(t.cut == "failed" for t in transcripts),
        },
        device,
    )
    n = max(s["n"], 1.0)
    return {
        "env/turns": s["turns"] / n,
        "env/tool_calls": s["calls"] / n,
        "env/tool_call_frac": s["callers"] / n,
        "env/tool_errors": s["errors"] / n,
        "env/model_tokens": s["model"] / n,
        "env/env_tokens": s["env"] / n,
        "env/cut_budget_frac": s["tokens"] / n,
        "env/cut_turns_frac": s["max_turns"] / n,
        "env/failed_frac": s["failed"] / n,
        "time/environment": seconds,
    }


def problems(config: Config) -> list[str]:
    """What the configured run cannot do with an environment (yet): one line each, naming
    the key. Read from the plugins' declarations, so ``grpo validate`` reports them."""
    from grpo_core.registry import registry

    if not config.environment:
        return []
    found = [
        f"data.columns: {c!r} is a reserved name the trainer passes to rewards with an "
        f"environment; rename the dataset field"
        for c in EPISODE_COLUMNS
        if c in config.data.columns
    ]
    gen = registry().get("generator", config.generator.name).factory
    if not (isinstance(gen, type) and issubclass(gen, Generator) and gen.supports_episodes):
        found.append(
            f"generator.name: {config.generator.name!r} cannot sample "
            f"multi-turn episodes; use hf or vllm"
        )
    return found
