"""The phases of one training step, in order: sample, score, advantages, update, observe,
save. Each takes the :class:`~grpo_core.run.Run` and what the phases before it returned, and
returns a small record of its own; none edits another's output.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass, replace

import torch

from grpo_core.data.prompts import Batch, make_batch
from grpo_core.engine import dist
from grpo_core.env.episodes import Transcript, completion_budget, episode_metrics
from grpo_core.errors import TrainingError
from grpo_core.loss.groups import (
    allocate,
    first_group_size,
    group_std,
    group_std_zero,
    mini_batches,
    resample,
    to_grid,
)
from grpo_core.loss.logprobs import completion_logprobs, decoder_counts, reference_logprobs
from grpo_core.loss.losses import (
    Normaliser,
    high_entropy_mask,
    kl_penalty,
    objective_loss,
    truncated_is_weights,
)
from grpo_core.loss.packing import padded_counts
from grpo_core.observe.evaluate import evaluate_configured
from grpo_core.observe.metrics import peak_memory_mb, rollout_metrics, update_metrics, write_samples
from grpo_core.reward.call import Scored, score_rollout, with_overlong
from grpo_core.rollout import Rollout
from grpo_core.run import Run
from grpo_core.store.models import save_model


def step_seed(seed: int, step: int) -> int:
    """The sampling seed of a step: every step draws fresh, reproducible noise."""
    return (seed * 1_000_003 + step * 7919) & 0xFFFFFFFF


def _warn(run: Run, step: int, message: str) -> None:
    if run.main:
        print(f"\nwarning (step {step}): {message}", file=sys.stderr)


@dataclass
class Sampled:
    """Phase 1: this rank's prompts and G completions of each (with an environment: G
    episodes, and their transcripts)."""

    batch: Batch
    rollout: Rollout
    seconds: float
    transcripts: list[Transcript] | None = None
    greedy: Rollout | None = None  # ReMax: one greedy completion per prompt
    greedy_seconds: float = 0.0
    version: int | None = None  # generator process: the weights version that sampled it
    waited: float = 0.0  # generator process: how long the trainer waited for the rollout


def sample(run: Run, step: int) -> Sampled:
    if run.remote is not None:
        return _sample_remote(run, step)
    P, G = run.prompts, first_group_size(run.cfg)
    every = run.stream.take(run.config.train.prompts_per_step)
    return generate(
        run,
        step,
        every[run.rank * P : (run.rank + 1) * P],
        step_seed(run.config.train.seed, step),
        run.rank * P * G,
    )


def _sample_remote(run: Run, step: int) -> Sampled:
    """Phase 1 with generation in its own process: hand it the prompts of the steps up to
    ``step + k`` (in the data order; those not handed yet), then take step ``step``'s
    rollout."""
    remote, tc = run.remote, run.config.train
    for s in range(remote.next_step, min(step + remote.k, tc.steps - 1) + 1):
        rows = run.stream.take(tc.prompts_per_step)
        ids = make_batch(rows, run.cfg["data"], run.tokenizer).prompt_ids
        remote.submit(s, rows, ids, step_seed(tc.seed, s))
    got = remote.receive(step)
    batch = make_batch(got.rows, run.cfg["data"], run.tokenizer)
    return Sampled(
        batch, got.rollout.to(run.device), got.seconds, version=got.version, waited=got.waited
    )


def generate(run: Run, step: int, rows: list[dict], seed: int, offset: int) -> Sampled | None:
    """G completions of each of ``rows`` (this rank's prompts), completion ``offset + r`` drawing
    the noise of row id ``offset + r``. Every rank calls it together (sharded weights are
    gathered by all); a rank with no rows only takes part in that and returns None."""
    t0, G = time.time(), first_group_size(run.cfg)
    batch = make_batch(rows, run.cfg["data"], run.tokenizer) if rows else None
    with run.autocast, run.engine.gathered():
        if batch is None:
            return None
        if run.episodes is None:
            ro, transcripts = (
                run.generator.generate(
                    batch.prompt_ids, G, run.sampling, seed=seed, row_offset=offset
                ),
                None,
            )
        else:
            ro, transcripts = run.episodes.sample(batch, rows, G, run.sampling, seed, offset)
            if run.episodes.problem:
                _warn(
                    run,
                    step,
                    f"{run.episodes.problem}; applied environment.failure: "
                    f"{run.config.environment.failure}",
                )
        greedy, t1 = None, time.time()
        if run.baseline.needs_greedy:  # on the same gathered weights (sharded: one gathering)
            greedy = run.generator.generate(
                batch.prompt_ids, 1, replace(run.sampling, greedy=True)
            ).to(run.device)
    return Sampled(batch, ro.to(run.device), t1 - t0, transcripts, greedy, time.time() - t1)


@dataclass
class Judged:
    """Phase 2: the rollout with its task rewards (with any extra completions drawn for flat
    groups), which groups are flat, and the greedy completions' rewards (ReMax)."""

    rollout: Rollout
    scored: Scored
    flat: torch.Tensor  # [P] bool: the group's rewards are all equal
    greedy_rewards: torch.Tensor | None  # [P]
    extra_completions: int
    seconds: float
    greedy_seconds: float
    filler: torch.Tensor | None = None  # [P] bool: no signal, left out of the loss (dynamic)
    groups: dict | None = None  # dynamic sampling's counts (groups/filtered, ...)


def score(run: Run, step: int, sampled: Sampled) -> Judged:
    t0 = time.time()

    def judge(batch: Batch, ro: Rollout, transcripts: list | None = None) -> Scored:
        scored = score_rollout(
            run.reward,
            run.cfg["reward"],
            run.tokenizer,
            batch,
            ro,
            transcripts,
            (step, run.config.train.steps),
        )
        return with_overlong(scored, ro, run.config.reward.overlong, completion_budget(run.cfg)[1])

    ro, scored, extra = (
        sampled.rollout,
        judge(sampled.batch, sampled.rollout, sampled.transcripts),
        0,
    )
    if scored.problem:
        _warn(run, step, f"{scored.problem}; applied reward.failure: {run.config.reward.failure}")
    flat = group_std_zero(to_grid(scored.rewards, ro.group.cpu(), run.prompts)[0])
    n = run.config.groups.resample_zero_std_max
    # dynamic sampling: more completions for groups with no signal; the weights are gathered
    # by every rank together, so all enter when any rank has a flat group
    if n and dist.all_sum(flat.any().double().reshape(1)).item():
        with run.autocast, run.engine.gathered():
            if flat.any():
                ro, scored, extra = resample(
                    run.generator,
                    judge,
                    sampled.batch,
                    ro,
                    scored,
                    flat,
                    n,
                    run.sampling,
                    step_seed(run.config.train.seed, step),
                    run.rank * 1_000_000,
                )
        flat = group_std_zero(to_grid(scored.rewards, ro.group.cpu(), run.prompts)[0])
    if run.config.groups.adaptive_first:
        ro, scored, extra = _allocate(run, step, sampled.batch, ro, scored, judge)
        flat = group_std_zero(to_grid(scored.rewards, ro.group.cpu(), run.prompts)[0])
    t1 = time.time()
    greedy = None if sampled.greedy is None else judge(sampled.batch, sampled.greedy).rewards
    return Judged(
        ro,
        scored,
        flat,
        greedy,
        extra,
        t1 - t0,
        sampled.greedy_seconds + time.time() - t1 if greedy is not None else 0.0,
    )


def _allocate(
    run: Run, step: int, batch: Batch, ro: Rollout, scored: Scored, judge
) -> tuple[Rollout, Scored, int]:
    """Std-driven group sizes: the rest of the step's P x G completions (over all ranks)
    shared by the first samples' reward std (grpo_core.loss.groups.allocate), drawn and merged
    into this rank's groups. Every rank enters the gathering, with work or not."""
    grid = to_grid(scored.rewards, ro.group.cpu(), len(batch.prompts))[0]
    everyone, first = dist.gather_grid(grid)
    G, G0 = run.config.sampling.group_size, first_group_size(run.cfg)
    n = allocate(group_std(everyone), everyone.shape[0] * (G - G0))
    n = n[first : first + len(batch.prompts)]
    extra, seed = 0, step_seed(run.config.train.seed, step)
    with run.autocast, run.engine.gathered():
        for k, size in enumerate(sorted(set(n.tolist()) - {0})):
            ro, scored, added = resample(
                run.generator,
                judge,
                batch,
                ro,
                scored,
                n == size,
                size,
                run.sampling,
                seed ^ (k + 1),
                (run.rank * 64 + k) * 1_000_000,
            )
            extra += added
    return ro, scored, extra


@dataclass
class Advantages:
    """Phase 3: what the update needs beside the rollout."""

    old_logp: torch.Tensor  # [B, T] log-probs under the policy that sampled
    ref_logp: torch.Tensor | None  # [B, T] under the frozen reference
    is_weights: torch.Tensor | None  # [B, T] truncated importance weights (other sampler)
    rewards: torch.Tensor  # [B] what the baseline saw: task reward, minus KL if so placed
    advantages: torch.Tensor  # [B]; [B, T] from a baseline with a critic (PPO)
    keep: torch.Tensor  # [B] bool: in the loss (reward present, group not dropped)
    seconds: float
    returns: torch.Tensor | None = None  # [B, T] the critic's targets (PPO)
    values: torch.Tensor | None = None  # [B, T] the critic's values at sampling time


def _chunk(run: Run) -> int | None:
    """LM-head rows per chunk for the policy; None: its own head module (grpo_core.engine.zero)."""
    return None if run.engine.head_module else run.config.runtime.logprob_chunk


def advantages(run: Run, judged: Judged) -> Advantages:
    t0, ro, config = time.time(), judged.rollout, run.config
    temp, chunk = config.sampling.temperature, _chunk(run)  # the reference computes as
    mask = ro.action_mask.float()  # the policy does: equal weights give equal log-probs
    ref_logp = (
        None
        if run.reference is None
        else reference_logprobs(
            run.reference, ro, temp, chunk, run.autocast, config.runtime.packing
        )
    )
    old_logp, is_weights, tis = ro.logprobs, None, config.objective.tis
    if run.generator.recompute_old_logprobs or tis:  # other numerics, or an older policy
        with torch.no_grad(), run.autocast:
            old_logp = completion_logprobs(
                run.policy, ro, temp, chunk, packing=config.runtime.packing
            )[0]
        cap, level = (tis["cap"], tis["level"]) if tis else (run.generator.tis_cap, "token")
        is_weights = truncated_is_weights(old_logp, ro.logprobs, mask, cap, level)
    rewards = judged.scored.rewards
    if ref_logp is not None and config.kl.placement == "reward":
        kl_seq = (kl_penalty(old_logp, ref_logp, "k1") * mask).sum(-1).cpu()
        rewards = rewards - run.kl.value * kl_seq
    group, critic = ro.group.cpu(), None
    keep = torch.isfinite(rewards)  # missing rewards leave the loss
    if config.groups.drop_zero_std:
        keep &= ~judged.flat[group]
    if judged.filler is not None:  # dynamic sampling ran out of rounds: groups with no signal
        keep &= ~judged.filler[group]
    if config.objective.mask_truncated_completions:  # cut by the budget: no loss on them
        keep &= ~ro.truncated.cpu()
    if run.baseline.needs_values:  # PPO: per-token advantages from the critic's values
        with run.autocast:
            adv, *critic = run.baseline.token_targets(
                ro, torch.nan_to_num(rewards, nan=0.0), mask * keep.to(mask.device)[:, None]
            )
    else:
        grid, slot = to_grid(rewards, group, run.prompts)
        everyone, first = dist.gather_grid(grid)  # the baseline sees the whole batch
        greedy = (
            None
            if judged.greedy_rewards is None
            else dist.gather_grid(judged.greedy_rewards.cpu()[:, None].double())[0][:, 0]
        )
        adv = run.baseline.advantages(everyone, greedy)[first : first + run.prompts][group, slot]
    return Advantages(
        old_logp,
        ref_logp,
        is_weights,
        rewards,
        torch.nan_to_num(adv, nan=0.0).to(run.device),
        keep.to(run.device),
        time.time() - t0,
        *(critic or ()),
    )


def _mini_batch(
    run: Run,
    ro: Rollout,
    targets: Advantages,
    loss_mask: torch.Tensor,
    batches: list[torch.Tensor],
    stats: dict[str, float],
    count: int,
) -> float:
    """One optimizer update's gradient: forward and backward of each micro-batch of one
    mini-batch, its loss normalised over the mini-batch (all ranks), so that summing the
    micro-batches gives the mini-batch's loss. Adds the loss terms (as a mean over the
    ``count`` mini-batches) and token sums to ``stats``; returns the loss."""
    config = run.config
    objective = config.objective
    rows = torch.cat(batches)
    norm = Normaliser(
        float(dist.all_sum(loss_mask[rows].sum().double()).clamp(min=1)),
        float(dist.all_sum(targets.keep[rows].sum().double()).clamp(min=1)),
        float(completion_budget(run.cfg)[1]),
    )
    kl_coef = run.kl.value if config.kl.placement == "loss" else 0.0
    aggregation = objective.aggregation or run.objective.aggregation
    run.engine.zero_grad()
    total = 0.0
    for i, mb in enumerate(batches):
        sub = ro.rows(mb)
        with run.autocast:
            logp, ent = completion_logprobs(
                run.policy,
                sub,
                config.sampling.temperature,
                _chunk(run),
                entropy=True,
                packing=config.runtime.packing,
            )
        term = run.objective(logp, targets.old_logp[mb], targets.advantages[mb], loss_mask[mb])
        loss, terms = objective_loss(
            term,
            loss_mask[mb],
            aggregation,
            norm,
            logp=logp,
            ref_logp=None if targets.ref_logp is None else targets.ref_logp[mb],
            kl_coef=kl_coef,
            kl_estimator=config.kl.estimator,
            entropy=ent,
            entropy_coef=objective.entropy_coef,
            is_weights=None if targets.is_weights is None else targets.is_weights[mb],
            policy_mask=high_entropy_mask(ent, loss_mask[mb], objective.top_entropy_quantile),
        )
        run.engine.backward(loss, last=i == len(batches) - 1)
        total += float(loss.detach())
        terms["positions"], terms["padding"] = _layout(run, sub)
        for k, v in terms.items():
            stats[k] = stats.get(k, 0.0) + (v / count if k.startswith("loss/") else v)
    return total


@dataclass
class Updated:
    """Phase 4: the loss terms and counts of each inner iteration (summed over micro-batches
    and ranks), the gradient norm, and how many updates were skipped."""

    iterations: list[dict[str, float]]
    grad_norm: float
    skipped: int
    seconds: float


def _layout(run: Run, sub: Rollout) -> tuple[int, int]:
    """(decoder positions, of which padding) of a micro-batch's policy pass as it ran."""
    if _chunk(run) is None:  # the model's own head module: each prompt repeated, padded
        return padded_counts(sub, shared=False)
    return decoder_counts(run.policy, sub, run.config.runtime.packing)


def update(run: Run, step: int, judged: Judged, targets: Advantages) -> Updated:
    """Phase 4: ``inner_iterations`` passes over the rollout, each ``mini_batches`` optimizer
    updates on runs of whole groups (micro-batches within), then the weights to the
    generator."""
    t0, ro, config = time.time(), judged.rollout, run.config
    loss_mask = ro.action_mask.float() * targets.keep[:, None]  # no loss on environment tokens
    iterations: list[dict[str, float]] = []
    grad_norm, skipped = 0.0, 0
    run.policy.train()
    minis = mini_batches(
        ro.group, run.prompts, config.train.mini_batches, config.train.micro_batch_groups
    )
    for _ in range(config.train.inner_iterations):
        stats: dict[str, float] = {}
        for batches in minis:
            total = _mini_batch(run, ro, targets, loss_mask, batches, stats, len(minis))
            norm_now, applied = run.engine.step(math.isfinite(total))
            if applied:
                grad_norm = norm_now
            else:  # NaN guard: this update was skipped
                skipped += 1
                _warn(run, step, "non-finite loss or gradient; update skipped")
        iterations.append(stats)
        if targets.returns is not None:  # PPO: the critic's update, its own optimizer
            with run.autocast:
                stats.update(
                    run.baseline.fit(ro, targets.returns, targets.values, loss_mask, sum(minis, []))
                )
    run.generator.sync_weights(run.policy)
    if run.remote is not None:  # the generator process samples from these k steps on
        run.remote.publish(run.policy, step + 1)
    run.nonfinite_run = run.nonfinite_run + 1 if skipped else 0
    if run.nonfinite_run >= config.train.max_nonfinite_steps:
        raise TrainingError(
            f"non-finite loss or gradient in {run.nonfinite_run} steps in a row "
            f"(step {step}); lower optimizer.lr or check the reward"
        )
    summed = dist.sum_named(
        {f"{n}|{k}": v for n, it in enumerate(iterations) for k, v in it.items()}, run.device
    )
    iterations = [{k: summed[f"{n}|{k}"] for k in it} for n, it in enumerate(iterations)]
    # the controller reads the KL of the policy that sampled: the first iteration's
    first = iterations[0]
    run.kl.update(
        first.get("kl", 0.0) / max(first["tokens"], 1.0),
        config.train.prompts_per_step * config.sampling.group_size,
    )
    return Updated(iterations, grad_norm, skipped, time.time() - t0)


def observe(
    run: Run,
    step: int,
    sampled: Sampled,
    judged: Judged,
    targets: Advantages,
    updated: Updated,
    started: float,
) -> dict:
    """Phase 5: the step's metrics record (written by rank 0), validation when due, health
    warnings, samples."""
    config, ro = run.config, judged.rollout
    record = {
        "step": step,
        **rollout_metrics(
            judged.scored.rewards,
            to_grid(judged.scored.rewards, ro.group.cpu(), run.prompts)[0],
            judged.flat,
            ro,
            judged.scored.dimensions,
            judged.extra_completions,
            config.health.solved_reward
            if config.health.solved_reward is not None
            else run.reward.max_value,
            run.device,
        ),
    }
    record.update(
        {
            **update_metrics(updated.iterations),
            "kl_coef": run.kl.value,
            "grad_norm": updated.grad_norm,
            "skipped_updates": updated.skipped,
            "lr": run.scheduler.get_last_lr()[0],
            "time/generate": sampled.seconds,
            "time/reward": judged.seconds,
            "time/greedy": judged.greedy_seconds,
            "time/reference": targets.seconds,
            "time/train": updated.seconds,
            "time/step": time.time() - started,
            "data/long_prompts": run.stream.long_prompts,
            **(judged.groups or {}),
            **_memory(run),
        }
    )
    run.tokens_seen += record["step_tokens"]
    record["tokens_seen"] = run.tokens_seen
    if sampled.version is not None:
        record.update(_async_metrics(step, sampled, targets))
    if sampled.transcripts is not None:
        record.update(episode_metrics(sampled.transcripts, run.episodes.seconds, run.device))
    if run.eval_rows is not None:
        ec = config.eval
        if (step + 1) % ec.every_n_steps == 0 or step + 1 == config.train.steps:
            _validate(run, step, record)
    if run.health:
        record["health"] = run.health.observe(record)
        for w in record["health"]:
            _warn(run, step, w)
    run.first, run.last = run.first or record, record
    run.steps_run += 1
    if run.main:
        run.metrics.write(record)
        if config.output.samples_every and step % config.output.samples_every == 0:
            run.metrics.log_samples(
                write_samples(
                    run.dir,
                    step,
                    sampled.batch,
                    ro,
                    judged.scored.dimensions,
                    judged.scored.extras,
                    targets.rewards,
                    _per_completion(targets.advantages, ro),
                    run.tokenizer,
                ),
                step,
            )
    return record


def _async_metrics(step: int, sampled: Sampled, targets: Advantages) -> dict:
    """Generation in its own process: how old the step's rollout is (updates between the
    weights that sampled it and those it trains), the version, the trainer's wait, and the
    mean truncated importance weight over completion tokens when TIS is on."""
    record = {
        "async/staleness": step - sampled.version,
        "async/version": sampled.version,
        "time/wait_rollout": sampled.waited,
    }
    if targets.is_weights is not None:
        mask = sampled.rollout.action_mask.to(targets.is_weights)
        record["async/tis_weight"] = float(
            (targets.is_weights * mask).sum() / mask.sum().clamp(min=1)
        )
    return record


def _per_completion(adv: torch.Tensor, ro: Rollout) -> torch.Tensor:
    """[B] advantages as they are, or [B, T] ones (a critic's) as each completion's mean."""
    if adv.dim() == 1:
        return adv
    mask = ro.action_mask.to(adv)
    return (adv * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def _memory(run: Run) -> dict:
    """Peak memory so far and its share of what the device has (health.memory_limit_mb, or
    the device's own)."""
    peak = dist.all_max(torch.tensor(peak_memory_mb(run.device)))
    limit = run.config.health.memory_limit_mb or run.memory_limit
    return {"peak_memory_mb": peak, "memory_frac": peak / limit if limit else math.nan}


def _validate(run: Run, step: int, record: dict) -> None:
    """Validation on held-out problems (rank 0, on weights every rank helped gather) into the
    same record; keeps the best model."""
    ec = run.config.eval
    better = 0.0
    with run.engine.gathered():
        if run.main:
            report, _ = evaluate_configured(  # as grpo eval evaluates a saved model
                run.policy,
                run.tokenizer,
                run.generator,
                run.eval_rows,
                run.cfg,
                run.reward,
                run.device,
                episodes=run.episodes,
            )
            record.update(
                {
                    f"eval/{k}": v
                    for k, v in report.items()
                    if isinstance(v, float) and k != "temperature"
                }
            )
            value = record.get(f"eval/{ec.keep_best}") if ec.keep_best else None
            if value is not None and (run.best is None or value > run.best):
                run.best, better = value, 1.0
    if dist.all_sum(torch.tensor([better])).item():  # every rank takes part in gathering
        whole = run.engine.full_state_dict()
        if run.main:
            best = os.path.join(run.dir, "best")
            save_model(run.policy, run.tokenizer, best, run.save_dtype, whole)
            with open(os.path.join(best, "best.json"), "w", encoding="utf-8") as f:
                json.dump({"step": step, ec.keep_best: run.best}, f)
    dist.barrier()
