"""grpo-core: critic-free RL for language models, every part a plugin chosen by name.

Public API: :func:`train` runs training from Python (a config, plain reward functions, an
in-memory data set); :func:`create` builds a plugin by kind and name; :class:`Scores` is
what a reward may return; :func:`from_trl` reads a flat TRL-style config;
:data:`PLUGIN_API_VERSION` is the plugin contract's version.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from grpo_core.errors import ConfigError, PluginError, UserError
from grpo_core.hookspecs import Reward
from grpo_core.registry import PLUGIN_API_VERSION, registry
from grpo_core.scores import Scores

__all__ = ["train", "from_trl", "create", "Scores", "PLUGIN_API_VERSION", "UserError",
           "ConfigError", "PluginError", "registry"]
__version__ = "0.1.0"


def train(config: Any, rewards: Any = None, dataset: Any = None, **options: Any) -> dict:
    """Run training as ``grpo train`` does; see :func:`grpo_core.api.train`."""
    from grpo_core.api import train as run

    return run(config, rewards, dataset, **options)


def from_trl(flat: dict) -> dict:
    """A config from TRL's flat ``GRPOConfig`` names; see :func:`grpo_core.trl_names.from_trl`."""
    from grpo_core.trl_names import from_trl as convert

    return convert(flat)


class FunctionReward(Reward):
    """A plain function registered as a reward: no declared columns, no known maximum."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn

    def __call__(self, prompts, completions, **columns):
        return self.fn(prompts, completions, **columns)


def create(kind: str, name: str, options: dict | None = None) -> Any:
    """Build plugin ``name`` of ``kind`` with ``options`` validated against its schema."""
    from grpo_core.config import validate_options

    info = registry().get(kind, name)
    opts = validate_options(info.schema, options, f"{kind}.{name}.options")
    try:
        component = info.factory(**opts)
    except UserError:
        raise
    except (TypeError, ValueError) as exc:
        raise PluginError(f"{kind} plugin {name!r} (from {info.distribution}) could not be "
                          f"built: {exc}") from exc
    return _checked(kind, name, info.distribution, component)


def _checked(kind: str, name: str, distribution: str, component: Any) -> Any:
    """The component, if it honours its kind's contract (a plain function becomes a reward)."""
    from grpo_core.hookspecs import CONTRACTS

    base = CONTRACTS[kind]
    if isinstance(component, base):
        return component
    if kind == "reward" and callable(component) and not isinstance(component, type):
        return FunctionReward(component)
    raise PluginError(f"{kind} plugin {name!r} (from {distribution}) built a "
                      f"{type(component).__name__}, which does not derive from "
                      f"grpo_core.hookspecs.{base.__name__} (plugin API {PLUGIN_API_VERSION}; "
                      f"see docs/plugins.md)")
