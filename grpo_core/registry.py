"""Finding plugins by name: entry points in, a table of (kind, name) -> PluginInfo out."""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import pluggy

from grpo_core import hookspecs
from grpo_core.errors import PluginError

PLUGIN_API_VERSION = 4
#: the plugin-API versions this grpo-core serves: 3 added the callback kind to 2; 4 the
#: critic kind, which took over Baseline's critic mode (grpo_core.building refuses a baseline
#: that still declares it, naming the move)
SERVED_APIS = (2, 3, 4)
ENTRY_POINT_GROUP = "grpo_core"
BUILTIN_DISTRIBUTION = "grpo-core"
#: Comma-separated distribution names; when set, only these external plugins load.
ALLOW_ENV = "GRPO_CORE_PLUGINS"


#: kind -> a function that finds (and registers) a plugin by a name nothing registered, or
#: returns None; a PluginError says why a name cannot be resolved
RESOLVERS: dict[str, Callable[[str], PluginInfo | None]] = {}


@dataclass(frozen=True)
class PluginInfo:
    kind: str
    name: str
    factory: Callable[..., Any]
    schema: dict = field(default_factory=dict)
    description: str = ""
    distribution: str = ""
    version: str = ""
    installed: bool = False  # found through an installed distribution's entry point


def _normalise(dist: str) -> str:
    return dist.lower().replace("_", "-").replace(".", "-")


def _allowed(dist: str) -> bool:
    allow = os.environ.get(ALLOW_ENV)
    if _normalise(dist) == BUILTIN_DISTRIBUTION or allow is None:
        return True
    return _normalise(dist) in {_normalise(d) for d in allow.split(",") if d.strip()}


def _check_api(module: Any, dist: str) -> None:
    supported = getattr(module, "GRPO_CORE_API", None)
    if supported is None:
        return
    supported = tuple(supported) if isinstance(supported, (list, tuple, set)) else (supported,)
    if not set(supported) & set(SERVED_APIS):
        raise PluginError(
            f"plugin distribution {dist!r} supports grpo-core plugin API {list(supported)}, "
            f"but this grpo-core provides API {PLUGIN_API_VERSION} (and serves "
            f"{list(SERVED_APIS)})"
        )


class Registry:
    """All registered plugins, loaded once from the ``grpo_core`` entry-point group."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.plugins: dict[tuple[str, str], PluginInfo] = {}
        for ep in installed_entry_points():
            dist = ep.dist.name if ep.dist else "unknown"
            version = ep.dist.version if ep.dist else ""
            if not _allowed(dist):
                continue
            try:
                module = ep.load()
            except Exception as exc:  # a broken third-party plugin must be named
                raise PluginError(
                    f"plugin entry point {ep.name!r} of distribution {dist!r} failed to import: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            self.add(module, dist, version, plugin_name=f"{dist}:{ep.name}", installed=True)

    def add(
        self,
        module: Any,
        dist: str,
        version: str = "",
        plugin_name: str | None = None,
        installed: bool = False,
    ):
        """Register one plugin module (entry points call this; so may tests and notebooks)."""
        _check_api(module, dist)
        plugin_name = plugin_name or f"{dist}:{getattr(module, '__name__', id(module))}"
        if self.pm.is_registered(module) or self.pm.has_plugin(plugin_name):
            return
        self.pm.register(module, name=plugin_name)
        for kind in hookspecs.KINDS:
            for impl in getattr(self.pm.hook, kind).get_hookimpls():
                if impl.plugin_name == plugin_name:
                    impl.function(register=self._registrar(kind, dist, version, installed))

    def _registrar(self, kind: str, dist: str, version: str, installed: bool):
        def register(
            name: str,
            factory: Callable[..., Any],
            schema: dict | None = None,
            description: str = "",
        ) -> None:
            self.put(
                PluginInfo(
                    kind,
                    name,
                    factory,
                    schema or {"type": "object"},
                    description,
                    dist,
                    version,
                    installed,
                )
            )

        return register

    def put(self, info: PluginInfo, replace: bool = False) -> None:
        """Enter ``info`` in the table, the one way in (an entry point's ``register``, a plain
        function as a reward). A name another plugin holds is refused, naming both
        distributions, unless ``replace`` (the caller has checked what it replaces)."""
        old = self.plugins.get((info.kind, info.name))
        if old is not None and not replace:
            raise PluginError(
                f"{info.kind} plugin {info.name!r} is registered twice: by distribution "
                f"{old.distribution!r} and by distribution {info.distribution!r}; uninstall "
                f"one or exclude it with {ALLOW_ENV}"
            )
        self.plugins[(info.kind, info.name)] = info

    def get(self, kind: str, name: str) -> PluginInfo:
        if kind not in hookspecs.KINDS:
            raise PluginError(
                f"unknown plugin kind {kind!r}; expected one of {list(hookspecs.KINDS)}"
            )
        info = self.find(kind, name)
        if info is None:
            raise PluginError(unknown_name_message(kind, name, self.names(kind)))
        return info

    def find(self, kind: str, name: str) -> PluginInfo | None:
        """Plugin ``name`` of ``kind``, or None; a name no plugin registered goes to the
        kind's resolver, if any (grpo_core.reward.functions: a reward's ``module:function``)."""
        info = self.plugins.get((kind, name))
        if info is None and kind in RESOLVERS and isinstance(name, str):
            return RESOLVERS[kind](name)
        return info

    def names(self, kind: str) -> list[str]:
        return sorted(n for k, n in self.plugins if k == kind)

    def all(self) -> list[PluginInfo]:
        return sorted(self.plugins.values(), key=lambda p: (p.kind, p.name))


def installed_entry_points() -> list[metadata.EntryPoint]:
    """The ``grpo_core`` entry points of installed distributions only. ``python -m`` and
    scripts put the working directory first on ``sys.path``, so a ``*.dist-info`` lying there
    (downloaded, unpacked, planted) would otherwise register plugins that run on import."""
    here = os.path.realpath(os.getcwd())
    paths = [p for p in sys.path if p not in ("", ".") and os.path.realpath(p) != here]
    seen, found = set(), []
    for dist in metadata.distributions(path=paths):
        name = _normalise(dist.metadata["Name"] or "")
        if name in seen:  # the first on the path wins, as for imports
            continue
        seen.add(name)
        found += [ep for ep in dist.entry_points if ep.group == ENTRY_POINT_GROUP]
    return found


def unknown_name_message(kind: str, name: Any, installed: list[str]) -> str:
    close = difflib.get_close_matches(str(name), installed, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown {kind} plugin {name!r}; installed: {', '.join(installed) or 'none'}{hint}"


_registry: Registry | None = None


def registry() -> Registry:
    """The process-wide registry, built on first use."""
    global _registry
    if _registry is None:
        _registry = Registry()
    return _registry
