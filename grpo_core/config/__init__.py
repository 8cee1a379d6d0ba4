"""One config file, validated at once: the core schema plus each selected plugin's schema.

A value whose schema carries ``"x-plugin": KIND`` is a plugin reference ``{name, options}``;
its options are checked against that plugin's own schema, and the walk continues into that
schema, so composite plugins (a weighted reward of rewards) are checked all the way down.
Keys that moved between sections (``MOVED`` below) are read at their old place too, with a
one-line notice naming the new place. ``${env:NAME}`` in a string is replaced by the
environment variable's value here, at load (see ``grpo_core.config.file.resolve_env``).

:func:`validate` returns the effective config as a dict (what a run writes to disk, with
``${env:NAME}`` put back); code past ``config/`` reads it only through the typed view,
:func:`grpo_core.config.view.view` (tests/unit/test_config_currency.py keeps it so), and a
single section through :func:`section`.
"""

from __future__ import annotations

import copy
import json
import sys
from typing import Any

import jsonschema

from grpo_core.config import trl_names
from grpo_core.config.file import Resolved, apply_overrides, read_file, resolve_env, yaml_words
from grpo_core.config.schema import CORE_SCHEMA
from grpo_core.config.view import build_section
from grpo_core.errors import ConfigError, PluginError
from grpo_core.hookspecs import Component
from grpo_core.registry import registry, unknown_name_message

#: keys that moved, old path -> new path; old configs still load, with a notice
MOVED: dict[str, str] = {
    **{
        f"train.{k}": f"optimizer.{k}"
        for k in ("lr", "weight_decay", "betas", "lr_schedule", "warmup_steps", "max_grad_norm")
    },
    "train.clip_low": "objective.options.clip_low",
    "train.clip_high": "objective.options.clip_high",
    "train.aggregation": "objective.aggregation",
    "train.entropy_coef": "objective.entropy_coef",
    "train.kl_estimator": "kl.estimator",
    "train.kl_placement": "kl.placement",
    "train.drop_zero_std_groups": "groups.drop_zero_std",
    "train.resample_zero_std_max": "groups.resample_zero_std_max",
    "train.reward_failure": "reward.failure",
    "train.reward_timeout": "reward.timeout",
    **{f"train.{k}": f"runtime.{k}" for k in ("device", "threads", "logprob_chunk")},
}

# JSON Schema counts 2.0 as an integer; a step count of 2.0 is more likely a mistake
_TYPES = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
    "integer", lambda _, v: isinstance(v, int) and not isinstance(v, bool)
)
Validator = jsonschema.validators.extend(jsonschema.Draft202012Validator, type_checker=_TYPES)

_noticed: set[str] = set()


def _notice(old: str, new: str) -> None:
    """Say once per process that ``old`` is deprecated in favour of ``new``."""
    if old not in _noticed:
        _noticed.add(old)
        print(f"notice: config key {old} is deprecated; use {new}", file=sys.stderr)


def moved_path(path: str) -> str:
    """The current place of a dotted key path (itself unless it moved; with a notice)."""
    for old, new in MOVED.items():
        if path == old or path.startswith(old + "."):
            _notice(old, new)
            return new + path[len(old) :]
    return path


def migrate(config: dict) -> dict:
    """Move keys from their deprecated places (``MOVED``) to the current ones; a key
    set at both places is an error, since either reading could be the wrong one."""
    config = copy.deepcopy(config)
    problems = []
    for old, new in MOVED.items():
        section, key = old.split(".")
        if not isinstance(config.get(section), dict) or key not in config[section]:
            continue
        value = config[section].pop(key)
        _notice(old, new)
        *parents, last = new.split(".")
        node = config
        for i, part in enumerate(parents):
            if not isinstance(node.get(part), dict):
                default = CORE_SCHEMA["properties"][part].get("default", {}) if i == 0 else {}
                node[part] = copy.deepcopy(default) if node.get(part) is None else node[part]
            if not isinstance(node[part], dict):
                break
            node = node[part]
        else:
            if last in node:
                problems.append(f"{old}: deprecated and also set as {new}; keep only {new}")
            node[last] = value
    if problems:
        raise ConfigError(problems)
    return _critic_from_baseline(config)


def _critic_from_baseline(config: dict) -> dict:
    """``baseline: {name: ppo, options}`` (PPO's critic, once a baseline) becomes
    ``critic: {name: ppo, options}`` beside the group baseline, with a notice."""
    base = config.get("baseline")
    if not (isinstance(base, dict) and base.get("name") == "ppo"):
        return config
    if config.get("critic"):
        raise ConfigError(["baseline.name: ppo is now critic.name: ppo; keep only critic"])
    _notice("baseline.name: ppo", "critic.name: ppo")
    config["critic"] = {"name": "ppo", "options": base.get("options") or {}}
    config["baseline"] = {"name": "grpo"}
    return config


def full_schema() -> dict:
    """The core schema with every installed plugin's option schema attached (for editors)."""
    schema = copy.deepcopy(CORE_SCHEMA)
    defs = schema.setdefault("$defs", {})
    for info in registry().all():
        defs[f"{info.kind}.{info.name}"] = info.schema
    return schema


def fill_defaults(schema: dict, value: Any) -> Any:
    """Fill ``default`` values from ``schema`` into ``value`` (objects and arrays, recursively).
    A plugin section given without its ``name`` (``objective: {entropy_coef: 0.01}``, or
    ``--set objective.entropy_coef=0.01``) takes the section's default plugin."""
    if isinstance(value, dict) and "x-plugin" in schema and isinstance(schema.get("default"), dict):
        for key, default in schema["default"].items():
            value.setdefault(key, copy.deepcopy(default))
    if isinstance(value, dict) and "properties" in schema:
        for key, sub in schema["properties"].items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                value[key] = fill_defaults(sub, value[key])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        value = [fill_defaults(schema["items"], v) for v in value]
    return value


def _path(prefix: str, parts) -> str:
    out = prefix
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


def _describe(value: Any) -> str:
    if isinstance(value, Resolved):  # an error message never shows a variable's value
        return f"{json.dumps(value.template)} (str from the environment)"
    text = json.dumps(value, default=str)
    text = text if len(text) <= 40 else text[:37] + "..."
    return f"{text} ({type(value).__name__})"


def _format(err: jsonschema.ValidationError, prefix: str) -> str:
    where = _path(prefix, err.absolute_path)
    v, val = err.validator, err.validator_value
    if v == "type":
        wanted = " or ".join(val) if isinstance(val, list) else val
        return f"{where}: found {_describe(err.instance)}, expected {wanted}"
    if v == "enum":
        return f"{where}: found {_describe(err.instance)}, expected one of {val}"
    if v == "required":
        missing = err.message.split("'")[1]
        return f"{_path(where if where != '(top level)' else '', [missing])}: missing, required"
    if v in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        sym = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}[
            v
        ]
        return f"{where}: found {_describe(err.instance)}, expected a number {sym} {val}"
    if isinstance(err.instance, Resolved):  # jsonschema's own message would quote the value
        return f"{where}: found {_describe(err.instance)}, which fails {v} {json.dumps(val)}"
    return f"{where}: {err.message}"


def _validate_node(schema: dict, value: Any, prefix: str, problems: list[str]) -> None:
    validator = Validator(schema)
    for err in sorted(validator.iter_errors(value), key=lambda e: list(map(str, e.absolute_path))):
        if err.validator in ("anyOf", "oneOf", "allOf") and err.context:
            err = min(err.context, key=lambda e: len(e.absolute_path) * -1)
        if err.validator == "additionalProperties":
            problems += _unknown_keys(err, prefix)
        else:
            problems.append(_format(err, prefix))


def _placed() -> dict[str, str]:
    """Each key of a core section that only one section has -> its path (``lr`` ->
    ``optimizer.lr``), for a key written at the top level."""
    seen: dict[str, list[str]] = {}
    for section, sub in CORE_SCHEMA["properties"].items():
        for key in sub.get("properties", {}):
            seen.setdefault(key, []).append(f"{section}.{key}")
    return {key: paths[0] for key, paths in seen.items() if len(paths) == 1}


def _unknown_keys(err: jsonschema.ValidationError, prefix: str) -> list[str]:
    """One line per unknown key that is another trainer's name or a near spelling (saying
    what it probably meant), and one line for the rest."""
    where = _path(prefix, err.absolute_path)
    allowed = sorted(err.schema.get("properties", {}))
    extra = sorted(set(err.instance) - set(allowed), key=str)
    lines, rest = [], []
    for key in extra:
        place = _placed().get(key)
        meant = (
            f"did you mean {place}?"
            if place and not prefix and not err.absolute_path
            else trl_names.hint(str(key))
        )
        if meant:
            lines.append(
                f"{_path(prefix, [*err.absolute_path, key])}: unknown key {key!r}: {meant}"
            )
        else:
            rest.append(key)
    if rest:
        lines.append(f"{where}: unknown key(s) {rest}; expected keys from {allowed}")
    return lines


def _walk_plugins(schema: dict, value: Any, prefix: str, problems: list[str]) -> Any:
    """Resolve plugin references below ``schema``; validate and default-fill their options."""
    kind = schema.get("x-plugin")
    if kind and isinstance(value, dict) and isinstance(value.get("name"), str):
        reg = registry()
        try:
            info = reg.find(kind, value["name"])
        except PluginError as exc:
            problems.append(f"{_path(prefix, ['name'])}: {exc}")
            return value
        if info is None:
            problems.append(
                f"{_path(prefix, ['name'])}: "
                + unknown_name_message(kind, value["name"], reg.names(kind))
            )
            return value
        options = value.get("options")
        if not isinstance(options, dict):
            return value
        options = yaml_words(info.schema, fill_defaults(info.schema, options))
        opt_prefix = _path(prefix, ["options"])
        before = len(problems)
        _validate_node(info.schema, options, opt_prefix, problems)
        if len(problems) == before:
            options = _walk_plugins(info.schema, options, opt_prefix, problems)
        if (
            len(problems) == before
            and isinstance(info.factory, type)
            and issubclass(info.factory, Component)
        ):
            problems += [f"{opt_prefix}.{p}" for p in info.factory.check_options(options)]
        value["options"] = options
        return value
    if isinstance(value, dict) and "properties" in schema:
        for key, sub in schema["properties"].items():
            if key in value:
                value[key] = _walk_plugins(sub, value[key], _path(prefix, [key]), problems)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        value = [
            _walk_plugins(schema["items"], v, _path(prefix, [i]), problems)
            for i, v in enumerate(value)
        ]
    return value


def validate(config: dict) -> dict:
    """Return the effective config (defaults filled) or raise ConfigError listing every problem."""
    problems: list[str] = []
    config = yaml_words(CORE_SCHEMA, fill_defaults(CORE_SCHEMA, migrate(config)))
    config = resolve_env(config, "", problems)
    _validate_node(CORE_SCHEMA, config, "", problems)
    config = _walk_plugins(CORE_SCHEMA, config, "", problems)
    if problems:
        raise ConfigError(problems)
    return config


def validate_options(schema: dict, options: dict | None, where: str) -> dict:
    """Validate one plugin's options (used by ``grpo_core.create``)."""
    options = fill_defaults(schema, copy.deepcopy(options or {}))
    problems: list[str] = []
    _validate_node(schema, options, where, problems)
    if not problems:
        options = _walk_plugins(schema, options, where, problems)
    if problems:
        raise ConfigError(problems)
    return options


def section(name: str, value: dict | None = None) -> Any:
    """One section of the typed view from a partial dict of it (``section("model",
    {"name_or_path": p})``): defaults filled and every value checked, as in :func:`validate`,
    for code and tests that need one section (a model to load, rows to batch) without a
    whole run's config."""
    schema = CORE_SCHEMA["properties"][name]
    problems: list[str] = []
    value = fill_defaults(schema, copy.deepcopy(value or {}))
    _validate_node(schema, value, name, problems)
    if not problems:
        value = _walk_plugins(schema, value, name, problems)
    if problems:
        raise ConfigError(problems)
    return build_section(name, value)


def load(path: str, overrides: list[str] | None = None) -> dict:
    """Read, override and validate a config file."""
    return validate(apply_overrides(migrate(read_file(path)), overrides or [], moved_path))
