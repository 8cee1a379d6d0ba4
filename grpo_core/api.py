"""Training from Python: ``grpo_core.train(config, rewards=..., dataset=...)``.

The same run ``grpo train`` makes (the config validated, then checked against its files, data
and machine before a model loads), for callers who hold their pieces in memory: plain reward
functions (grpo_core.reward.functions) and a data set as a list of rows or a ``datasets.Dataset``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from grpo_core.config import trl_names
from grpo_core.config.file import apply_overrides, read_file
from grpo_core.errors import UserError
from grpo_core.reward import functions

Rewards = Callable[..., Any] | Iterable[Callable[..., Any]] | Mapping[str, Callable[..., Any]]


def train(
    config: Mapping | str | os.PathLike | Any,
    rewards: Rewards | None = None,
    dataset: Iterable[Mapping] | None = None,
    *,
    model: str | None = None,
    overrides: list[str] | None = None,
    resume: str | bool | None = None,
    overwrite: bool = False,
    force: bool = False,
    callbacks: Iterable[Any] | None = None,
) -> dict:
    """Validate, preflight and run a training run; returns its summary (as ``grpo train``
    prints it).

    ``config``: a mapping, a YAML or JSON file's path, a dataclass instance of the same
    shape, or TRL's ``GRPOConfig`` (the fields set away from TRL's defaults are mapped,
    refused or ignored as docs/trl.md lists). ``rewards``: plain functions called as TRL
    calls its reward functions (grpo_core.reward.functions), registered as reward plugins
    under their names (a mapping names them): usable by name in the config, also inside
    ``weighted``; a config without a ``reward`` section gets their sum (one ``weighted``
    component each, as TRL adds its reward functions, with ``reward_weights``). The run's
    config records each function by module path where it has one, so ``grpo train
    --resume`` finds it. ``dataset``: the prompts, rows of ``data.prompt_field`` plus the
    fields rewards read; without ``data.columns`` every other field common to all rows is
    passed to the rewards; written to a private temporary file, removed when the run ends.
    ``model``: a hub id or directory (TRL's ``GRPOTrainer(model=...)``). ``overrides`` are
    ``--set`` strings; ``resume``, ``overwrite`` and ``force`` as in ``grpo train``.
    ``callbacks``: :class:`grpo_core.hookspecs.Callback` objects (TRL's
    ``callbacks=[...]``), run after the config's own ``callbacks``."""
    from grpo_core import config as configs
    from grpo_core import preflight, trainer

    named = _named(rewards)
    refs = {name: functions.reference(fn) for name, fn in named.items()}
    for name, fn in named.items():
        functions.register(name, fn)
        functions.register(refs[name], fn)
    raw = _as_mapping(config, list(named))
    if model is not None:
        raw["model"] = {**(raw.get("model") or {}), "name_or_path": _model_name(model)}
    if "reward" not in raw and named:
        raw["reward"] = _sum_of(list(named))
    if "reward" in raw:
        raw["reward"] = _by_reference(raw["reward"], refs)
    if callbacks is not None:
        raw["callbacks"] = [*(raw.get("callbacks") or []), *_callbacks(callbacks)]
    with tempfile.TemporaryDirectory(prefix="grpo-core-data-") as private:
        if dataset is not None:  # mkdtemp: 0700, a fresh name; removed however the run ends
            raw["data"] = _in_memory(raw.get("data") or {}, dataset, private)
        cfg = configs.validate(
            apply_overrides(configs.migrate(raw), overrides or [], configs.moved_path)
        )
        preflight.check(cfg)
        return trainer.train(cfg, resume=resume, force=force, overwrite=overwrite)


def _as_mapping(config: Any, rewards: list[str]) -> dict:
    """The config as a fresh dict, whatever form it came in (TRL's GRPOConfig through
    :func:`grpo_core.config.trl_names.from_trl`, with the reward functions' names)."""
    if isinstance(config, (str, os.PathLike)):
        return read_file(os.fspath(config))
    if type(config).__module__.split(".")[0] == "trl":
        return trl_names.from_trl(config, rewards)
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    if isinstance(config, Mapping):
        return copy.deepcopy(dict(config))
    raise UserError(
        f"config: expected a mapping, a file path or a dataclass, found {type(config).__name__}"
    )


def _named(rewards: Rewards | None) -> dict[str, Callable[..., Any]]:
    """Reward functions by name: a mapping's keys, else each function's ``__name__``."""
    if rewards is None:
        return {}
    if isinstance(rewards, Mapping):
        return dict(rewards)
    fns = [rewards] if callable(rewards) else list(rewards)
    named: dict[str, Callable[..., Any]] = {}
    for i, fn in enumerate(fns):
        if not callable(fn):
            raise UserError(
                f"rewards[{i}]: found {type(fn).__name__} {fn!r:.40}, expected a function "
                f"(prompts, completions, **columns) -> list of floats"
            )
        name = getattr(fn, "__name__", None)
        if not name or name == "<lambda>":
            raise UserError(
                "rewards: a function without a name (a lambda); pass rewards={'name': fn}"
            )
        if name in named:
            raise UserError(
                f"rewards: two functions are named {name!r}; pass rewards={{'a': f, 'b': g}}"
            )
        named[name] = fn
    return named


def _model_name(model: Any) -> str:
    """TRL's ``model=``: a hub id or a directory; grpo-core loads the model itself."""
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model)
    raise UserError(
        f"model: expected a hub id or a model directory, found {type(model).__name__} (grpo-core "
        f"loads the model itself: save it with save_pretrained and pass the directory)"
    )


def _by_reference(section: Any, refs: dict[str, str]) -> Any:
    """A reward section with each function's name replaced by its reference (what another
    process resolves), a ``weighted`` component keeping the name as its dimension (``as``)."""
    if isinstance(section, list):
        return [_by_reference(v, refs) for v in section]
    if not isinstance(section, dict):
        return section
    out = {k: _by_reference(v, refs) for k, v in section.items()}
    name = section.get("name")
    if isinstance(name, str) and name in refs:
        out["name"] = refs[name]
        if "weight" in section or "requires" in section:  # a weighted component
            out.setdefault("as", name)
    return out


def _callbacks(objects: Iterable[Any]) -> list[dict]:
    """Callback objects as config entries: each registered as a callback plugin named after
    its class (``Name``, then ``Name_2``, ...) that builds into the object itself; an earlier
    call's registration of that name is replaced, an installed plugin's name refused."""
    from grpo_core.hookspecs import Callback
    from grpo_core.registry import PluginInfo, registry

    plugins, refs = registry().plugins, []
    per_class: dict[str, int] = {}
    for i, obj in enumerate(objects):
        if not isinstance(obj, Callback):
            raise UserError(
                f"callbacks[{i}]: {type(obj).__name__} does not derive from "
                f"grpo_core.hookspecs.Callback"
            )
        seen = per_class[type(obj).__name__] = per_class.get(type(obj).__name__, 0) + 1
        name = type(obj).__name__ + (f"_{seen}" if seen > 1 else "")
        old = plugins.get(("callback", name))
        if old is not None and old.distribution != CALLBACKS_FROM:
            raise UserError(
                f"callbacks[{i}]: {name!r} is the name of a callback plugin from "
                f"{old.distribution}; rename the class"
            )
        plugins[("callback", name)] = PluginInfo(
            "callback", name, lambda obj=obj: obj, functions.NO_OPTIONS, "", CALLBACKS_FROM
        )
        refs.append({"name": name})
    return refs


#: the distribution name callback objects passed to train() are registered under
CALLBACKS_FROM = "python (grpo_core.train callbacks)"


def _sum_of(names: list[str]) -> dict:
    """One reward, or the unweighted sum of several (as TRL sums its reward functions)."""
    if len(names) == 1:
        return {"name": names[0]}
    return {
        "name": "weighted",
        "options": {"components": [{"name": n, "weight": 1.0, "as": n} for n in names]},
    }


#: the integers a dataset value may hold (what the data layer reads back: int64)
INT64 = 2**63


def _row(i: int, row: Any) -> dict:
    """One dataset row as a dict, refused in one line when it is not a mapping or holds an
    integer the data layer cannot read back (beyond int64)."""
    if not isinstance(row, Mapping):
        raise UserError(
            f"dataset[{i}]: found {type(row).__name__} {row!r:.40}, expected a mapping of "
            f"fields such as {{'prompt': ..., 'answer': ...}}"
        )
    for key, value in row.items():
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= INT64:
            raise UserError(
                f"dataset[{i}].{key}: an integer of {value.bit_length()} bits, beyond the 64 "
                f"the data layer reads; give it as text (a string)"
            )
    return dict(row)


def _in_memory(data_cfg: dict, dataset: Iterable[Mapping], folder: str) -> dict:
    """The ``data`` section reading ``dataset``: its rows written to a JSONL file in
    ``folder`` (a private temporary directory), readable by this user only (0600)."""
    rows = [_row(i, row) for i, row in enumerate(dataset)]
    if not rows:
        raise UserError("dataset: no rows")
    try:
        text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    except TypeError as exc:
        raise UserError(
            f"dataset: a value is not JSON data (text, numbers, lists, mappings): {exc}"
        ) from exc
    path = os.path.join(folder, "dataset.jsonl")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never one already there
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    data = {**data_cfg, "path": path}  # the data section as written, not yet validated
    if "columns" not in data:
        prompt = data.get("prompt_field", "prompt")
        common = set(rows[0]).intersection(*rows[1:])
        data["columns"] = [k for k in rows[0] if k in common and k != prompt]
    return data
