"""``json_schema``: the completion (or its last fenced code block) is JSON valid against a
schema from the options or from a dataset column.

Completions are hostile input, so time and memory are bounded: a completion over
``MAX_CHARS`` or nested too deeply for the parser scores 0; the regex keywords (``pattern``,
``patternProperties`` and the ``additionalProperties`` that depends on them) run on RE2;
``uniqueItems`` is checked in linear time; and validating one completion stops after
``validation_timeout`` seconds, scoring 0. A schema in the options is checked when the reward is
built (one-line PluginError); a schema from a dataset column can only be checked per item, and
an item whose schema is invalid scores 0.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections import OrderedDict

import jsonschema
import referencing.exceptions
from grpo_core_plugins.rewards.regex import RegexRefused, compile_linear, search

from grpo_core.errors import PluginError
from grpo_core.hookspecs import Reward
from grpo_core.scores import Scores

MAX_CHARS = 200_000  # longest completion parsed; longer ones score 0
MAX_SCHEMA_CHARS = 1_000_000  # longest schema text accepted from a dataset column
CACHE_SIZE = 256  # distinct column schemas whose checked validators are kept

_FENCE = compile_linear(r"```(?:json)?\s*\n?(.*?)```", dotall=True)


def parse_json(text: str):
    """The JSON value in ``text`` (whole text, else the last fenced block); raises ValueError
    (too long, not JSON) or RecursionError (nested deeper than the interpreter allows)."""
    if len(text) > MAX_CHARS:
        raise ValueError("too long")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        blocks = [m.group(1) for m in _FENCE.finditer(text)] if "```" in text else []
        if not blocks:
            raise ValueError("no JSON found") from None
        return json.loads(blocks[-1])


# --- a Draft 2020-12 validator whose every step is bounded -------------------------------


class _OutOfTime(Exception):
    """Validation of one completion used up its time budget."""


_clock = threading.local()  # .deadline: time.monotonic() value, per thread


def _on_time() -> None:
    deadline = getattr(_clock, "deadline", None)
    if deadline is not None and time.monotonic() > deadline:
        raise _OutOfTime


def _timed(keyword):
    """Wrap a keyword function so each use first checks the deadline: every step of a
    validation goes through some keyword, so a slow one is cut short wherever it is."""

    def check(validator, value, instance, schema):
        _on_time()
        return keyword(validator, value, instance, schema)

    return check


@functools.lru_cache(maxsize=64)
def _compiled(pattern: str):
    """RE2 form of a schema regex (raises RegexRefused); each can use up to 8 MiB in RE2."""
    return compile_linear(pattern)


def _pattern(validator, pattern, instance, schema):
    if validator.is_type(instance, "string") and not search(_compiled(pattern), instance):
        shown = instance if len(instance) <= 60 else instance[:57] + "..."
        yield jsonschema.ValidationError(f"{shown!r} does not match {pattern!r}")


def _pattern_properties(validator, patterns, instance, schema):
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        rx = _compiled(pattern)
        for name, value in instance.items():
            if search(rx, name):
                yield from validator.descend(value, subschema, path=name, schema_path=pattern)


_STOCK = jsonschema.Draft202012Validator.VALIDATORS


def _additional_properties(validator, additional, instance, schema):
    """As the stock keyword, but the names that ``patternProperties`` covers are found with
    RE2 (the stock one joins those patterns and matches them with Python's ``re``)."""
    if "patternProperties" not in schema:
        yield from _STOCK["additionalProperties"](validator, additional, instance, schema)
        return
    if not validator.is_type(instance, "object"):
        return
    known = schema.get("properties", {})
    rxs = [_compiled(p) for p in schema["patternProperties"]]
    extras = [k for k in instance if k not in known and not any(search(r, k) for r in rxs)]
    if validator.is_type(additional, "object"):
        for name in extras:
            yield from validator.descend(instance[name], additional, path=name)
    elif additional is False and extras:
        names = ", ".join(repr(k) for k in sorted(extras)[:5])
        yield jsonschema.ValidationError(f"properties not allowed by the schema: {names}")


def _canonical(value):
    """A hashable key equal for exactly the values JSON Schema calls equal (1 == 1.0, but
    True != 1; objects compare without regard to key order)."""
    if isinstance(value, bool) or value is None:
        return ("literal", value)
    if isinstance(value, float) and value.is_integer():
        return ("number", int(value))
    if isinstance(value, (int, float)):
        return ("number", value)
    if isinstance(value, str):
        return ("string", value)
    if isinstance(value, dict):
        return ("object", frozenset((k, _canonical(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return ("array", tuple(_canonical(v) for v in value))
    return ("other", id(value))


def _unique_items(validator, unique, instance, schema):
    """In linear time; the stock keyword compares every pair of unsortable items."""
    if not unique or not validator.is_type(instance, "array"):
        return
    seen = set()
    for i, item in enumerate(instance):
        key = _canonical(item)
        if key in seen:
            yield jsonschema.ValidationError(f"array item {i} repeats an earlier item")
            return
        seen.add(key)


_BoundedValidator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    validators={
        **{k: _timed(v) for k, v in _STOCK.items()},
        "pattern": _timed(_pattern),
        "patternProperties": _timed(_pattern_properties),
        "additionalProperties": _timed(_additional_properties),
        "uniqueItems": _timed(_unique_items),
    },
)

# A format checker as the stock one, except that "regex" means "RE2 can run it".
_SCHEMA_FORMATS = jsonschema.FormatChecker(
    [f for f in jsonschema.FormatChecker.checkers if f != "regex"]
)

# Keywords whose values are data, not schemas: nothing inside them is checked or rewritten.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})
# Keywords whose values map names to schemas.
_SCHEMA_MAPS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)


class SchemaRefused(ValueError):
    """A schema the reward cannot use; the message is one line and names the place."""


def _where(path: list) -> str:
    out = "schema"
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _prepare(node, path: list, found: set):
    """A copy of schema ``node`` without ``$schema`` keys, after checking its regexes.

    ``$schema`` would make jsonschema switch, below that point, to its stock validator class,
    which matches patterns with Python's backtracking ``re``; without it every subschema is
    validated by the bounded class (as Draft 2020-12, which this reward always used)."""
    if isinstance(node, list):
        return [_prepare(v, path + [i], found) for i, v in enumerate(node)]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "$schema" and isinstance(value, str):
            continue
        found.add(key)
        if key == "pattern" and isinstance(value, str):
            _check_regex(value, path + [key])
        if key == "patternProperties" and isinstance(value, dict):
            for pattern in value:
                _check_regex(pattern, path + [key])
        if key in _DATA_KEYWORDS:
            out[key] = value
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {
                name: _prepare(sub, path + [key, name], found) for name, sub in value.items()
            }
        else:
            out[key] = _prepare(value, path + [key], found)
    return out


def _check_regex(pattern: str, path: list) -> None:
    try:
        compile_linear(pattern)
    except RegexRefused as exc:
        raise SchemaRefused(f"{_where(path)}: {exc}") from None


def check_schema(schema) -> dict:
    """The schema as the reward validates it (see ``_prepare``); raises SchemaRefused with a
    one-line message when it is not a valid Draft 2020-12 schema or uses a regex, or a keyword
    combination, whose matching time cannot be bounded."""
    if not isinstance(schema, (dict, bool)):
        raise SchemaRefused(f"schema: expected a JSON object, got {type(schema).__name__}")
    if isinstance(schema, bool):
        return schema
    found: set = set()
    try:
        prepared = _prepare(schema, [], found)
        error = jsonschema.exceptions.best_match(
            jsonschema.Draft202012Validator(
                jsonschema.Draft202012Validator.META_SCHEMA, format_checker=_SCHEMA_FORMATS
            ).iter_errors(schema)
        )
    except RecursionError:
        raise SchemaRefused("schema: nested too deeply") from None
    if error is not None:
        message = " ".join(error.message.split())
        if len(message) > 200:
            message = message[:197] + "..."
        raise SchemaRefused(f"{_where(list(error.absolute_path))}: {message}")
    if "unevaluatedProperties" in found and "patternProperties" in found:
        raise SchemaRefused(
            "schema: unevaluatedProperties together with patternProperties "
            "is not supported (jsonschema would match those patterns with a "
            "backtracking regex engine); use additionalProperties"
        )
    return prepared


class JSONSchemaReward(Reward):
    """1.0 when valid, else 0.0; with ``partial``: (parses + each top-level property that
    is valid, or absent and not required) / (1 + number of properties)."""

    max_value = 1.0

    @classmethod
    def columns_for(cls, options: dict) -> tuple[str, ...]:
        return (options["schema_column"],) if options.get("schema_column") else ()

    @classmethod
    def check_options(cls, options: dict) -> list[str]:
        if options.get("schema") is None and options.get("schema_column") is None:
            return ["schema: give a schema or a schema_column"]
        if options.get("schema") is not None:
            try:
                check_schema(options["schema"])
            except SchemaRefused as exc:
                return [str(exc)]
        return []

    def __init__(
        self,
        schema: dict | None = None,
        schema_column: str | None = None,
        partial: bool = False,
        validation_timeout: float = 1.0,
    ):
        if schema is None and schema_column is None:
            raise ValueError("give a schema or a schema_column")
        self._fixed = None
        if schema is not None:
            try:
                self._fixed = _BoundedValidator(check_schema(schema))
            except SchemaRefused as exc:
                raise PluginError(f"reward json_schema: {exc}") from None
        self.schema, self.column, self.partial = schema, schema_column, partial
        self.validation_timeout = validation_timeout
        self._validators: OrderedDict[str, object] = OrderedDict()

    def _column_validator(self, schema):
        """The bounded validator for one item's schema, or None when that schema is unusable
        (not JSON, too long, invalid, or with regexes RE2 cannot run). Kept in a small LRU."""
        try:
            if isinstance(schema, str):
                if len(schema) > MAX_SCHEMA_CHARS:
                    return None
                schema = json.loads(schema)
            key = json.dumps(schema, sort_keys=True)
        except (ValueError, TypeError, RecursionError):
            return None
        if key in self._validators:
            self._validators.move_to_end(key)
            return self._validators[key]
        try:
            validator = _BoundedValidator(check_schema(schema))
        except SchemaRefused:
            validator = None
        self._validators[key] = validator
        if len(self._validators) > CACHE_SIZE:
            self._validators.popitem(last=False)
        return validator

    def score_one(self, text: str, validator) -> float:
        """The score of one completion; 0 when it is not JSON, is too long or too deep, or
        its validation runs out of time."""
        if validator is None:
            return 0.0
        try:
            value = parse_json(text)
        except (ValueError, RecursionError):
            return 0.0
        _clock.deadline = time.monotonic() + self.validation_timeout
        try:
            return self._score_value(value, validator)
        except (_OutOfTime, RecursionError):
            return 0.0
        except (
            referencing.exceptions.Unresolvable,
            jsonschema.exceptions.SchemaError,
            jsonschema.exceptions.UnknownType,
            RegexRefused,
        ) as exc:
            if validator is not self._fixed:
                return 0.0  # an item's own schema is broken: that item cannot be right
            raise ValueError(
                f"json_schema reward: the schema cannot be used: {' '.join(str(exc).split())[:200]}"
            ) from None
        finally:
            _clock.deadline = None

    def _score_value(self, value, validator) -> float:
        if not self.partial:
            return float(validator.is_valid(value))
        schema = validator.schema if isinstance(validator.schema, dict) else {}
        props = schema.get("properties", {})
        if not props or not isinstance(value, dict):
            return (1.0 + validator.is_valid(value)) / 2 if not props else 1 / (1 + len(props))
        required = set(schema.get("required", []))
        ok = 1
        for name, sub in props.items():
            if name in value:
                # evolve keeps the root's references, so "$ref": "#/$defs/..." still resolves
                ok += validator.evolve(schema=sub).is_valid(value[name])
            else:
                ok += name not in required
        return ok / (1 + len(props))

    def __call__(self, prompts, completions, **columns) -> Scores:
        if self.column is not None and self.column not in columns:
            raise KeyError(f"json_schema reward needs the dataset column {self.column!r}")
        if self.column is None:
            return Scores([self.score_one(c, self._fixed) for c in completions])
        return Scores(
            [
                self.score_one(c, self._column_validator(s))
                for c, s in zip(completions, columns[self.column])
            ]
        )


SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "schema": {"type": ["object", "null"], "default": None},
        "schema_column": {"type": ["string", "null"], "default": None},
        "partial": {"type": "boolean", "default": False},
        "validation_timeout": {
            "type": "number",
            "exclusiveMinimum": 0,
            "default": 1.0,
            "description": "seconds spent validating one completion before it scores 0",
        },
    },
}
