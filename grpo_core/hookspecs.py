"""The whole plugin contract.

A plugin is a module (or object) with one or more of the hooks below, published
under the entry-point group ``grpo_core``. Each hook receives ``register`` and calls
it once per component it provides::

    register(name, factory, schema=None, description="")

``factory(**options)`` builds the component; ``options`` were validated against
``schema`` (a JSON Schema for an object) and have its defaults filled in.

What each kind's component must provide:

reward
    ``reward(prompts, completions, **columns) -> list[float]``: one entry per
    completion; ``columns`` are dataset fields repeated per completion, plus
    ``completion_tokens`` (token count) and ``group_ids`` (prompt index). It may
    return a :class:`grpo_core.Scores` (a list) that also carries per-dimension
    scores and extra per-item fields for logging. ``float("nan")`` marks a missing
    reward (excluded from its group's statistics).
baseline
    ``advantages(rewards, greedy_rewards=None) -> Tensor``: ``rewards`` is
    ``[prompts, G]`` (NaN = missing), the result has the same shape. A baseline
    that sets ``needs_greedy = True`` gets ``greedy_rewards`` ``[prompts]``.
kl
    ``value`` (current coefficient), ``update(kl, n_samples)``, ``state_dict()``,
    ``load_state_dict(state)``; ``constant = True`` with value 0 means "no reference model".
generator
    ``setup(model, tokenizer, device)`` once, ``generate(prompt_ids, n, sampling, seed,
    row_offset) -> Rollout`` per step (see ``grpo_core.rollout``), ``sync_weights(model)``
    after the step's updates. ``recompute_old_logprobs = True`` (and ``tis_cap``) when its
    sampling log-probs come from other numerics than the trainer's.

A plugin module may declare ``GRPO_CORE_API = (1,)``: the plugin-API versions it
supports. A plugin whose set excludes :data:`grpo_core.PLUGIN_API_VERSION` is refused.
"""

from __future__ import annotations

import pluggy

PROJECT = "grpo_core"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def reward(register):
    """Register reward functions."""


@hookspec
def baseline(register):
    """Register advantage estimators."""


@hookspec
def kl(register):
    """Register KL-coefficient controllers."""


@hookspec
def generator(register):
    """Register rollout backends."""


KINDS = ("reward", "baseline", "kl", "generator")
