"""Which plugin a failure came from, and where in its code.

An exception raised inside a plugin (a user's reward function, a third-party baseline)
passes through the trainer, a composite plugin (``weighted``) and perhaps a worker process
before anyone reports it. :func:`describe` reads its traceback and names the innermost
plugin whose code it went through, that plugin's distribution and its ``file:line``, and
keeps the traceback from there inwards: what the plugin's author needs, without the
trainer's frames (``--debug`` shows them all). A worker process describes its own failures
(it has the frames) and sends the :class:`Fault` back.
"""

from __future__ import annotations

import inspect
import os
import sys
import traceback
from dataclasses import dataclass

from grpo_core.registry import BUILTIN_DISTRIBUTION, PluginInfo, registry


@dataclass(frozen=True)
class Fault:
    """A failure, described where it happened (picklable: it crosses processes)."""

    type_name: str
    message: str
    plugin: str = ""  # "reward 'digits'": the innermost plugin the traceback went through
    distribution: str = ""  # that plugin's distribution ("python function" for functions)
    location: str = ""  # file:line of the failing line in that plugin's code
    trace: str = ""  # the traceback from the plugin's frames inwards
    full: str = ""  # the whole traceback

    @property
    def third_party(self) -> bool:
        """The plugin is not one of grpo-core's own."""
        return bool(self.plugin) and self.distribution != BUILTIN_DISTRIBUTION

    def within(self, outer: str) -> str:
        """``Type: message`` and, when known, where: ``in reward 'x' (dist) at file:line``
        (``outer`` is the plugin the caller called; named only when it is not the culprit)."""
        text = f"{self.type_name}: {self.message[:300]}"
        if self.plugin and self.plugin != outer:
            text += f" in {self.plugin} (from {self.distribution})"
        return text + (f" at {self.location}" if self.location else "")


class PluginFailed(Exception):
    """A plugin failed in a worker process; ``fault`` says where."""

    def __init__(self, fault: Fault):
        super().__init__(f"{fault.type_name}: {fault.message}")
        self.fault = fault


def describe(exc: BaseException, calling: tuple[str, str] | None = None) -> Fault:
    """Describe ``exc`` from its traceback. ``calling`` (kind, name): the plugin the caller
    called, preferred when several plugins share the failing file."""
    if isinstance(exc, PluginFailed):
        return exc.fault
    frames = traceback.extract_tb(exc.__traceback__)
    full = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    base = {"type_name": type(exc).__name__, "message": str(exc), "full": full}
    found = _innermost_plugin(frames, calling)
    if found is None:
        return Fault(**base)
    index, info = found
    first = index
    while first > 0 and frames[first - 1].filename == frames[index].filename:
        first -= 1
    trace = (
        "Traceback (the plugin's frames):\n"
        + "".join(traceback.format_list(frames[first:]))
        + "".join(traceback.format_exception_only(type(exc), exc))
    )
    frame = frames[index]
    return Fault(
        **base,
        plugin=f"{info.kind} {info.name!r}",
        distribution=info.distribution,
        location=f"{frame.filename}:{frame.lineno}",
        trace=trace,
    )


def _innermost_plugin(
    frames: list, calling: tuple[str, str] | None
) -> tuple[int, PluginInfo] | None:
    """The innermost frame in a plugin's own code, and that plugin."""
    owners = _owners()
    for i in range(len(frames) - 1, -1, -1):
        infos = owners.get(os.path.realpath(frames[i].filename))
        if infos:
            preferred = [p for p in infos if calling and (p.kind, p.name) == calling]
            return i, (preferred or infos)[0]
    return None


def _owners() -> dict[str, list[PluginInfo]]:
    """Source file -> the plugins whose factory (or function) is defined in it."""
    owners: dict[str, list[PluginInfo]] = {}
    for info in registry().all():
        path = _source(info)
        if path:
            owners.setdefault(os.path.realpath(path), []).append(info)
    return owners


def _source(info: PluginInfo) -> str | None:
    """The file a plugin's code lives in: its function's, or its factory's module's."""
    target = getattr(info.factory, "fn", info.factory)  # a function plugin's own function
    code = getattr(inspect.unwrap(target), "__code__", None)
    if code is not None:
        return code.co_filename
    module = sys.modules.get(getattr(target, "__module__", "") or "")
    return getattr(module, "__file__", None)
