"""``grpo schema --markdown``: the config reference (docs/config.md) made from the schema, so
the documentation cannot drift from what the validator accepts."""

from __future__ import annotations

import json

from grpo_core.config import MOVED
from grpo_core.config.schema import CORE_SCHEMA

HEADER = """# The config file

One YAML (or JSON) file, one section per phase of a training step. `grpo validate CONFIG`
prints the effective config with every default filled in; `grpo schema` prints the JSON Schema
(core plus every installed plugin's options). Any command that takes a config also takes
`--set key.path=value` (repeatable; the value is read as YAML, and `3e-4` is a number).

Errors name the path, what was found and what was expected, all at once:

```
error: train.steps: found "ten" (str), expected integer
error: reward.options.components[1].weight: found "heavy" (str), expected number
error: kl.name: unknown kl plugin 'fixd'; installed: adaptive, fixed, schedule; did you mean
'fixed'?
```

A section written `{name: PLUGIN, options: {...}}` selects a plugin by name; its options are
checked against that plugin's own schema (`grpo schema`, or the plugin's documentation:
[rewards.md](rewards.md), [algorithms.md](algorithms.md)).

A string may read an environment variable: `${env:NAME}` is replaced by its value when the
config loads (`headers: {Authorization: "Bearer ${env:REWARD_API_KEY}"}`), and a variable
that is not set is an error naming it. Everything the run writes (`config.json`, checkpoints,
trackers, `grpo validate`'s output) holds `${env:NAME}`, never the value.

This file is generated from `grpo_core/config/schema.py` by `grpo schema --markdown`; a test fails
when it is stale.
"""


def _type(s: dict) -> str:
    if "enum" in s:
        return " \\| ".join("null" if v is None else f"`{v}`" for v in s["enum"])
    t = s.get("type", "")
    kind = " or ".join(t) if isinstance(t, list) else t
    bounds = [
        f"{op} {s[k]}"
        for k, op in (
            ("minimum", ">="),
            ("exclusiveMinimum", ">"),
            ("maximum", "<="),
            ("exclusiveMaximum", "<"),
        )
        if k in s
    ]
    return kind + (f" ({', '.join(bounds)})" if bounds else "")


def _default(s: dict) -> str:
    if "default" not in s:
        return "required" if s.get("x-required") else ""
    return "`" + json.dumps(s["default"]) + "`"


#: the plugin a top-level section selects when it is written without ``name``
PLUGIN_DEFAULTS = {
    section: s["default"]["name"]
    for section, s in CORE_SCHEMA["properties"].items()
    if "x-plugin" in s and isinstance(s.get("default"), dict) and "name" in s["default"]
}


def _rows(props: dict, required: list, prefix: str) -> list[str]:
    rows = []
    for key, s in props.items():
        path = f"{prefix}.{key}"
        if (
            s.get("type") in ("object", ["object", "null"])
            and "properties" in s
            and "x-plugin" not in s
        ):
            rows.append(f"| `{path}` | {_type(s)} | {_default(s)} | {s.get('description', '')} |")
            rows += _rows(s["properties"], s.get("required", []), path)
            continue
        default = "required" if key in required and "default" not in s else _default(s)
        if key == "name" and prefix in PLUGIN_DEFAULTS:  # a section without name takes it
            default = f"`{PLUGIN_DEFAULTS[prefix]}`"
        rows.append(f"| `{path}` | {_type(s)} | {default} | {s.get('description', '')} |")
    return rows


def config_reference() -> str:
    """docs/config.md: every section and key, with its type, default and description."""
    out = [HEADER]
    top = CORE_SCHEMA["properties"]
    for section, s in top.items():
        req = " (required)" if section in CORE_SCHEMA["required"] else ""
        out.append(f"## `{section}`{req}\n\n{s.get('description', '')}\n")
        if "x-plugin" in s:
            default = PLUGIN_DEFAULTS.get(section)
            article = "An" if s["x-plugin"][0] in "aeiou" else "A"
            out.append(
                f"{article} `{s['x-plugin']}` plugin by name"
                + (
                    f" (default `{default}`, also for a section written without `name`)"
                    if default
                    else ""
                )
                + "; `grpo plugins` lists them."
                + (" Optional (default `null`)." if s.get("default", 0) is None else "")
                + "\n"
            )
        if "properties" not in s:
            out.append(f"Type: {_type(s)}; default {_default(s)}.\n")
            continue
        out.append("| key | type | default | what |\n|---|---|---|---|")
        out += _rows(s["properties"], s.get("required", []), section)
        out.append("")
    out.append(
        "## Keys that moved\n\nConfigs written for earlier versions still load: each "
        "key below is read at its new place, with a one-line notice; setting both the "
        "old and the new key is an error.\n\n| old | new |\n|---|---|"
    )
    out += [f"| `{old}` | `{new}` |" for old, new in MOVED.items()]
    return "\n".join(out) + "\n"
