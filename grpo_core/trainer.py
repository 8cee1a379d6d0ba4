"""The GRPO training loop, top to bottom.

Each step: the sampler draws G completions for each of P prompts and scores them; the source
of targets turns the rewards into advantages (a group baseline, or a critic); then
``inner_iterations`` passes of optimizer updates on the objective plugin's policy term (plus
KL to a frozen reference and an entropy bonus), over mini-batches of whole groups; then
observe and save. The sampler and the source of targets are chosen once at start
(grpo_core.plan); what every step does is grpo_core.phases; the run's state is set up once
(grpo_core.run).
"""

from __future__ import annotations

import time

from grpo_core import phases, saving
from grpo_core.config.view import Config
from grpo_core.errors import TrainingError, out_of_memory
from grpo_core.interrupt import StopRequests
from grpo_core.run import finish, start

__all__ = ["train", "TrainingError"]


def train(
    cfg: dict, resume: str | bool | None = None, force: bool = False, overwrite: bool = False
) -> dict:
    """Run GRPO as configured; returns a summary. ``resume``: True (the newest checkpoint) or
    a checkpoint directory; ``overwrite``: replace an earlier run in ``output.dir``. SIGINT or
    SIGTERM stops it after the current step with a checkpoint (grpo_core.interrupt)."""
    run = start(cfg, resume, force, overwrite)
    with StopRequests() as stops, out_of_memory(_too_big(run.config)):
        for step in range(run.progress.start, run.config.train.steps):
            t0 = time.time()
            sampled, scored = run.sampler.next(run, step)  # 1-2. G completions each, rewards
            targets = run.targets.compute(run, scored)  # 3. reference, KL, baseline or critic
            updated = phases.update(run, step, scored, targets)  # 4. mu passes of the objective
            record = phases.observe(run, step, sampled, scored, targets, updated, t0)  # 5. metrics
            asked = run.callbacks.step_end(step, record, run.device)  # a callback's stop
            last = asked or step + 1 == run.config.train.steps
            signum = 0 if last else saving.stop_signal(run, stops.signum)
            # 6. a checkpoint every output.checkpoint_every steps, and on a signal
            saved = saving.save(run, step, now=bool(signum))
            if saved:
                run.callbacks.saved(step + 1, saved)
            if signum:
                raise saving.stopped(run, step, saved, signum)
            if asked:
                break
    summary = finish(run)
    run.callbacks.end(summary)
    return summary


def _too_big(config: Config) -> str:
    """What to say when a step runs out of memory: its size, and what makes it smaller."""
    s, t = config.sampling, config.train
    return (
        f"sampling.group_size: out of memory in a step of {t.prompts_per_step} prompts x "
        f"{s.group_size} completions of up to {s.max_new_tokens} new tokens; lower "
        f"sampling.group_size, train.prompts_per_step or sampling.max_new_tokens, or work on "
        f"fewer at once (sampling.generation_batch_size, train.micro_batch_groups)"
    )
