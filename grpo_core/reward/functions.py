"""Plain Python functions as reward plugins, without a package or an entry point.

Two ways in, both giving a reward plugin selectable by name (alone, or as a component of
``weighted``):

- :func:`register` (what ``grpo_core.train(rewards=...)`` calls, under the function's name
  and its :func:`reference`): a function object under a name. The reward's worker process
  (``reward.isolation: process``) gets it pickled, by value when it cannot be imported
  there (defined in a notebook, a script's ``__main__``); one that cannot be pickled at all
  runs in the trainer's process, with a notice.
- a reference written in the config as the plugin's name: ``package.module:function`` or
  ``path/to/file.py:function`` (relative to the working directory). Every process resolves
  it by itself, the worker included.

The function is called as TRL's GRPOTrainer calls its reward functions
(:class:`KeywordReward` lists the keywords; docs/trl.md the contract, tested against TRL)
and returns one float per completion, None where it does not apply. Attributes ``columns``
(dataset fields it reads) and ``max_value`` (its best score), when the function has them,
are its declarations.
:func:`reference` names a function so that another process (a resumed run) finds it.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import importlib.util
import inspect
import math
import os
import pickle
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import CodeType
from typing import Any

from grpo_core.errors import PluginError
from grpo_core.hookspecs import Reward
from grpo_core.registry import RESOLVERS, PluginInfo, registry
from grpo_core.scores import Scores

#: how a function plugin shows in messages and in ``grpo plugins``
DISTRIBUTION = "python function"
NO_OPTIONS = {"type": "object", "additionalProperties": False, "properties": {}}


class FunctionFactory:
    """Builds the reward of one plain function (picklable, so a worker can receive it)."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn

    def __getstate__(self) -> dict:
        code = getattr(inspect.unwrap(self.fn), "__code__", None)
        return {"fn": self.fn, "file": code.co_filename if code else None}

    def __setstate__(self, state: dict) -> None:
        """A function pickled by value (cloudpickle) comes back with its code's file name
        ``<dynamic-code>``: put its real file back, so that a failure's message and traceback
        name the file and line the function is written on."""
        self.fn = state["fn"]
        target = inspect.unwrap(self.fn)
        code = getattr(target, "__code__", None)
        if code is not None and state["file"] and code.co_filename != state["file"]:
            target.__code__ = _in_file(code, state["file"])

    def __call__(self) -> Reward:
        return KeywordReward(self.fn)

    def columns_for(self, options: dict) -> tuple[str, ...]:
        """The dataset fields the function declares it reads (its ``columns`` attribute)."""
        return tuple(getattr(self.fn, "columns", ()))


def _in_file(code: CodeType, file: str) -> CodeType:
    """``code`` and the code objects nested in it (lambdas, inner functions) as written in
    ``file``."""
    consts = tuple(_in_file(c, file) if isinstance(c, CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=file, co_consts=consts)


class KeywordReward(Reward):
    """A plain function as a reward, called as TRL's GRPOTrainer calls its reward functions
    (the contract in docs/trl.md): keywords ``prompts``, ``completions`` (message lists
    ``[{"role": "assistant", "content": ...}]`` when the prompts are conversations, else
    text), ``completion_ids`` (token ids), every dataset column passed, ``trainer_state``
    (``global_step``, ``max_steps``) during training, and ``log_extra`` / ``log_metric``,
    whose values come back as the score's extras and dimensions. An ``async def`` function
    is awaited (several in ``weighted`` run concurrently, one thread each). None or NaN for
    a completion means the function does not apply to it (TRL's meaning)."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn
        self.max_value = getattr(fn, "max_value", None)

    def __call__(self, prompts, completions, **columns):
        extras: dict[str, list] = {}
        metrics: dict[str, list[float]] = {}
        kwargs = dict(columns)
        state = kwargs.pop("trainer_state", None)
        if state is not None:
            kwargs["trainer_state"] = TrainerState(**state)
        kwargs["log_extra"] = lambda column, values: extras.setdefault(column, []).extend(values)
        kwargs["log_metric"] = lambda name, value: metrics.setdefault(name, []).append(value)
        out = self.fn(
            prompts=prompts, completions=as_trl_completions(prompts, completions), **kwargs
        )
        if inspect.isawaitable(out):
            out = _await(out)
        if isinstance(out, (str, bytes, dict, set)) or not hasattr(out, "__iter__"):
            return out  # the caller names the wrong type
        values = [None if _missing(v) else v for v in out]
        if not extras and not metrics:
            return values
        n = len(values)
        dims = {name: [sum(v) / len(v)] * n for name, v in metrics.items()}
        return Scores(values, dimensions=dims, extras=extras)


@dataclass(frozen=True)
class TrainerState:
    """What a reward function sees of the run's progress (TRL's ``trainer_state`` fields of
    the same names): ``global_step`` counts the steps done before this rollout (TRL counts
    optimizer updates: the same with one update per step), ``max_steps`` is train.steps."""

    global_step: int
    max_steps: int | None = None


def is_conversational(prompt: Any) -> bool:
    """A prompt given as chat messages (TRL's test: a list of dicts with a role)."""
    return (
        isinstance(prompt, list)
        and bool(prompt)
        and isinstance(prompt[0], dict)
        and "role" in prompt[0]
    )


def as_trl_completions(prompts: list, completions: list) -> list:
    """Completions as TRL hands them: one assistant message each when the prompts are
    conversations, else the text itself."""
    if prompts and is_conversational(prompts[0]):
        return [[{"role": "assistant", "content": c}] for c in completions]
    return list(completions)


def _missing(value: Any) -> bool:
    """None or NaN: the function does not score this completion."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def _await(awaitable: Any) -> Any:
    """The result of an awaitable, in an event loop of this thread's own (a thread already
    running one hands it to a fresh thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_wrap(awaitable))
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, _wrap(awaitable)).result()


async def _wrap(awaitable: Any) -> Any:
    return await awaitable


def declared_columns(factory: Any, options: dict) -> tuple[str, ...]:
    """The dataset columns a reward factory declares it reads with ``options`` (a Reward
    class's ``columns_for``, or a function's ``columns`` attribute)."""
    if isinstance(factory, FunctionFactory) or (
        isinstance(factory, type) and issubclass(factory, Reward)
    ):
        return tuple(factory.columns_for(options))
    return ()


def where(fn: Callable[..., Any]) -> str:
    """``file:line`` of a function's definition (for messages)."""
    code = getattr(inspect.unwrap(fn), "__code__", None)
    return f"{code.co_filename}:{code.co_firstlineno}" if code else repr(fn)


def register(name: str, fn: Callable[..., Any]) -> None:
    """Register ``fn`` as reward plugin ``name``; a later call with the same name replaces
    it, but an installed plugin's name is refused."""
    if not callable(fn) or isinstance(fn, type):
        raise PluginError(f"rewards[{name!r}]: expected a function, found {type(fn).__name__}")
    old = registry().plugins.get(("reward", name))
    if old is not None and not isinstance(old.factory, FunctionFactory):
        raise PluginError(
            f"rewards[{name!r}]: the name of the reward plugin from "
            f"{old.distribution}; give the function another name"
        )
    doc = (inspect.getdoc(fn) or "").split("\n")[0]
    info = PluginInfo(
        "reward",
        name,
        FunctionFactory(fn),
        NO_OPTIONS,
        doc or f"function at {where(fn)}",
        DISTRIBUTION,
    )
    registry().put(info, replace=True)  # a function replaces a function


def is_reference(name: str) -> bool:
    """Whether a plugin name is a ``module:function`` or ``file.py:function`` reference."""
    target, sep, attr = name.rpartition(":")
    return bool(sep and target and attr.isidentifier())


#: the "module" of a reference to a function that only the process that registered it has
#: (defined in a script's __main__, a notebook or another function)
IN_PROCESS = "<python>"


def reference(fn: Callable[..., Any]) -> str:
    """The name under which another process finds ``fn`` (a resumed run's): ``package.module:
    function`` for a module of a package, ``/abs/path/module.py:function`` for a top-level
    module (found from any working directory), else ``<python>:name``, which only this process
    resolves (a function of ``__main__``, a notebook, or nested in another function)."""
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    qualname = getattr(fn, "__qualname__", "")
    if module is None or module.__name__ == "__main__" or getattr(module, qualname, None) is not fn:
        return f"{IN_PROCESS}:{getattr(fn, '__name__', 'function')}"
    path = getattr(module, "__file__", None)
    if "." in module.__name__ or not path:
        return f"{module.__name__}:{qualname}"
    return f"{os.path.abspath(path)}:{qualname}"


def resolve(name: str) -> PluginInfo:
    """Import the function a reference names and register it under the reference."""
    target, _, attr = name.rpartition(":")
    if target == IN_PROCESS:
        raise PluginError(
            f"reward {name!r}: a function passed to grpo_core.train() from a script's "
            f"__main__, a notebook or another function; only that Python process has it: "
            f"resume from Python (grpo_core.train(..., rewards=..., resume=True)) or move it "
            f"to a module"
        )
    module = _from_file(target, name) if target.endswith(".py") else _import(target, name)
    fn = getattr(module, attr, None)
    if fn is None or not callable(fn):
        raise PluginError(f"reward {name!r}: {target} has no function {attr!r}")
    info = PluginInfo(
        "reward",
        name,
        FunctionFactory(fn),
        NO_OPTIONS,
        f"function at {where(fn)}",
        f"{DISTRIBUTION} {target}",
    )
    registry().put(info)
    return info


def _resolve_reference(name: str) -> PluginInfo | None:
    """The registry's resolver for reward names: a reference, or None."""
    return resolve(name) if is_reference(name) else None


RESOLVERS["reward"] = _resolve_reference


def _import(module: str, name: str) -> Any:
    if module.startswith("."):
        raise PluginError(
            f"reward {name!r}: {module} is a relative module name; expected an absolute one "
            "(package.module:function) or a file (path/to/file.py:function)"
        )
    try:
        return importlib.import_module(module)
    except (Exception, SystemExit) as exc:  # its own code ran, and failed or exited
        raise PluginError(f"reward {name!r}: cannot import {module} ({_failure(exc)})") from exc


def _failure(exc: BaseException) -> str:
    """What went wrong while a reward's module ran at import, on one line."""
    if isinstance(exc, SystemExit):
        return f"it called sys.exit({exc.code!r}) while being imported"
    text = " ".join(str(exc).split())[:300]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _from_file(path: str, name: str) -> Any:
    """A module loaded from a file, kept in ``sys.modules`` under a name made from its
    absolute path (so pickling and tracebacks find it)."""
    full = os.path.abspath(path)
    if not os.path.isfile(full):
        raise PluginError(f"reward {name!r}: file not found: {path} (relative to {os.getcwd()})")
    key = "grpo_reward_" + hashlib.sha256(full.encode()).hexdigest()[:12]
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, full)
    if spec is None or spec.loader is None:
        raise PluginError(f"reward {name!r}: {path} cannot be imported as a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:  # its own code ran, and failed or exited
        del sys.modules[key]
        raise PluginError(f"reward {name!r}: importing {path} failed ({_failure(exc)})") from exc
    return module


def shipped(reward_cfg: dict) -> tuple[bytes | None, bool, str | None]:
    """What the configured reward's worker process needs that it cannot find by itself: the
    functions registered here that the reward uses (itself, or as a component), pickled.
    Second: whether the reward must run in the trainer's process instead (a plugin module
    added at run time, as before; or a function that cannot be pickled, which the third, a
    notice, then explains)."""
    fns = []
    for name in reward_names(reward_cfg):
        info = registry().plugins.get(("reward", name))
        if info is None or info.installed or _resolved(info):
            continue
        if not isinstance(info.factory, FunctionFactory):
            return None, True, None
        fns.append(info)
    if not fns:
        return None, False, None
    try:
        return _dumps(fns), False, None
    except Exception as exc:  # what pickle raises for a lock, a socket, a generator ...
        return None, True, f"function {fns[0].name!r} cannot be pickled: {type(exc).__name__}"


def _resolved(info: PluginInfo) -> bool:
    """A function found from a reference in the config (every process resolves it itself)."""
    return isinstance(info.factory, FunctionFactory) and info.distribution != DISTRIBUTION


def reward_names(value: Any) -> list[str]:
    """Every plugin name inside a reward section (its own, its components')."""
    if isinstance(value, dict):
        own = [value["name"]] if isinstance(value.get("name"), str) else []
        return own + [n for v in value.values() for n in reward_names(v)]
    if isinstance(value, list):
        return [n for v in value for n in reward_names(v)]
    return []


def _dumps(value: Any) -> bytes:
    """Pickle, by value where a reference would not resolve in another process (functions
    of ``__main__``, of a notebook, nested in a test)."""
    import cloudpickle

    return cloudpickle.dumps(value)


def receive(payload: bytes | None) -> None:
    """Worker side of :func:`shipped`: register what the trainer's process sent."""
    if payload:
        for info in pickle.loads(payload):
            registry().plugins.setdefault((info.kind, info.name), info)
