"""grpo-core: RL for language models from group-sampled rewards, every part a plugin chosen by name.

Public API: :func:`train` runs training from Python (a config, plain reward functions, an
in-memory data set); :func:`create` builds a plugin by kind and name; :class:`Scores` is
what a reward may return; :func:`from_trl` reads TRL's GRPOConfig (or its names);
:data:`PLUGIN_API_VERSION` is the plugin contract's version.
"""

from __future__ import annotations

from typing import Any

from grpo_core.building import FunctionReward, create
from grpo_core.errors import ConfigError, PluginError, UserError
from grpo_core.registry import PLUGIN_API_VERSION, registry
from grpo_core.reward import functions  # noqa: F401  resolves reward names like file.py:function
from grpo_core.scores import Scores

__all__ = [
    "train",
    "from_trl",
    "create",
    "Scores",
    "PLUGIN_API_VERSION",
    "UserError",
    "ConfigError",
    "PluginError",
    "registry",
    "FunctionReward",
]
__version__ = "0.1.0"


def train(config: Any, rewards: Any = None, dataset: Any = None, **options: Any) -> dict:
    """Run training as ``grpo train`` does; see :func:`grpo_core.api.train`."""
    from grpo_core.api import train as run

    return run(config, rewards, dataset, **options)


def from_trl(args: Any, rewards: list[str] | None = None) -> dict:
    """A config from TRL's settings (a ``GRPOConfig`` or a flat mapping of its names); see
    :func:`grpo_core.config.trl_names.from_trl`."""
    from grpo_core.config.trl_names import from_trl as convert

    return convert(args, rewards)
