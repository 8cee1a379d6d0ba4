"""Building a plugin by kind and name, its options validated and its contract checked
(``grpo_core.create``; in a module of its own so that the core can build plugins without
importing the package's public face, which imports the API above the core)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from grpo_core.errors import PluginError, UserError
from grpo_core.hookspecs import Reward
from grpo_core.registry import PLUGIN_API_VERSION, registry


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
        raise PluginError(
            f"{kind} plugin {name!r} (from {info.distribution}) could not be built: {exc}"
        ) from exc
    return _checked(kind, name, info.distribution, component)


def declared(kind: str, name: str, options: dict | None, attr: str) -> Any:
    """Declaration ``attr`` of plugin ``name`` (``needs_greedy``, ``token_advantages``), read
    before the run builds it: from the registered class, or, where the factory is a function,
    from what it builds with these options (which also refuses one off the contract)."""
    from grpo_core.hookspecs import CONTRACTS

    factory = registry().get(kind, name).factory
    if isinstance(factory, type) and issubclass(factory, CONTRACTS[kind]):
        return getattr(factory, attr)
    return getattr(create(kind, name, options), attr)


def _checked(kind: str, name: str, distribution: str, component: Any) -> Any:
    """The component, if it honours its kind's contract (a plain function becomes a reward)."""
    from grpo_core.hookspecs import CONTRACTS

    base = CONTRACTS[kind]
    if kind == "baseline" and getattr(component, "needs_values", False):
        raise PluginError(
            f"baseline plugin {name!r} (from {distribution}) declares needs_values (a critic); "
            f"since plugin API 4 a critic is its own kind: register it with the critic hook, "
            f"derived from grpo_core.hookspecs.Critic, and name it in the config's critic "
            f"section (see docs/plugins.md)"
        )
    if isinstance(component, base):
        return component
    if kind == "reward" and callable(component) and not isinstance(component, type):
        return FunctionReward(component)
    raise PluginError(
        f"{kind} plugin {name!r} (from {distribution}) built a "
        f"{type(component).__name__}, which does not derive from "
        f"grpo_core.hookspecs.{base.__name__} (plugin API {PLUGIN_API_VERSION}; "
        f"see docs/plugins.md)"
    )
