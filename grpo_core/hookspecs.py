"""The whole plugin contract: the hooks a plugin module implements, and the base class each
kind of component derives from.

A plugin is a module (or object) with one or more of the hooks below, published under the
entry-point group ``grpo_core``. Each hook receives ``register`` and calls it once per
component it provides::

    register(name, factory, schema=None, description="")

``factory(**options)`` builds the component; ``options`` were validated against ``schema``
(a JSON Schema for an object) and have its defaults filled in. What ``factory`` returns must
be an instance of the kind's base class below (a reward may also be a plain function). The
base classes carry the declarations the trainer reads (what a component needs, what it has),
with defaults, so the trainer never has to guess by probing attributes; those it plans the run
by (``needs_greedy``, ``token_advantages``) it reads before the run builds the component, from
the registered class or else from what the factory builds (grpo_core.building.declared).

A plugin module may declare ``GRPO_CORE_API = (4,)``: the plugin-API versions it supports. A
plugin none of whose versions this grpo-core serves (:data:`grpo_core.registry.SERVED_APIS`)
is refused. API 3 added the ``callback`` kind; API 4 the ``critic`` kind, which took over
:class:`Baseline`'s critic mode (``needs_values``, ``attach``, ``token_targets``, ``fit``): a
plugin written for API 2 or 3 still loads unless it is such a baseline (docs/plugins.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    import torch

    from grpo_core.rollout import Rollout, SamplingParams
    from grpo_core.scores import Scores

PROJECT = "grpo_core"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def reward(register):
    """Register reward functions (:class:`Reward`)."""


@hookspec
def baseline(register):
    """Register advantage estimators (:class:`Baseline`)."""


@hookspec
def critic(register):
    """Register learned value functions (:class:`Critic`). API 4."""


@hookspec
def kl(register):
    """Register KL-coefficient controllers (:class:`KLController`)."""


@hookspec
def generator(register):
    """Register rollout backends (:class:`Generator`)."""


@hookspec
def objective(register):
    """Register policy objectives (:class:`Objective`)."""


@hookspec
def logger(register):
    """Register experiment trackers (:class:`Logger`)."""


@hookspec
def environment(register):
    """Register multi-turn environments and tools (:class:`Environment`)."""


@hookspec
def callback(register):
    """Register callbacks run at the loop's step boundaries (:class:`Callback`). API 3."""


KINDS = (
    "reward",
    "baseline",
    "critic",
    "kl",
    "generator",
    "objective",
    "environment",
    "logger",
    "callback",
)


class Component:
    """What the base class of every kind shares."""

    @classmethod
    def check_options(cls, options: dict) -> list[str]:
        """Problems with options that passed the schema but that it cannot express (a regex
        that will not compile, say), found without building the component: one short line
        each, starting with the option's path, reported with the config's other problems."""
        return []


class Reward(Component):
    """Scores completions: ``reward(prompts, completions, **columns)`` returns one float per
    completion, or a :class:`grpo_core.Scores` that also carries named dimensions and extras.

    ``columns`` are the dataset fields named in ``data.columns``, repeated per completion,
    plus ``completion_tokens`` (token count), ``completion_ids`` (token ids) and ``group_ids``
    (prompt index). ``nan`` marks a missing reward (left out of its group's statistics).
    """

    #: the best score a completion can get, when there is one; a group whose completions all
    #: reach it counts as solved (the health monitor then stops expecting a learning signal)
    max_value: float | None = None
    #: run in the trainer's process, never in a worker process of its own (a reward model that
    #: holds a model on the device); its time limit then cannot stop code holding the GIL
    inline: bool = False

    @classmethod
    def columns_for(cls, options: dict) -> tuple[str, ...]:
        """The dataset columns this reward reads with these options (``grpo validate`` checks
        that the data has them, before a model loads)."""
        return ()

    @classmethod
    def example_row(cls, options: dict) -> dict:
        """Realistic values (column -> one row's value) that ``grpo plugins check`` gives each
        sample completion in place of its made-up column value (the sample's answer, ``"5"``),
        for a reward whose columns that is not valid data for (``code``'s test cases). Empty
        by default: every declared column gets the made-up value."""
        return {}

    def __call__(
        self, prompts: list, completions: list[str], **columns: list
    ) -> list[float] | Scores:
        raise NotImplementedError

    def close(self) -> None:
        """Release what the reward holds (worker processes, connections) at the end of a run."""


class Baseline(Component):
    """Turns a ``[prompts, G]`` reward grid (``nan`` = missing) into advantages of the same
    shape: ``advantages(rewards, greedy_rewards)``."""

    #: the trainer generates and scores one greedy completion per prompt (ReMax) and passes
    #: their rewards, ``[prompts]``, as ``greedy_rewards``
    needs_greedy: bool = False

    def advantages(
        self, rewards: torch.Tensor, greedy_rewards: torch.Tensor | None = None
    ) -> torch.Tensor:
        raise NotImplementedError

    def state_dict(self) -> dict:
        """State that a checkpoint must keep (a running mean; tensors allowed); empty by
        default."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned."""


class Critic(Component):
    """A learned value function (PPO's critic), chosen by the config's ``critic`` section in
    place of a group baseline: the trainer calls :meth:`attach` once (before a checkpoint
    loads), :meth:`token_targets` each step and :meth:`fit` after each pass of the policy's
    update. The objective then gets ``[B, T]`` advantages (it must declare
    ``token_advantages``). Runs in one process without LoRA only."""

    def attach(self, policy: Any) -> None:
        """Build the critic from the policy."""
        raise NotImplementedError

    def token_targets(
        self, rollout: Rollout, rewards: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rewards ``[B]`` (task reward, minus KL if so placed; missing ones 0) ->
        (advantages, returns, values), each ``[B, T]``, 0 off ``mask`` ``[B, T]`` (the model's
        tokens of the completions in the loss)."""
        raise NotImplementedError

    def fit(
        self,
        rollout: Rollout,
        returns: torch.Tensor,
        values: torch.Tensor,
        mask: torch.Tensor,
        batches: list[torch.Tensor],
    ) -> dict[str, float]:
        """One update of the critic towards ``returns`` on the tokens in ``mask`` over the
        micro-batches ``batches`` (row indices); returns named numbers for the metrics
        (``critic/...``)."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        """What a checkpoint keeps: the critic's weights and optimizer (tensors allowed)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned."""


class KLController(Component):
    """The KL coefficient ``value``, moved by ``update(kl, n_samples)`` after each step."""

    value: float = 0.0

    def needs_reference(self) -> bool:
        """Whether the coefficient can be non-zero; if not, no reference model is loaded."""
        return True

    def update(self, kl: float, n_samples: int) -> None:
        """``kl``: the step's mean per-token KL; ``n_samples``: completions in the step."""

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = state["value"]


class Generator(Component):
    """Samples G completions per prompt: ``setup`` once, ``generate`` each step,
    ``sync_weights`` after each step's updates."""

    #: its sampling log-probs come from other numerics than the trainer's (another engine):
    #: the trainer recomputes them and weights the objective by min(pi_train / pi_gen, tis_cap)
    recompute_old_logprobs: bool = False
    tis_cap: float = 2.0

    def setup(self, model: Any, tokenizer: Any, device: torch.device) -> None:
        raise NotImplementedError

    def generate(
        self,
        prompt_ids: list[list[int]],
        n: int,
        sampling: SamplingParams,
        seed: int = 0,
        row_offset: int = 0,
    ) -> Rollout:
        """``n`` completions of each prompt; completion ``row_offset + p * n + j`` draws the
        noise of that row id, so a batch split across calls or ranks samples the same."""
        raise NotImplementedError

    def sync_weights(self, model: Any) -> None:
        """Make the next ``generate`` sample from ``model``'s current weights."""

    #: can sample environment episodes turn by turn (:meth:`start_episodes`)
    supports_episodes: bool = False

    def start_episodes(
        self,
        prompt_ids: list[list[int]],
        n: int,
        sampling: SamplingParams,
        seed: int = 0,
        row_offset: int = 0,
    ) -> TurnSampler:
        """``n`` trajectories of each prompt, to be sampled turn by turn: trajectory ``r`` is
        row ``row_offset + r`` (prompt ``r // n``) for the sampling noise, as in ``generate``;
        ``sampling.max_new_tokens`` does not apply (each turn has its own budget)."""
        raise NotImplementedError


@dataclass
class Turn:
    """One model turn of one trajectory: the sampled token ids, their log-probs under the
    sampling distribution, and why it ended: ``eos``, ``stop`` (a stop string) or ``length``
    (its token budget ran out)."""

    ids: list[int]
    logprobs: list[float]
    finish: str


class TurnSampler:
    """A generator's handle on a batch of trajectories sampled turn by turn (environment
    episodes); made by :meth:`Generator.start_episodes`, closed after the last turn."""

    def turn(
        self, rows: list[int], context: list[list[int]], budgets: list[int], stop: tuple[str, ...]
    ) -> list[Turn]:
        """Append ``context[i]`` (the environment's tokens; empty before the first turn) to
        trajectory ``rows[i]``, then sample one model turn for every row together: at most
        ``budgets[i]`` tokens, ending at an EOS token or once the turn's text contains one of
        ``stop``. Rows left out of ``rows`` are finished and never come back."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the trajectories hold (caches, an engine's memory)."""


@dataclass
class PolicyTerm:
    """An objective's output. ``loss``: the per-token policy loss ``[B, T]`` (before
    aggregation, any value on padding); ``counts``: named ``[B, T]`` indicators (1 where a
    clip bound was active, say), summed over valid tokens and logged as fractions."""

    loss: torch.Tensor
    counts: dict[str, torch.Tensor] = field(default_factory=dict)


class Objective(Component):
    """The policy-gradient term of the loss: ``objective(logp, old_logp, advantages, mask)``
    with ``logp``, ``old_logp``, ``mask`` ``[B, T]`` and ``advantages`` ``[B]`` (``[B, T]``
    from a critic, for an objective that declares ``token_advantages``). The trainer
    adds the KL and entropy terms and aggregates over tokens (``objective.aggregation``)."""

    #: how per-token losses become one number when the config does not say (``token_mean``,
    #: ``seq_mean_token_mean`` or ``seq_mean_token_sum_norm``; see grpo_core.loss.losses.aggregate)
    aggregation: str = "token_mean"
    #: takes per-token advantages ``[B, T]`` as well as ``[B]`` (from a critic)
    token_advantages: bool = False

    def __call__(
        self,
        logp: torch.Tensor,
        old_logp: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
    ) -> PolicyTerm:
        raise NotImplementedError


class Logger(Component):
    """An experiment tracker: each step's scalar metrics, and every ``output.samples_every``
    steps a table of sampled completions. ``metrics.jsonl`` is written by the core whatever
    the loggers are; a logger adds a destination. Only the main process calls it: ``start``
    once, ``log`` each step, ``log_samples`` when samples are due, ``close`` at the end."""

    #: the packages it imports (import names, which are also what ``pip install`` takes): a
    #: run that selects it without them stops before the model loads, naming them
    packages: tuple[str, ...] = ()

    def start(self, run_dir: str, run_id: str, config: dict, start_step: int) -> None:
        """``config``: the run's config as validated, null sampling settings filled from the
        model's generation_config (``${env:NAME}`` left unresolved, so no secret reaches a
        tracker). ``run_id`` stays the same when a run is resumed (then
        ``start_step`` > 0), so a tracker can continue the same run."""

    def log(self, metrics: dict[str, float], step: int) -> None:
        """One step's scalars, under the names ``output.metric_names`` chose."""
        raise NotImplementedError

    def log_samples(self, samples: list[dict], step: int) -> None:
        """Sampled completions, one flat dict each: ``group``, ``prompt``, ``completion``,
        ``reward``, ``advantage`` and ``reward/<dimension>`` per reward dimension."""

    def close(self) -> None:
        """Flush and finish, at the end of the run."""


class Callback(Component):
    """Code run at the loop's boundaries (TRL's ``TrainerCallback``): a notification, a
    custom early stop, an upload. Runs in the main process only, in the order the config's
    ``callbacks`` lists them: ``on_train_begin`` once, ``on_step_end`` after each step's
    metrics, ``on_save`` after each checkpoint, ``on_train_end`` with the summary. Added in
    plugin API 3."""

    def on_train_begin(self, run_dir: str, config: dict, start_step: int) -> None:
        """``config``: as a Logger's ``start`` gets it (``${env:NAME}`` unresolved);
        ``start_step`` > 0 on a resume."""

    def on_step_end(self, step: int, metrics: dict) -> bool | None:
        """``metrics``: the step's record as metrics.jsonl gets it (our names). Return True
        to end the run after this step: the final model and summary are written as after
        the last step."""
        return None

    def on_save(self, step: int, path: str) -> None:
        """A checkpoint of ``step`` steps done is complete at ``path``."""

    def on_train_end(self, summary: dict) -> None:
        """The run ended (every step, or a callback's stop): its summary.json content."""


@dataclass
class Observation:
    """What an environment answers to a model turn: ``text`` goes into the context (a tool's
    result, a game's reply) unless ``done`` ends the episode; ``tool_call`` / ``tool_error``
    count for the metrics and the trajectory rewards see; ``info`` is free-form."""

    text: str = ""
    done: bool = False
    tool_call: bool = False
    tool_error: bool = False
    info: dict = field(default_factory=dict)


class Environment(Component):
    """A multi-turn episode around the model: ``reset(row)`` starts one from a dataset row
    (whose prompt is the first message) and returns its state; ``step(state, text)`` gets the
    text of each model turn and returns the next :class:`Observation`. One instance serves
    every episode of a run, so per-episode data lives in the state, never on ``self``."""

    #: strings that end a model turn besides EOS (a tool call's closing tag)
    stop_strings: tuple[str, ...] = ()
    #: the chat role of observations (``tool`` falls back to ``user`` when the chat template
    #: has no tool role)
    role: str = "tool"
    #: written before and after an observation when there is no chat template
    delimiters: tuple[str, str] = ("", "")

    @classmethod
    def columns_for(cls, options: dict) -> tuple[str, ...]:
        """The dataset fields ``reset`` reads with these options (``grpo validate`` checks
        that the data has them)."""
        return ()

    @classmethod
    def example_row(cls, options: dict) -> dict:
        """A dataset row ``grpo plugins check`` starts its episodes from: the prompt and each
        declared column set to ``"5"`` unless the environment gives a realistic one."""
        return {"prompt": "What is 2+3?", **{c: "5" for c in cls.columns_for(options)}}

    def reset(self, row: dict) -> Any:
        raise NotImplementedError

    def step(self, state: Any, text: str) -> Observation:
        raise NotImplementedError

    def close(self) -> None:
        """Release what the environment holds at the end of a run."""


#: the base class a component of each kind must derive from
CONTRACTS: dict[str, type] = {
    "reward": Reward,
    "baseline": Baseline,
    "critic": Critic,
    "kl": KLController,
    "generator": Generator,
    "objective": Objective,
    "environment": Environment,
    "logger": Logger,
    "callback": Callback,
}
