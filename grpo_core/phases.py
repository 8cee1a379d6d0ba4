"""The phases of one training step, in order: sample, score, targets, update, observe. What
varies between runs (how completions are drawn, where the targets come from) is a strategy
chosen once at start (grpo_core.samplers, grpo_core.targets, picked by grpo_core.plan); the
functions here are what every run does, each taking the :class:`~grpo_core.run.Run` and the
records of the phases before it (grpo_core.records), returning one of its own.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from grpo_core.data.prompts import Batch, make_batch
from grpo_core.engine import dist
from grpo_core.errors import TrainingError
from grpo_core.log import log
from grpo_core.loss.groups import mini_batches
from grpo_core.loss.losses import (
    Normaliser,
    high_entropy_mask,
    objective_loss,
    truncated_is_weights,
)
from grpo_core.model.casts import casts_kept
from grpo_core.model.logprobs import completion_logprobs, decoder_counts, reference_logprobs
from grpo_core.model.packing import padded_counts
from grpo_core.observe.evaluate import evaluate_configured
from grpo_core.observe.metrics import peak_memory_mb, rollout_metrics, update_metrics, write_samples
from grpo_core.records import Sampled, Scored, Targets, Updated
from grpo_core.reward.call import Rewards, score_rollout, with_overlong
from grpo_core.rollout import Rollout
from grpo_core.store.models import save_model

if TYPE_CHECKING:
    from grpo_core.run import Run


def step_seed(seed: int, step: int) -> int:
    """The sampling seed of a step: every step draws fresh, reproducible noise."""
    return (seed * 1_000_003 + step * 7919) & 0xFFFFFFFF


def warn(run: Run, step: int, message: str) -> None:
    """A warning line for the user (rank 0), through the ``grpo_core`` logger."""
    if run.main:
        log.warning("\nwarning (step %d): %s", step, message)


def generate(run: Run, step: int, rows: list[dict], seed: int, offset: int) -> Sampled | None:
    """Phase 1: G completions (or episodes) of each of ``rows`` (this rank's prompts),
    completion ``offset + r`` drawing the noise of row id ``offset + r``, and what the source
    of targets asks beside them (ReMax: a greedy completion each). Every rank calls it
    together (sharded weights are gathered by all); a rank with no rows only takes part in
    that and returns None."""
    t0 = time.time()
    batch = make_batch(rows, run.config.data, run.tokenizer) if rows else None
    with run.autocast, run.engine.gathered():
        if batch is None:
            return None
        ro, transcripts = run.draw.sample(
            batch, rows, run.config.first_group_size, run.sampling, seed, offset
        )
        if run.draw.problem:
            warn(run, step, run.draw.problem)
        t1 = time.time()
        greedy = run.targets.greedy(run, batch)  # on the same gathered weights
    return Sampled(
        batch=batch,
        rollout=ro.to(run.device),
        seconds=t1 - t0,
        transcripts=transcripts,
        greedy=greedy,
        greedy_seconds=time.time() - t1,
    )


def rewards(run: Run, batch: Batch, ro: Rollout, transcripts: list | None = None) -> Rewards:
    """The reward plugin's rewards of a rollout, with the overlong penalty when configured;
    plain functions see the step (TRL's ``trainer_state``)."""
    step = (run.progress.step, run.config.train.steps)
    got = score_rollout(run.reward, run.config.reward, run.tokenizer, batch, ro, transcripts, step)
    return with_overlong(got, ro, run.config.reward.overlong, run.config.completion_budget[1])


def _same(scored: Scored) -> Scored:
    return scored


def score(
    run: Run, step: int, sampled: Sampled, refine: Callable[[Scored], Scored] = _same
) -> Scored:
    """Phase 2: the rollout's rewards; ``refine`` (a sampler's) may then draw and score more
    completions for some groups; last, the greedy completions' rewards (ReMax). The first
    reward failure among them all is warned of once."""
    t0 = time.time()
    got = rewards(run, sampled.batch, sampled.rollout, sampled.transcripts)
    scored = Scored(
        rollout=sampled.rollout,
        rewards=got.rewards,
        dimensions=got.dimensions,
        extras=got.extras,
        problem=got.problem,
    )
    scored = refine(scored)
    t1 = time.time()
    greedy, seconds = run.targets.greedy_rewards(run, sampled)
    problem = scored.problem or (greedy.problem if greedy else None)
    if problem:
        warn(run, step, f"{problem}; applied reward.failure: {run.config.reward.failure}")
    return replace(
        scored,
        problem=problem,
        greedy_rewards=greedy.rewards if greedy else None,
        seconds=t1 - t0 - scored.extra_seconds,  # the extra completions' generation: its own
        greedy_seconds=seconds,
    )


def _chunk(run: Run) -> int | None:
    """LM-head rows per chunk for the policy; None: its own head module (grpo_core.engine.zero)."""
    return None if run.engine.head_module else run.config.runtime.logprob_chunk


def targets(
    run: Run,
    scored: Scored,
    advantages: Callable[[Run, Scored, torch.Tensor, torch.Tensor], dict],
) -> Targets:
    """Phase 3: log-probs under the policy that sampled and the reference, KL placed in the
    reward if so configured, which completions are in the loss, and the advantages the
    source of targets makes of the rewards (``advantages(run, scored, rewards, keep)``: a
    dict with ``advantages``, and a critic's ``returns`` and ``values``)."""
    t0, ro, config = time.time(), scored.rollout, run.config
    temp, chunk = run.sampling.temperature, _chunk(run)  # the reference computes as
    mask = ro.action_mask.float()  # the policy does: equal weights give equal log-probs
    ref_logp = (
        None
        if run.reference is None
        else reference_logprobs(
            run.reference, ro, temp, chunk, run.autocast, config.runtime.packing
        )
    )
    old_logp, is_weights = ro.logprobs, None
    if run.weighting:  # sampled with other numerics, or by an older policy
        with torch.no_grad(), run.autocast:
            old_logp = completion_logprobs(
                run.policy, ro, temp, chunk, packing=config.runtime.packing
            )[0]
        is_weights = truncated_is_weights(old_logp, ro.logprobs, mask, *run.weighting)
    rewards = run.kl_placement.rewards(scored.rewards, old_logp, ref_logp, mask, run.kl.value)
    group = ro.group.cpu()
    keep = torch.isfinite(rewards)  # a missing reward is out of the loss
    if scored.filler is not None:  # so are DAPO's filler groups
        keep &= ~scored.filler[group]
    keep &= ~(scored.flat[group] & config.groups.drop_zero_std)
    # cut by the budget: no loss on them when so configured
    keep &= ~(ro.truncated.cpu() & config.objective.mask_truncated_completions)
    found = advantages(run, scored, rewards, keep)
    return Targets(
        old_logp=old_logp,
        ref_logp=ref_logp,
        is_weights=is_weights,
        rewards=rewards,
        keep=keep.to(run.device),
        seconds=time.time() - t0,
        **{**found, "advantages": torch.nan_to_num(found["advantages"], nan=0.0).to(run.device)},
    )


def _mini_batch(
    run: Run,
    ro: Rollout,
    targets: Targets,
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
        float(run.config.completion_budget[1]),
    )
    kl_coef = run.kl_placement.loss_coef(run.kl.value)
    run.engine.zero_grad()
    total = 0.0
    for i, mb in enumerate(batches):
        sub = ro.rows(mb)
        with run.autocast:
            logp, ent = completion_logprobs(
                run.policy,
                sub,
                run.sampling.temperature,
                _chunk(run),
                entropy=True,
                packing=config.runtime.packing,
            )
        assert ent is not None  # asked for: entropy=True
        term = run.objective(logp, targets.old_logp[mb], targets.advantages[mb], loss_mask[mb])
        loss, terms = objective_loss(
            term,
            loss_mask[mb],
            run.aggregation,
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
            stats[k] = stats.get(k, 0.0) + (v / count if k.startswith(("loss/", "pull/")) else v)
    return total


def _layout(run: Run, sub: Rollout) -> tuple[int, int]:
    """(decoder positions, of which padding) of a micro-batch's policy pass as it ran."""
    if _chunk(run) is None:  # the model's own head module: each prompt repeated, padded
        return padded_counts(sub, shared=False)
    return decoder_counts(run.policy, sub, run.config.runtime.packing)


def update(run: Run, step: int, scored: Scored, targets: Targets) -> Updated:
    """Phase 4: ``inner_iterations`` passes over the rollout, each ``mini_batches`` optimizer
    updates on runs of whole groups (micro-batches within) and the source of targets' own
    update (a critic's), then the weights to the generator (and to the sampler: overlap)."""
    t0, ro, config = time.time(), scored.rollout, run.config
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
            with casts_kept(run.autocast, run.engine.sharded or run.engine.head_module):
                total = _mini_batch(run, ro, targets, loss_mask, batches, stats, len(minis))
            norm_now, applied = run.engine.step(math.isfinite(total))
            if applied:
                grad_norm = norm_now
            else:  # NaN guard: this update was skipped
                skipped += 1
                warn(run, step, "non-finite loss or gradient; update skipped")
        iterations.append(stats)
        stats.update(run.targets.fit(run, ro, targets, loss_mask, sum(minis, [])))
    run.generator.sync_weights(run.policy)
    run.sampler.published(run, step)
    in_a_row = run.progress.updated(skipped=bool(skipped))
    if in_a_row >= config.train.max_nonfinite_steps:
        raise TrainingError(
            f"non-finite loss or gradient in {in_a_row} steps in a row "
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
    return Updated(
        iterations=iterations, grad_norm=grad_norm, skipped=skipped, seconds=time.time() - t0
    )


def observe(
    run: Run,
    step: int,
    sampled: Sampled,
    scored: Scored,
    targets: Targets,
    updated: Updated,
    started: float,
) -> dict:
    """Phase 5: the step's metrics record, validation when due, health warnings; rank 0
    writes the record, and the samples every ``output.samples_every`` steps."""
    record = _record(run, step, sampled, scored, targets, updated, started)
    last = step + 1 == run.config.train.steps
    if run.eval_rows is not None and ((step + 1) % run.config.eval.every_n_steps == 0 or last):
        record.update(_validate(run, step, run.eval_rows))
    if run.health:
        record["health"] = run.health.observe(record)
        for w in record["health"]:
            warn(run, step, w)
    run.progress.observed(record)
    if run.metrics is not None:  # rank 0
        run.metrics.write(record)
        every = run.config.output.samples_every
        if every and step % every == 0:
            run.metrics.log_samples(_samples(run, step, sampled, scored, targets), step)
    return record


def _record(
    run: Run,
    step: int,
    sampled: Sampled,
    scored: Scored,
    targets: Targets,
    updated: Updated,
    started: float,
) -> dict:
    """What the step's records measure: the rollout, the updates, the time of each phase,
    memory, and the strategies' own metrics."""
    ro = scored.rollout
    record = {
        "step": step,
        **rollout_metrics(
            scored.rewards,
            scored.grid,
            scored.flat,
            ro,
            scored.dimensions,
            scored.extra_completions,
            run.solved_reward,
            run.device,
        ),
        **update_metrics(updated.iterations),
        "kl_coef": run.kl.value,
        "grad_norm": updated.grad_norm,
        "skipped_updates": updated.skipped,
        "lr": run.scheduler.get_last_lr()[0],
        "time/generate": sampled.seconds + scored.extra_seconds,
        "time/reward": scored.seconds,
        "time/greedy": scored.greedy_seconds,
        "time/reference": targets.seconds,
        "time/train": updated.seconds,
        "time/step": time.time() - started,
        "data/long_prompts": run.stream.long_prompts,
        **_memory(run),
    }
    record["tokens_seen"] = run.progress.saw(record["step_tokens"])
    record.update(run.sampler.metrics(step, sampled, targets))
    record.update(run.draw.metrics(sampled, run.device))
    return record


def _samples(run: Run, step: int, sampled: Sampled, scored: Scored, targets: Targets) -> list:
    """The step's first groups with their rewards and advantages, written to the run
    directory; returned for the trackers."""
    ro = scored.rollout
    return write_samples(
        run.dir,
        step,
        sampled.batch,
        ro,
        scored.dimensions,
        scored.extras,
        targets.rewards,
        targets.per_completion(ro),
        run.tokenizer,
    )


def _memory(run: Run) -> dict:
    """Peak memory so far and its share of what the device has (health.memory_limit_mb, or
    the device's own)."""
    peak, limit = dist.all_max(torch.tensor(peak_memory_mb(run.device))), run.memory_limit
    return {"peak_memory_mb": peak, "memory_frac": peak / limit if limit else math.nan}


def _validate(run: Run, step: int, rows: list[dict]) -> dict[str, float]:
    """Validation on held-out problems (rank 0, on weights every rank helped gather): its
    ``eval/*`` figures (none on other ranks); keeps the best model."""
    ec = run.config.eval
    better, figures = 0.0, {}
    with run.engine.gathered():
        if run.main:
            report, _ = evaluate_configured(  # as grpo eval evaluates a saved model
                run.policy,
                run.tokenizer,
                run.generator,
                rows,
                run.config,
                run.reward,
                run.device,
                episodes=run.draw.runner,
            )
            figures = {
                f"eval/{k}": v
                for k, v in report.items()
                if isinstance(v, float) and k != "temperature"
            }
            value = figures.get(f"eval/{ec.keep_best}") if ec.keep_best else None
            if value is not None and run.progress.improved(value):
                better = 1.0
    if dist.all_sum(torch.tensor([better])).item():  # every rank takes part in gathering
        whole = run.engine.full_state_dict()
        if run.main:
            best = os.path.join(run.dir, "best")
            save_model(run.policy, run.tokenizer, best, run.save_dtype, whole)
            with open(os.path.join(best, "best.json"), "w", encoding="utf-8") as f:
                json.dump({"step": step, ec.keep_best: run.progress.best}, f)
    dist.barrier()
    return figures
