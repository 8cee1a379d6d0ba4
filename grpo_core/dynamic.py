"""DAPO's dynamic sampling (Yu et al. 2025, sec. 3.2): a step trains on ``prompts_per_step``
groups that carry a learning signal. Groups whose rewards are all equal (or whose std is at
most ``groups.min_std``) are filtered out and replaced by groups of new prompts, taken from
the data order, until the batch is full or ``groups.max_rounds`` generation rounds have run.

Round 1 is the ordinary step (the same prompts, seed and noise). Each later round takes from
the stream exactly as many new prompts as the ranks together still need, each rank the share
it lacks, in rank order; a completion draws the noise of its row in the round, so one process
and several generate the same groups. The prompts consumed are counted by the stream's
position, which the checkpoint records: a resumed run continues exactly. When the rounds run
out, a rank still short completes its batch with the last round's filtered groups (as many
as it lacks, exactly), which stay out of the loss.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from grpo_core.data.prompts import Batch
from grpo_core.engine import dist
from grpo_core.loss.groups import first_group_size, group_std, group_std_zero, to_grid
from grpo_core.phases import Judged, Sampled, generate, score, step_seed
from grpo_core.reward.call import Scored
from grpo_core.rollout import Rollout, pad_right
from grpo_core.run import Run


def has_signal(rewards: torch.Tensor, min_std: float = 0.0) -> torch.Tensor:
    """[P, G] rewards (NaN = missing) -> [P] bool: the group's valid rewards differ and their
    population std is above ``min_std`` (DAPO keeps 0 < accuracy < 1: std > 0)."""
    return ~group_std_zero(rewards) & (group_std(rewards) > min_std)


def round_seed(seed: int, step: int, k: int) -> int:
    """The sampling seed of round ``k`` of a step (round 0: the step's own seed)."""
    return step_seed(seed, step) ^ ((k * 0x9E3779B9) & 0xFFFFFFFF)


def sample_with_signal(run: Run, step: int) -> tuple[Sampled, Judged]:
    """Phases 1 and 2 with dynamic sampling: this rank's ``run.prompts`` groups, drawn over
    as many rounds as the batch needs (at most ``groups.max_rounds``), with the metrics
    ``groups/filtered`` (groups left out for want of signal), ``groups/generated`` and
    ``groups/rounds``, over all ranks."""
    gc, P, G = run.config.groups, run.prompts, first_group_size(run.cfg)
    kept: list[tuple[Sampled, Judged, list[int]]] = []
    have, rounds, generated, filtered, spare = 0, 0, 0, 0, None
    while rounds < gc.max_rounds:
        needs = [int(n[0]) for n in dist.gather_numbers([float(P - have)])]
        if not sum(needs):
            break
        rows = run.stream.take(sum(needs))
        start = sum(needs[: run.rank])
        s = generate(
            run,
            step,
            rows[start : start + needs[run.rank]],
            round_seed(run.config.train.seed, step, rounds),
            start * G,
        )
        rounds += 1
        if s is None:
            continue
        j = score(run, step, s)
        grid = to_grid(j.scored.rewards, j.rollout.group.cpu(), len(s.batch.prompts))[0]
        signal = has_signal(grid, gc.min_std)
        idx = torch.nonzero(signal).squeeze(1).tolist()
        if idx:
            kept.append((s, j, idx))
        have, generated = have + len(idx), generated + len(signal)
        filtered += len(signal) - len(idx)
        spare = (s, j, torch.nonzero(~signal).squeeze(1).tolist())
    filler = P - have  # the last round's filtered groups, exactly as many as are missing
    if filler:
        s, j, idx = spare
        kept.append((s, j, idx[:filler]))
    counts = dist.sum_named(
        {"groups/filtered": filtered, "groups/generated": generated, "groups/filler": filler}
    )
    return _join(kept, P - filler, {**counts, "groups/rounds": float(rounds)})


def _join(
    parts: list[tuple[Sampled, Judged, list[int]]], signal: int, counts: dict
) -> tuple[Sampled, Judged]:
    """The chosen groups of each round (``parts``: sampled, judged, group indices) as one
    step's Sampled and Judged; groups from index ``signal`` on are the filler."""
    ss, js = [], []
    for s, j, idx in parts:
        rows = torch.cat([torch.nonzero(j.rollout.group.cpu() == g).squeeze(1) for g in idx])
        ro = _groups(j.rollout, idx, rows)
        transcripts = None if s.transcripts is None else [s.transcripts[r] for r in rows]
        greedy = None if s.greedy is None else _groups(s.greedy, idx, torch.tensor(idx).long())
        ss.append(
            replace(
                s, batch=s.batch.select(idx), rollout=ro, transcripts=transcripts, greedy=greedy
            )
        )
        js.append(
            replace(
                j,
                rollout=ro,
                scored=_scored(j.scored, rows.tolist()),
                flat=j.flat[idx],
                greedy_rewards=None if j.greedy_rewards is None else j.greedy_rewards[idx],
            )
        )
    ro = _cat_rollouts([j.rollout for j in js])
    greedy = None if ss[0].greedy is None else _cat_rollouts([s.greedy for s in ss])
    sampled = Sampled(
        _cat_batches([s.batch for s in ss]),
        ro,
        sum(s.seconds for s in ss),
        None if ss[0].transcripts is None else [t for s in ss for t in s.transcripts],
        greedy,
        sum(s.greedy_seconds for s in ss),
    )
    P = ro.prompt_ids.shape[0]
    judged = Judged(
        ro,
        _cat_scored([j.scored for j in js]),
        torch.cat([j.flat for j in js]),
        None if js[0].greedy_rewards is None else torch.cat([j.greedy_rewards for j in js]),
        0,
        sum(j.seconds for j in js),
        sum(j.greedy_seconds for j in js),
        torch.arange(P) >= signal,
        counts,
    )
    return sampled, judged


def _groups(ro: Rollout, idx: list[int], rows: torch.Tensor) -> Rollout:
    """The completions ``rows`` of groups ``idx``, renumbered 0..len(idx)-1 in that order."""
    where = {g: k for k, g in enumerate(idx)}
    sub = ro.rows(rows.to(ro.group.device))
    group = torch.tensor(
        [where[g] for g in sub.group.tolist()], dtype=torch.long, device=ro.group.device
    )
    keep = torch.tensor(idx, dtype=torch.long, device=ro.prompt_ids.device)
    return replace(
        sub, prompt_ids=ro.prompt_ids[keep], prompt_mask=ro.prompt_mask[keep], group=group
    )


def _left(t: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(t, (width - t.shape[1], 0), value=0)


def _cat_rollouts(parts: list[Rollout]) -> Rollout:
    """Rollouts of different prompts as one: prompts re-padded on the left, completions on
    the right, group indices shifted by the prompts before them."""
    width = max(r.prompt_ids.shape[1] for r in parts)
    offsets = torch.tensor([0] + [r.prompt_ids.shape[0] for r in parts]).cumsum(0).tolist()
    return Rollout(
        torch.cat([_left(r.prompt_ids, width) for r in parts]),
        torch.cat([_left(r.prompt_mask, width) for r in parts]),
        pad_right([r.completion_ids for r in parts], 0),
        pad_right([r.completion_mask for r in parts], 0),
        pad_right([r.logprobs for r in parts], 0.0),
        torch.cat([r.truncated for r in parts]),
        torch.cat([r.group + o for r, o in zip(parts, offsets)]),
        pad_right([r.action_mask for r in parts], 0),
    )


def _cat_batches(parts: list[Batch]) -> Batch:
    return Batch(
        [x for b in parts for x in b.raw],
        [x for b in parts for x in b.prompts],
        [x for b in parts for x in b.prompt_ids],
        {k: [x for b in parts for x in b.columns[k]] for k in parts[0].columns},
    )


def _scored(scored: Scored, rows: list[int]) -> Scored:
    pick = lambda named: {k: [v[r] for r in rows] for k, v in named.items()}  # noqa: E731
    return Scored(
        scored.rewards[rows], pick(scored.dimensions), pick(scored.extras), scored.problem
    )


def _cat_scored(parts: list[Scored]) -> Scored:
    """The rounds' scores one after another; a dimension or extra a round lacks is filled."""

    def joined(per_part: list[dict], fill: object) -> dict:
        keys = {k for d in per_part for k in d}
        return {
            k: [x for d, p in zip(per_part, parts) for x in d.get(k, [fill] * len(p.rewards))]
            for k in keys
        }

    return Scored(
        torch.cat([p.rewards for p in parts]),
        joined([p.dimensions for p in parts], float("nan")),
        joined([p.extras for p in parts], None),
        next((p.problem for p in parts if p.problem), None),
    )
