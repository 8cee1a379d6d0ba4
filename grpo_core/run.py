"""A training run's state, built once before the loop (:func:`start`) and summed up after
it (:func:`finish`): models, plugins, data, optimizer, the strategies the plan chose, and the
run's :class:`~grpo_core.progress.Progress`."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from grpo_core import plan as plans
from grpo_core import saving
from grpo_core.building import create
from grpo_core.config.file import unresolved
from grpo_core.config.redact import redact
from grpo_core.config.view import Config, DataSection, view
from grpo_core.data.prompts import (
    PromptStream,
    StreamedPrompts,
    check_fields,
    column_map,
    column_problems,
    fit_prompt,
    fit_prompts,
)
from grpo_core.data.sources import Source, open_stream, read_rows
from grpo_core.engine import dist, parallel, schedules
from grpo_core.engine.update import TorchUpdate, build_optimizer
from grpo_core.engine.zero import DeepSpeedUpdate, deepspeed_config
from grpo_core.env.episodes import EpisodeRunner
from grpo_core.env.episodes import problems as episode_problems
from grpo_core.errors import UserError
from grpo_core.hookspecs import Generator, KLController, Objective, Reward
from grpo_core.log import log
from grpo_core.loss.losses import KL_PLACEMENTS, KlPlacement
from grpo_core.model.casts import stored_as_computed
from grpo_core.observe import tracking
from grpo_core.observe.callbacks import Callbacks
from grpo_core.observe.evaluate import held_out_rows
from grpo_core.observe.health import HealthMonitor
from grpo_core.observe.metrics import (
    MetricsWriter,
    memory_limit_mb,
    peak_memory_mb,
    strict_json,
    truncate_step_files,
)
from grpo_core.observe.pitfalls import run_settings
from grpo_core.progress import Progress
from grpo_core.reward.isolation import build_reward
from grpo_core.rollout import SamplingParams
from grpo_core.samplers.draw import Completions, Episodes
from grpo_core.store import hub, rundir
from grpo_core.store.models import (
    context_length,
    is_peft,
    load_model,
    load_tokenizer,
    numerics,
    pick_device,
    resolve_sampling,
    save_model,
    saved_dtype,
)

if TYPE_CHECKING:
    from grpo_core.samplers import Sampler
    from grpo_core.targets import TargetSource


@dataclass(kw_only=True)
class Run:
    """Everything the phases of a step read; what changes from step to step is ``progress``."""

    config: Config  # the validated config, typed, sampling settings as resolved
    run_id: str  # this run's id (rundir marker); checkpoints carry it
    save_dtype: torch.dtype  # what checkpoints and the final model are written in
    rank: int
    world: int
    device: torch.device
    tokenizer: Any
    policy: Any
    reference: Any  # None when the KL coefficient can never be non-zero
    reward: Reward
    kl: KLController
    kl_placement: KlPlacement  # kl.placement
    generator: Generator
    objective: Objective
    draw: Completions  # what a rollout row is: a completion, or an episode
    targets: TargetSource  # phase 3: group baselines or a critic
    stream: PromptStream | StreamedPrompts  # the prompts, in order (data.streaming: read as needed)
    eval_rows: list[dict] | None
    optimizer: torch.optim.Optimizer
    scheduler: Any
    engine: TorchUpdate
    sampling: SamplingParams
    autocast: Any
    health: HealthMonitor | None
    callbacks: Callbacks  # the config's callback plugins (built on rank 0)
    memory_limit: float | None  # MiB: health.memory_limit_mb, else what the device has
    solved_reward: float | None  # a group that reached it is solved: health.solved_reward,
    # else the reward's max_value
    aggregation: str  # objective.aggregation, else the objective plugin's own
    weighting: tuple[float, str] | None  # truncated importance weights' (cap, level); None: off
    sampler: Sampler = field(init=False)  # phases 1-2, started last (see :func:`start`)
    metrics: MetricsWriter | None = None  # rank 0
    progress: Progress = field(default_factory=Progress)
    started: float = field(default_factory=time.time)

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def prompts(self) -> int:
        """Prompts this rank handles per step."""
        return self.config.train.prompts_per_step // self.world

    @property
    def dir(self) -> str:
        return self.config.output.dir

    def close(self) -> None:
        """Release what the run holds: reward workers, the environment, the generator
        process, the metrics file and trackers."""
        self.reward.close()
        self.draw.close()
        self.sampler.close()
        if self.metrics is not None:
            self.metrics.close()


def _plugin(kind: str, section: Any) -> Any:
    return create(kind, section.name, section.options)


def _rows(path: str, split: str, data: DataSection, key: str = "data.path") -> list[dict]:
    """A data set's rows, checked; the training set's source (same path) keeps its
    configuration name and data_files."""
    same = path == data.path
    rows = read_rows(
        path,
        split,
        data.name if same else None,
        data.data_files if same else None,
        key=key,
    )
    check_fields(rows, [data.prompt_field, *column_map(data)], path)
    return rows


def _stream(config: Config, tokenizer, limit: int, main: bool) -> PromptStream | StreamedPrompts:
    """The prompts in training order: held in memory and fitted to the prompt limit now, or
    (data.streaming) read, checked and fitted as they are needed."""
    dc, seed = config.data, config.train.seed
    if dc.streaming:
        ds = open_stream(
            Source(dc.path, dc.split, dc.name, dc.data_files),
            seed if dc.shuffle else None,
            dc.shuffle_buffer,
        )

        def epoch(e: int):
            ds.set_epoch(e)  # a seeded shuffle orders each epoch differently
            return ds

        return StreamedPrompts(
            epoch,
            lambda row, i: fit_prompt(row, i, tokenizer, dc, limit),
            [dc.prompt_field, *column_map(dc)],
            dc.path,
        )
    rows, long = fit_prompts(_rows(dc.path, dc.split, dc), tokenizer, dc, limit)
    if long and main:
        log.warning(
            "warning: %d of %d prompts are longer than %d tokens; data.long_prompts: %s",
            long,
            len(rows) + long,
            limit,
            dc.long_prompts,
        )
    return PromptStream(rows, seed, dc.shuffle, long)


def start(
    cfg: dict, resume: str | bool | None = None, force: bool = False, overwrite: bool = False
) -> Run:
    """Set up a run from a validated config: devices and processes, the plan (refused here
    when it has problems), the run directory (claimed: see rundir), models, plugins, data,
    the optimizer, a checkpoint's state when resuming (True: the newest intact one; or a
    directory), and last the sampler. ``overwrite`` empties an earlier run's directory."""
    config = view(cfg)
    device, rank, world, how, plan = _processes(config)
    run_id = _claim(cfg, config.output.dir, rank, resume, overwrite)
    tokenizer = load_tokenizer(config.model)
    policy = load_model(config.model, device)
    # null sampling settings take the model's generation_config values, before anything reads
    # them (the loss's temperature too); config.json keeps them as written
    config = dataclasses.replace(
        config, sampling=resolve_sampling(policy, config.sampling, rank == 0)
    )
    kl = _plugin("kl", config.kl)
    reference = _reference(kl, policy, config, device, how)
    if how in ("ddp", "fsdp"):  # the reference is spread the same way
        for model in {id(m): m for m in (policy, reference) if m is not None}.values():
            parallel.shard(model, how, config.distributed, device)
    # the trained parameters, taken now: a forward without gradients (a plugin's set-up) leaves
    # an FSDP2 unit holding gathered copies in their place until it shards again
    params = [p for p in policy.parameters() if p.requires_grad]
    generator = _plugin("generator", config.generator)
    optimizer = build_optimizer(params, config.optimizer, how)
    scheduler = schedules.build(optimizer, config.optimizer, schedules.total_updates(config.train))
    objective = _plugin("objective", config.objective)
    if is_peft(policy):  # a LoRA policy the config did not announce (an adapter checkpoint)
        _refuse(plans.make(config, world, how, lora=True).problems)
    reward = build_reward(config.reward)  # after the refusals: it may start worker processes
    run = Run(
        config=config,
        run_id=run_id,
        save_dtype=saved_dtype(config.model, config.output.save_dtype),
        rank=rank,
        world=world,
        device=device,
        tokenizer=tokenizer,
        policy=policy,
        reference=reference,
        reward=reward,
        kl=kl,
        kl_placement=KL_PLACEMENTS[config.kl.placement],
        generator=generator,
        objective=objective,
        draw=_draw(config, generator, tokenizer),
        targets=plan.targets.build(config, policy),  # a critic, before a checkpoint loads
        stream=_stream(config, tokenizer, _prompt_limit(config, policy), rank == 0),
        eval_rows=_eval_rows(config, tokenizer, policy),
        optimizer=optimizer,
        scheduler=scheduler,
        engine=_engine(config, policy, reference, params, optimizer, scheduler, world, how),
        sampling=SamplingParams.from_config(config.sampling),
        autocast=numerics(device, config.model.dtype),
        health=_health(config),
        memory_limit=config.health.memory_limit_mb or memory_limit_mb(device),
        solved_reward=_solved_reward(config, reward),
        aggregation=config.objective.aggregation or objective.aggregation,
        weighting=_weighting(config, generator),
        callbacks=Callbacks(config.callbacks, rank == 0),
    )
    inflight = saving.resume(run, resume, force) if resume else None
    generator.setup(policy, tokenizer, device)  # last: an engine starts from resumed weights
    run.sampler = plan.sampler.start(run, inflight)
    if run.main:
        if resume:  # drop what the steps that will be run again wrote
            truncate_step_files(run.dir, run.progress.start)
        run.metrics = MetricsWriter(
            run.dir,
            config.train.steps,
            config.output.progress,
            tracking.Trackers.start(config, run_id, run.progress.start),
        )
        run.callbacks.begin(run.dir, unresolved(config.as_dict()), run.progress.start)
    return run


def _health(config: Config) -> HealthMonitor | None:
    """The health monitor, told the run's settings that its advice names (None: off)."""
    if not config.health.enabled:
        return None
    return HealthMonitor(window=config.health.window, settings=run_settings(config))


def _solved_reward(config: Config, reward: Reward) -> float | None:
    """The reward at which a group counts as solved (None: the reward has no known maximum)."""
    solved = config.health.solved_reward
    return solved if solved is not None else reward.max_value


def _weighting(config: Config, generator: Generator) -> tuple[float, str] | None:
    """Truncated importance weights' (cap, level): ``objective.tis``'s, or the generator's
    cap per token where it samples with other numerics; None: no weights."""
    tis = config.objective.tis
    if tis:
        return tis.cap, tis.level
    return (generator.tis_cap, "token") if generator.recompute_old_logprobs else None


def _refuse(problems: list[str]) -> None:
    if problems:
        raise UserError(problems[0])


def _processes(config: Config) -> tuple[torch.device, int, int, str, plans.Plan]:
    """This process's device, rank and the number of processes (each rank its own GPU),
    how they share the model, and the run's plan; refuses what only those and the config
    can tell."""
    train, runtime = config.train, config.runtime
    if runtime.threads:
        torch.set_num_threads(runtime.threads)
    device, rank, world = dist.init(pick_device(runtime.device))
    torch.manual_seed(train.seed)
    if train.prompts_per_step % world:
        raise UserError(
            f"train.prompts_per_step: {train.prompts_per_step} is not divisible "
            f"by the {world} processes"
        )
    if world > 1 and (train.prompts_per_step // world) % train.mini_batches:
        raise UserError(
            f"train.mini_batches: {train.mini_batches} does not divide the "
            f"{train.prompts_per_step // world} prompts each of the {world} processes holds"
        )
    how = parallel.strategy(config, world)
    plan = plans.make(config, world, how)
    problems = column_problems(config.data) + tracking.problems(config.output)
    _refuse(problems + hub.problems(config.output) + episode_problems(config) + plan.problems)
    return device, rank, world, how, plan


def _claim(cfg: dict, out: str, rank: int, resume: str | bool | None, overwrite: bool) -> str:
    """Claim the run directory ``out`` (rank 0, see rundir) and write the config as written
    there (``${env:NAME}``, never the value); returns the run's id on every rank."""
    run_id = (
        rundir.claim(out, bool(resume), overwrite, rundir.input_paths(cfg) if overwrite else [])
        if rank == 0
        else ""
    )
    dist.barrier()
    run_id = run_id or rundir.run_id(out)
    if rank == 0:
        with open(os.path.join(out, "config.json"), "w", encoding="utf-8") as f:
            json.dump(unresolved(cfg), f, indent=2)
    return run_id


def _reference(
    kl: KLController, policy: Any, config: Config, device: torch.device, how: str
) -> Any:
    """The frozen reference: none when the KL coefficient stays 0; with LoRA the base model
    (the policy with its adapter disabled, no second copy); else a copy of the policy, whose
    matrix weights, on one unsharded device under bf16 autocast, are stored in bf16
    (``stored_as_computed``: the same log-probs, half the bytes, no casts per forward)."""
    if not kl.needs_reference():
        return None
    if is_peft(policy):
        return policy
    where = "cpu" if config.model.reference_device == "cpu" else device
    reference = copy.deepcopy(policy).to(where).eval().requires_grad_(False)
    if how == "none" and where == device:
        stored_as_computed(reference, numerics(device, config.model.dtype))
    return reference


def _prompt_limit(config: Config, policy: Any) -> int:
    """The longest prompt in tokens: data.max_prompt_tokens, or the model's context minus the
    completion budget; a budget that leaves no room is refused."""
    budget_key, budget = config.completion_budget
    limit = config.data.max_prompt_tokens or (context_length(policy) or 10**9) - budget
    if limit < 1:
        raise UserError(
            f"{budget_key}: {budget} leaves no room for a prompt in the model's context"
        )
    return limit


def _eval_rows(config: Config, tokenizer, policy) -> list[dict] | None:
    """The held-out rows validation reads, as ``grpo eval`` reads them (None when validation
    is off)."""
    ec = config.eval
    if not (ec.data and ec.every_n_steps):
        return None
    return held_out_rows(config, tokenizer, policy)[0]


def _draw(config: Config, generator: Generator, tokenizer) -> Completions:
    """What a rollout row is: an episode when an environment is configured, else a
    completion."""
    if config.environment is None:
        return Completions(generator)
    env = _plugin("environment", config.environment)
    runner = EpisodeRunner(env, generator, tokenizer, config.environment, config.data)
    return Episodes(runner, config.environment.failure)


def _engine(
    config: Config, policy, reference, params, opt, sched, world: int, how: str
) -> TorchUpdate:
    """Plain torch (one process, or FSDP2 for ddp/fsdp), or a DeepSpeed engine."""
    tc, max_norm = config.train, config.optimizer.max_grad_norm
    if how != "deepspeed":
        return TorchUpdate(
            policy,
            params,
            opt,
            sched,
            max_norm,
            how == "fsdp" and config.distributed.reshard_after_forward,
        )
    per = tc.prompts_per_step // world // tc.mini_batches  # groups per update, here
    ds = deepspeed_config(config.deepspeed)
    assert ds is not None  # parallel.strategy: deepspeed only with a deepspeed section
    return DeepSpeedUpdate(
        policy,
        params,
        opt,
        sched,
        ds,
        -(-per // tc.micro_batch_groups),
        tc.micro_batch_groups * config.sampling.group_size,
        max_norm,
        None if config.model.reference_device == "cpu" else reference,
    )


def _held(run: Run) -> list[float]:
    """What this rank holds: parameter and optimizer-state elements, and its peak memory."""
    params, state = run.engine.held()
    return [float(params), float(state), peak_memory_mb(run.device)]


def finish(run: Run) -> dict:
    """Check the ranks agree, write the final model and the summary; returns the summary."""
    in_sync = dist.weights_in_sync(run.engine.parameter_sums())
    if not in_sync and run.main:
        log.warning("\nwarning: ranks ended with different weights")
    last, oc = run.progress.last or {}, run.config.output
    summary = {
        "run_dir": run.dir,
        "steps": run.progress.step,  # the whole run's, a resumed one's too
        "steps_this_process": run.progress.steps_run,
        "seconds": time.time() - run.started,
        "world_size": run.world,
        "ranks_in_sync": in_sync,
        "first_reward": run.progress.first_reward,
        "final_reward": last.get("reward"),
        "reference_model": run.reference is not None,
        "peak_memory_mb": peak_memory_mb(run.device),
        "per_rank": [
            dict(zip(("parameters", "optimizer_state", "peak_memory_mb"), r))
            for r in dist.gather_numbers(_held(run))
        ],
        "long_prompts": run.stream.long_prompts,
        "filler_groups": run.progress.filler_groups,
        "health": run.health.summary() if run.health else [],
    }
    # every rank takes part in gathering a sharded model; rank 0 holds it
    whole = run.engine.full_state_dict() if oc.save_model else None
    if run.main and oc.save_model:
        final = os.path.join(run.dir, "final")
        save_model(run.policy, run.tokenizer, final, run.save_dtype, whole)  # LoRA: adapter
        lora = run.config.model.lora
        if is_peft(run.policy) and lora and lora.save_merged:
            save_model(
                run.policy.merge_and_unload(),
                run.tokenizer,
                os.path.join(final, "merged"),
                run.save_dtype,
            )
    run.close()
    if run.main:
        _write_summary(run.dir, summary)
        rundir.release(run.dir)
    dist.barrier()
    # last: a failed upload leaves the run complete (hub.problems: pushing needs an id)
    if run.main and oc.push_to_hub and oc.hub_model_id:
        summary["hub_commit"] = hub.push(
            os.path.join(run.dir, "final"),
            oc.hub_model_id,
            oc.hub_private,
            f"grpo-core run {run.run_id}: {run.progress.steps_run} steps",
        )
        _write_summary(run.dir, summary)
    return summary


def _write_summary(run_dir: str, summary: dict) -> None:
    with open(os.path.join(run_dir, "summary.json"), "w", encoding="utf-8") as f:
        f.write(redact(strict_json(summary, indent=2)))  # null where a value is NaN
