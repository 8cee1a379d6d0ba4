"""``json_schema``: the completion (or its last fenced code block) is JSON valid against a
schema from the options or from a dataset column."""

from __future__ import annotations

import json
import re

import jsonschema

from grpo_core.scores import Scores

_FENCE = re.compile(r"```(?:json)?\s*\n?(.*?)```", re.DOTALL)
MAX_CHARS = 200_000


def parse_json(text: str):
    """The JSON value in ``text`` (whole text, else the last fenced block); raises ValueError."""
    if len(text) > MAX_CHARS:
        raise ValueError("too long")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        blocks = _FENCE.findall(text)
        if not blocks:
            raise ValueError("no JSON found") from None
        return json.loads(blocks[-1])


class JSONSchemaReward:
    """1.0 when valid, else 0.0; with ``partial``: (parses + each top-level property that
    is valid, or absent and not required) / (1 + number of properties)."""

    def __init__(self, schema: dict | None = None, schema_column: str | None = None,
                 partial: bool = False):
        if schema is None and schema_column is None:
            raise ValueError("give a schema or a schema_column")
        if schema is not None:
            jsonschema.Draft202012Validator.check_schema(schema)
        self.schema, self.column, self.partial = schema, schema_column, partial
        self._validators: dict[str, jsonschema.Draft202012Validator] = {}

    def _validator(self, schema) -> jsonschema.Draft202012Validator:
        if isinstance(schema, str):
            schema = json.loads(schema)
        key = json.dumps(schema, sort_keys=True)
        if key not in self._validators:
            self._validators[key] = jsonschema.Draft202012Validator(schema)
        return self._validators[key]

    def score_one(self, text: str, validator) -> float:
        try:
            value = parse_json(text)
        except (ValueError, RecursionError):
            return 0.0
        if not self.partial:
            return float(validator.is_valid(value))
        props = validator.schema.get("properties", {})
        if not props or not isinstance(value, dict):
            return (1.0 + validator.is_valid(value)) / 2 if not props else 1 / (1 + len(props))
        required = set(validator.schema.get("required", []))
        ok = 1
        for name, sub in props.items():
            if name in value:
                ok += jsonschema.Draft202012Validator(sub).is_valid(value[name])
            else:
                ok += name not in required
        return ok / (1 + len(props))

    def __call__(self, prompts, completions, **columns) -> Scores:
        if self.column is not None and self.column not in columns:
            raise KeyError(f"json_schema reward needs the dataset column {self.column!r}")
        schemas = columns[self.column] if self.column else [self.schema] * len(completions)
        return Scores([self.score_one(c, self._validator(s)) for c, s in zip(completions, schemas)])


SCHEMA = {
    "type": "object", "additionalProperties": False,
    "properties": {
        "schema": {"type": ["object", "null"], "default": None},
        "schema_column": {"type": ["string", "null"], "default": None},
        "partial": {"type": "boolean", "default": False},
    },
}
