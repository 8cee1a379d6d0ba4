"""Writes grpo_core/config/sections.py, the typed view's section classes, from the JSON schema
(grpo_core.config.schema), so that a key is added, typed, defaulted, bounded and described in
one place: the schema. tests/unit/test_config_view.py fails while the file is out of date.

    python -m grpo_core.config.codegen     # rewrite grpo_core/config/sections.py

A generated file, not classes built at import, so that the type checker sees every field.
"""

from __future__ import annotations

import os
import sys
import textwrap

from grpo_core.config.schema import CORE_SCHEMA

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sections.py")

#: JSON Schema types -> Python annotations
_TYPES = {
    "string": "str",
    "integer": "int",
    "number": "float",
    "boolean": "bool",
    "object": "dict",
    "array": "list",
    "null": "None",
}

HEADER = '''"""The typed view's sections: one frozen dataclass per section of the config, one
field per key, each with its description. GENERATED from grpo_core/config/schema.py by
``python -m grpo_core.config.codegen``: edit the schema, then run that (see
grpo_core.config.view for the whole config and the values derived from several keys).
"""

from __future__ import annotations

from dataclasses import dataclass
'''


def annotation(schema: dict) -> str:
    """The Python type of a value ``schema`` describes: its ``type`` (a list: a union, None
    last), or for an ``enum`` the types of its values."""
    if "enum" in schema:
        kinds = ["None" if v is None else type(v).__name__ for v in schema["enum"]]
    else:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        kinds = [_TYPES[t] for t in types]
    kinds = sorted(set(kinds), key=lambda k: (k == "None", kinds.index(k)))
    return " | ".join(kinds)


def class_name(section: str) -> str:
    """``model`` -> ModelSection, ``model.lora`` -> ModelLoraSection."""
    return section.title().replace("_", "").replace(".", "") + "Section"


def _comment(text: str) -> list[str]:
    """A key's description as ``#:`` comment lines (the form documentation tools read)."""
    return textwrap.wrap(text, 94, initial_indent="    #: ", subsequent_indent="    #: ")


def section_source(name: str, schema: dict) -> str:
    """One section's dataclass: its description as the docstring, then each key with its
    description as a comment and its type; before it, the dataclass of each key that is a
    mapping with keys of its own (``model.lora``: ModelLoraSection)."""
    doc = textwrap.wrap(f"``{name}``: {schema.get('description', '')}".strip(), 88)
    lines = ["@dataclass(frozen=True)", f"class {class_name(name)}:"]
    if len(doc) == 1:
        lines.append(f'    """{doc[0]}"""')
    else:
        lines += [f'    """{doc[0]}', *(f"    {d}" for d in doc[1:]), '    """']
    lines.append("")
    nested = []
    for key, sub in schema["properties"].items():
        lines += _comment(sub.get("description", ""))
        if "properties" in sub:  # a mapping with keys of its own: a section of its own too
            nested.append(section_source(f"{name}.{key}", sub))
            kinds = [class_name(f"{name}.{key}"), *(["None"] if "null" in sub["type"] else [])]
            lines.append(f"    {key}: {' | '.join(kinds)}")
        else:
            lines.append(f"    {key}: {annotation(sub)}")
    return "\n\n".join([*nested, "\n".join(lines) + "\n"])


def sections() -> dict[str, dict]:
    """The schema's sections that have keys of their own (the rest stay plain values)."""
    return {n: s for n, s in CORE_SCHEMA["properties"].items() if "properties" in s}


def render() -> str:
    """The text of grpo_core/config/sections.py."""
    return "\n\n".join([HEADER, *(section_source(n, s) for n, s in sections().items())])


def main() -> int:
    with open(PATH, "w", encoding="utf-8") as f:
        f.write(render())
    print(f"wrote {PATH}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
