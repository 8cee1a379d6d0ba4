"""One config file, validated at once: the core schema plus each selected plugin's schema.

A value whose schema carries ``"x-plugin": KIND`` is a plugin reference
``{name, options}``; its options are checked against that plugin's own schema, and
the walk continues into that schema, so composite plugins (a weighted reward of
rewards) are checked all the way down.
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any

import jsonschema
import yaml

from grpo_core.errors import ConfigError
from grpo_core.registry import registry, unknown_name_message


def plugin_ref(kind: str, default: str | None = None, description: str = "") -> dict:
    """Schema of a reference to a plugin of ``kind``: ``{name: ..., options: {...}}``."""
    ref: dict[str, Any] = {
        "type": "object",
        "x-plugin": kind,
        "description": description or f"a {kind} plugin, by name, with its options",
        "properties": {"name": {"type": "string"}, "options": {"type": "object", "default": {}}},
        "required": ["name"],
        "additionalProperties": False,
    }
    if default is not None:
        ref["default"] = {"name": default}
    return ref


def _obj(props: dict, required: tuple = ()) -> dict:
    return {"type": "object", "properties": props, "required": list(required),
            "additionalProperties": False, "default": {}}


NUM = {"type": "number"}
POS_INT = {"type": "integer", "minimum": 1}

CORE_SCHEMA: dict = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "grpo-core run configuration",
    **_obj({
        "model": _obj({
            "name_or_path": {"type": "string", "description": "hub id or local directory"},
            "dtype": {"enum": ["auto", "float32", "bfloat16", "float16"], "default": "auto"},
            "trust_remote_code": {"type": "boolean", "default": False},
            "allow_unsafe_weights": {"type": "boolean", "default": False,
                                     "description": "allow pickle (.bin) weights"},
            "gradient_checkpointing": {"type": "boolean", "default": False},
            "lora": {"type": ["object", "null"], "default": None,
                     "description": "LoRA adapters through peft; the reference is the base model",
                     "additionalProperties": False,
                     "properties": {
                         "r": {**POS_INT, "default": 16},
                         "alpha": {"type": "number", "exclusiveMinimum": 0, "default": 32},
                         "dropout": {"type": "number", "minimum": 0, "maximum": 1,
                                     "default": 0.0},
                         "target_modules": {"type": ["array", "string"],
                                            "items": {"type": "string"},
                                            "default": ["q_proj", "k_proj", "v_proj", "o_proj"]},
                         "save_merged": {"type": "boolean", "default": False,
                                         "description": "also write merged weights at the end"},
                     }},
            "quantization": {"enum": [None, "4bit", "8bit"], "default": None,
                             "description": "QLoRA base weights (needs bitsandbytes and CUDA)"},
            "reference_device": {"enum": ["same", "cpu"], "default": "same",
                                 "description": "where the frozen reference model lives"},
        }, required=("name_or_path",)),
        "data": _obj({
            "path": {"type": "string", "description": "JSONL/JSON/parquet file or datasets name"},
            "split": {"type": "string", "default": "train"},
            "prompt_field": {"type": "string", "default": "prompt"},
            "columns": {"type": "array", "items": {"type": "string"}, "default": [],
                        "description": "dataset fields passed to rewards, by name"},
            "chat_template": {"enum": ["auto", "always", "never"], "default": "auto"},
            "system_prompt": {"type": ["string", "null"], "default": None},
            "shuffle": {"type": "boolean", "default": True},
        }, required=("path",)),
        "sampling": _obj({
            "group_size": {**POS_INT, "default": 8},
            "max_new_tokens": {**POS_INT, "default": 64},
            "temperature": {"type": "number", "exclusiveMinimum": 0, "default": 1.0},
            "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1, "default": 1.0},
            "top_k": {"type": "integer", "minimum": 0, "default": 0},
            "generation_batch_size": {"type": ["integer", "null"], "minimum": 1, "default": None},
        }),
        "train": _obj({
            "steps": {**POS_INT, "default": 100},
            "prompts_per_step": {**POS_INT, "default": 8},
            "inner_iterations": {**POS_INT, "default": 1, "description": "mu: updates per rollout"},
            "micro_batch_groups": {**POS_INT, "default": 8,
                                   "description": "groups per forward/backward (whole groups)"},
            "lr": {"type": "number", "exclusiveMinimum": 0, "default": 1e-6},
            "weight_decay": {"type": "number", "minimum": 0, "default": 0.0},
            "betas": {"type": "array", "items": NUM, "minItems": 2, "maxItems": 2,
                      "default": [0.9, 0.99]},
            "lr_schedule": {"enum": ["constant", "cosine"], "default": "constant"},
            "warmup_steps": {"type": "integer", "minimum": 0, "default": 0},
            "max_grad_norm": {"type": ["number", "null"], "exclusiveMinimum": 0, "default": 1.0},
            "clip_low": {"type": "number", "minimum": 0, "default": 0.2},
            "clip_high": {"type": "number", "minimum": 0, "default": 0.2},
            "entropy_coef": {"type": "number", "default": 0.0},
            "aggregation": {"enum": ["token_mean", "seq_mean_token_mean",
                                     "seq_mean_token_sum_norm"], "default": "token_mean"},
            "kl_estimator": {"enum": ["k1", "k2", "k3"], "default": "k3"},
            "kl_placement": {"enum": ["loss", "reward"], "default": "loss"},
            "drop_zero_std_groups": {"type": "boolean", "default": False},
            "resample_zero_std_max": {"type": "integer", "minimum": 0, "default": 0,
                                      "description": "extra completions per zero-std group"},
            "reward_failure": {"enum": ["raise", "zero", "drop_group"], "default": "raise"},
            "reward_timeout": {"type": ["number", "null"], "exclusiveMinimum": 0,
                               "default": 600, "description": "seconds before a reward call "
                               "counts as failed (null: wait forever)"},
            "max_nonfinite_steps": {**POS_INT, "default": 3},
            "logprob_chunk": {**POS_INT, "default": 1024},
            "seed": {"type": "integer", "default": 0},
            "device": {"enum": ["auto", "cpu", "cuda"], "default": "auto"},
            "threads": {"type": ["integer", "null"], "minimum": 1, "default": None},
        }),
        "reward": plugin_ref("reward"),
        "baseline": plugin_ref("baseline", default="grpo"),
        "kl": plugin_ref("kl", default="fixed"),
        "generator": plugin_ref("generator", default="hf"),
        "output": _obj({
            "dir": {"type": "string", "default": "runs/latest"},
            "save_model": {"type": "boolean", "default": True},
            "checkpoint_every": {"type": "integer", "minimum": 0, "default": 0},
            "keep_last": {**POS_INT, "default": 2},
            "samples_every": {"type": "integer", "minimum": 0, "default": 10},
            "progress": {"type": "boolean", "default": True},
            "tensorboard": {"enum": ["auto", "off"], "default": "auto",
                            "description": "auto: log to <dir>/tensorboard when installed"},
            "wandb_project": {"type": ["string", "null"], "default": None},
        }),
        "eval": _obj({
            "data": {"type": ["string", "null"], "default": None,
                     "description": "held-out data (file, or directory with <split>.jsonl)"},
            "split": {"type": "string", "default": "test"},
            "every_n_steps": {"type": "integer", "minimum": 0, "default": 0},
            "n": {**POS_INT, "default": 1, "description": "samples per problem"},
            "temperature": {"type": "number", "minimum": 0, "default": 0.0,
                            "description": "0: greedy"},
            "max_problems": {"type": ["integer", "null"], "minimum": 1, "default": None},
            "pass_threshold": {"type": "number", "default": 1.0,
                               "description": "a completion is correct at this reward"},
            "correct_dimension": {"type": ["string", "null"], "default": None,
                                  "description": "judge correctness on this reward dimension"},
            "keep_best": {"type": ["string", "null"], "default": None,
                          "description": "eval metric whose best value keeps a model in best/"},
        }),
        "deepspeed": {"type": ["object", "string", "null"], "default": None,
                      "description": "DeepSpeed config (ZeRO 1/2) or a path to its JSON"},
        "health": _obj({
            "enabled": {"type": "boolean", "default": True},
            "window": {**POS_INT, "default": 10},
        }),
    }, required=("model", "data", "reward")),
}


def full_schema() -> dict:
    """The core schema with every installed plugin's option schema attached (for editors)."""
    schema = copy.deepcopy(CORE_SCHEMA)
    defs = schema.setdefault("$defs", {})
    for info in registry().all():
        defs[f"{info.kind}.{info.name}"] = info.schema
    return schema


def read_file(path: str) -> dict:
    """Read a YAML or JSON config file into a dict, or raise a one-line ConfigError."""
    if not os.path.exists(path):
        raise ConfigError([f"{path}: config file not found"])
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"{path}: cannot read config file ({exc})"]) from exc
    try:
        data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        if isinstance(exc, json.JSONDecodeError):
            line = f" at line {exc.lineno}, column {exc.colno}"
        problem = getattr(exc, "problem", None) or getattr(exc, "msg", "") or str(exc)
        raise ConfigError([f"{path}: invalid {'JSON' if path.endswith('.json') else 'YAML'}"
                           f"{line}: {problem}"]) from exc
    if data is None:
        raise ConfigError([f"{path}: config file is empty; expected a mapping with model, data, "
                           f"reward"])
    if not isinstance(data, dict):
        raise ConfigError([f"{path}: expected a mapping at the top level, found "
                           f"{type(data).__name__}"])
    return data


def apply_overrides(config: dict, overrides: list[str]) -> dict:
    """Apply ``key.path=value`` overrides; the value is read as YAML (``3``, ``true``, ``[a]``)."""
    config = copy.deepcopy(config)
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError([f"--set {item!r}: expected key.path=value"])
        key, raw = item.split("=", 1)
        value = _scalar(raw)
        node: Any = config
        parts = key.split(".")
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            if isinstance(node, list):
                if not part.isdigit() or int(part) >= len(node):
                    raise ConfigError([f"--set {key}: {part!r} is not an index of the list at "
                                       f"{'.'.join(parts[:i])}"])
                part = int(part)
            elif not isinstance(node, dict):
                raise ConfigError([f"--set {key}: {'.'.join(parts[:i])} is not a mapping"])
            if last:
                node[part] = value
            else:
                if isinstance(node, dict) and not isinstance(node.get(part), (dict, list)):
                    node[part] = {}
                node = node[part]
    return config


def _scalar(raw: str) -> Any:
    """Read an override value as YAML, but take ``3e-3`` as a number (YAML 1.1 would not)."""
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def fill_defaults(schema: dict, value: Any) -> Any:
    """Fill ``default`` values from ``schema`` into ``value`` (objects and arrays, recursively)."""
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
    if v == "additionalProperties":
        allowed = sorted(err.schema.get("properties", {}))
        extra = sorted(set(err.instance) - set(allowed))
        return f"{where}: unknown key(s) {extra}; expected keys from {allowed}"
    if v in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        sym = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=",
               "exclusiveMaximum": "<"}[v]
        return f"{where}: found {_describe(err.instance)}, expected a number {sym} {val}"
    return f"{where}: {err.message}"


def _validate_node(schema: dict, value: Any, prefix: str, problems: list[str]) -> None:
    validator = jsonschema.Draft202012Validator(schema)
    for err in sorted(validator.iter_errors(value), key=lambda e: list(map(str, e.absolute_path))):
        if err.validator in ("anyOf", "oneOf", "allOf") and err.context:
            err = min(err.context, key=lambda e: len(e.absolute_path) * -1)
        problems.append(_format(err, prefix))


def _walk_plugins(schema: dict, value: Any, prefix: str, problems: list[str]) -> Any:
    """Resolve plugin references below ``schema``; validate and default-fill their options."""
    kind = schema.get("x-plugin")
    if kind and isinstance(value, dict) and isinstance(value.get("name"), str):
        reg = registry()
        info = reg.plugins.get((kind, value["name"]))
        if info is None:
            problems.append(f"{_path(prefix, ['name'])}: "
                            + unknown_name_message(kind, value["name"], reg.names(kind)))
            return value
        options = value.get("options")
        if not isinstance(options, dict):
            return value
        options = fill_defaults(info.schema, options)
        opt_prefix = _path(prefix, ["options"])
        before = len(problems)
        _validate_node(info.schema, options, opt_prefix, problems)
        if len(problems) == before:
            options = _walk_plugins(info.schema, options, opt_prefix, problems)
        value["options"] = options
        return value
    if isinstance(value, dict) and "properties" in schema:
        for key, sub in schema["properties"].items():
            if key in value:
                value[key] = _walk_plugins(sub, value[key], _path(prefix, [key]), problems)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        value = [_walk_plugins(schema["items"], v, _path(prefix, [i]), problems)
                 for i, v in enumerate(value)]
    return value


def validate(config: dict) -> dict:
    """Return the effective config (defaults filled) or raise ConfigError listing every problem."""
    config = fill_defaults(CORE_SCHEMA, copy.deepcopy(config))
    problems: list[str] = []
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


def load(path: str, overrides: list[str] | None = None) -> dict:
    """Read, override and validate a config file."""
    return validate(apply_overrides(read_file(path), overrides or []))
