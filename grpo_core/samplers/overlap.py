"""Overlap: generation in its own process, beside training, at most ``sampling.max_staleness``
steps behind (grpo_core.overlap; docs/async.md). The trainer hands the generator process
each step's prompts up to k steps ahead and takes the step's rollout when it is there."""

from __future__ import annotations

from typing import TYPE_CHECKING

from grpo_core import phases
from grpo_core.config.view import Config
from grpo_core.data.prompts import make_batch
from grpo_core.overlap import RemoteGenerator
from grpo_core.records import Sampled, Scored, Targets
from grpo_core.samplers import Sampler

if TYPE_CHECKING:
    from grpo_core.run import Run


class Overlap(Sampler):
    """Phase 1 in the generator process, phase 2 here."""

    def __init__(self, remote: RemoteGenerator):
        self.remote = remote

    @classmethod
    def chosen(cls, config: Config) -> bool:
        return config.generation_process

    @classmethod
    def refusals(
        cls, config: Config, world: int, how: str = "none", lora: bool = False
    ) -> list[str]:
        gc = config.groups
        why = "is not supported with asynchronous generation (sampling.generation: process)"
        refused = [
            (world > 1, f"several processes: {why}; run one process"),
            (config.generator.name != "hf", f"generator.name: {config.generator.name} {why}"),
            (bool(config.environment), f"environment: {why}"),
            (bool(config.model.lora), f"model.lora: {why}"),
            (bool(config.deepspeed), f"deepspeed: {why}"),
            (gc.dynamic_sampling, f"groups.dynamic_sampling: {why}"),
            (bool(gc.resample_zero_std_max), f"groups.resample_zero_std_max: {why}"),
            (gc.adaptive_first is not None, f"groups.adaptive_first: {why}"),
        ]
        return [line for bad, line in refused if bad]

    @classmethod
    def start(cls, run: Run, inflight: dict | None) -> Overlap:
        """Start the generator process, primed with a checkpoint's in-flight rollouts."""
        return cls(
            RemoteGenerator(run.config, run.sampling, run.policy, run.progress.start, inflight)
        )

    def next(self, run: Run, step: int) -> tuple[Sampled, Scored]:
        """Hand the generator process the prompts of the steps up to ``step + k`` (in the
        data order; those not handed yet), then take step ``step``'s rollout."""
        remote, tc = self.remote, run.config.train
        for s in range(remote.next_step, min(step + remote.k, tc.steps - 1) + 1):
            rows = run.stream.take(tc.prompts_per_step)
            ids = make_batch(rows, run.config.data, run.tokenizer).prompt_ids
            remote.submit(s, rows, ids, phases.step_seed(tc.seed, s))
        got = remote.receive(step)
        sampled = Sampled(
            batch=make_batch(got.rows, run.config.data, run.tokenizer),
            rollout=got.rollout.to(run.device),
            seconds=got.seconds,
            version=got.version,
            waited=got.waited,
        )
        return sampled, phases.score(run, step, sampled)

    def published(self, run: Run, step: int) -> None:
        """The generator process samples from these weights k steps on."""
        self.remote.publish(run.policy, step + 1)

    def metrics(self, step: int, sampled: Sampled, targets: Targets) -> dict:
        """How old the step's rollout is (updates between the weights that sampled it and
        those it trains), the version, the trainer's wait, and the mean truncated importance
        weight over completion tokens when TIS is on."""
        assert sampled.version is not None  # every rollout of the generator process has one
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

    def inflight(self, step: int) -> dict | None:
        return self.remote.inflight(step)

    def close(self) -> None:
        self.remote.close()
