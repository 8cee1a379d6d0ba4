"""Checks ``grpo validate`` (and ``grpo_core.train``, first) runs for what a TRL user's run
would otherwise trip on late: a reward function's parameter that no column feeds, a hub id
with no way to reach the hub, ``push_to_hub`` without a token, a group of one completion.
Each returns problem lines (one per problem, naming the setting); none loads a model."""

from __future__ import annotations

import inspect
import os
import socket
from urllib.parse import urlsplit

from grpo_core.config.view import Config, OutputSection
from grpo_core.data.prompts import column_map
from grpo_core.data.sources import looks_like_hub_id
from grpo_core.registry import registry
from grpo_core.reward import functions

#: keywords the trainer passes every reward function besides the dataset's columns
PASSED = (
    "prompts",
    "completions",
    "completion_ids",
    "completion_tokens",
    "group_ids",
    "trainer_state",
    "log_extra",
    "log_metric",
    "messages",
)

#: seconds the hub probe waits for a connection (a hang here would only delay the refusal)
PROBE_TIMEOUT = 3.0

#: baselines that compare a completion with the others of its group (none with one)
GROUP_BASELINES = ("grpo", "rloo", "dr_grpo", "batch_std", "reinforce_pp")


def problems(config: Config) -> list[str]:
    """Every problem of this module's checks, for ``preflight.check``."""
    return (
        reward_parameters(config)
        + group_of_one(config)
        + push_token(config.output)
        + unreachable_hub(config)
    )


def reward_parameters(config: Config) -> list[str]:
    """A plain reward function (alone or a ``weighted`` component) with a named parameter,
    without a default, that the trainer does not pass: a column missing from data.columns."""
    passed = set(PASSED) | set(column_map(config.data).values())
    found = []
    reward = {"name": config.reward.name, "options": config.reward.options}
    for name in dict.fromkeys(functions.reward_names(reward)):
        info = registry().plugins.get(("reward", name))
        if info is None or not isinstance(info.factory, functions.FunctionFactory):
            continue  # a plugin (its columns_for says what it reads), or not a reward name
        factory = info.factory
        missing = [p for p in required_parameters(factory.fn) if p not in passed]
        if missing:
            found.append(
                f"data.columns: reward {name!r} ({functions.where(factory.fn)}) reads "
                f"{missing}, which the run does not pass; add {missing[0]!r} to data.columns "
                f"(a dataset field of that name, or {{field: {missing[0]}}})"
            )
    return found


def required_parameters(fn) -> list[str]:
    """The parameters a call by keyword must fill: named, without a default."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or C function: nothing to read
        return []
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in params if p.kind in named and p.default is inspect.Parameter.empty]


def group_of_one(config: Config) -> list[str]:
    """``sampling.group_size: 1`` with a baseline that compares within the group: every
    advantage would be 0 (TRL refuses num_generations 1 too)."""
    name = config.baseline.name
    if config.sampling.group_size > 1 or name not in GROUP_BASELINES:
        return []
    return [
        f"sampling.group_size: 1 leaves baseline {name!r} nothing to "
        f"compare a completion with (every advantage 0); set 2 or more, or a baseline that "
        f"needs no group (remax, ppo)"
    ]


def push_token(output: OutputSection) -> list[str]:
    """``output.push_to_hub`` needs a token; found now, not after the run."""
    if not output.push_to_hub:
        return []
    from huggingface_hub import get_token

    if get_token():
        return []
    return [
        "output.push_to_hub: no Hugging Face token (set HF_TOKEN or run `hf auth login`); "
        "the upload at the end of the run would fail"
    ]


def unreachable_hub(config: Config) -> list[str]:
    """Hub ids of the ``org/name`` form (the model, the data) that are not in the local cache
    while the hub does not answer: said now, rather than after the download's retries. A
    bare ``name`` is left alone (a legacy id, or a builder such as ``json``); HF_HUB_OFFLINE
    is the preflight's own check."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return []
    wanted = []
    model = config.model.name_or_path
    if _hub_id(model) and not config.model.gguf_file:
        wanted.append(("model.name_or_path", model, "model"))
    data = config.data
    if _hub_id(data.path) and not data.data_files:
        wanted.append(("data.path", data.path, "dataset"))
    wanted = [w for w in wanted if not _cached(w[1], w[2])]
    if not wanted:
        return []
    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    why = _unreachable(endpoint)
    if why is None:
        return []
    return [
        f"{key}: {repo} is a hub id not in the local cache, and {endpoint} does not answer "
        f"({why}); download it where there is a network, or give a local path"
        for key, repo, _ in wanted
    ]


def _hub_id(path: str) -> bool:
    """``org/name`` that is not a local path."""
    return "/" in path and not os.path.exists(path) and looks_like_hub_id(path)


def _cached(repo: str, kind: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    probe = "config.json" if kind == "model" else "README.md"
    try:
        return isinstance(try_to_load_from_cache(repo, probe, repo_type=kind), str)
    except ValueError:  # not a valid repository id
        return False


def _unreachable(endpoint: str) -> str | None:
    """Why a TCP connection to the hub's host fails (None: it connects), within
    PROBE_TIMEOUT seconds."""
    url = urlsplit(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "", port), timeout=PROBE_TIMEOUT):
            return None
    except OSError as exc:
        return f"{type(exc).__name__}: {exc.strerror or exc}"
