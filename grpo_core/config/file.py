"""Reading a config file as untrusted input, and ``--set`` overrides.

A config may come from anywhere (a colleague, a generated sweep, a pasted issue), so reading
it is bounded: the file's size, YAML aliases expanded (a kilobyte of nested aliases can
describe gigabytes), nesting depth, duplicate keys (YAML silently keeps the last), numbers
Python cannot hold or that are not finite. Every refusal is one line naming the file.

A string may read an environment variable as ``${env:NAME}`` (an API key in a header, a
machine's data path): :func:`resolve_env` puts the value in at load, and :func:`unresolved`
gives the config back as written, for every file a run writes.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
from typing import Any

import yaml

from grpo_core.config.redact import register_resolved
from grpo_core.errors import ConfigError

MAX_BYTES = 1 << 20  # a config is a page of text, not a data set
MAX_NODES = 100_000  # values after YAML aliases are expanded
MAX_DEPTH = 64  # nesting of mappings and lists
MAX_INT_DIGITS = 30


class _Loader(yaml.SafeLoader):
    """YAML 1.1 safe loading that refuses duplicate keys."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                continue  # the base class reports unhashable keys itself
            if key in seen:
                raise ConfigError(
                    [
                        f"duplicate key {key!r} at line {key_node.start_mark.line + 1} "
                        f"(first at line {seen[key] + 1}); keep one"
                    ]
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


# YAML 1.1 reads `1e-3` (no dot) as a string, YAML 1.2 and every --set value as a number:
# files read it as a number too, so `lr: 1e-3` means what it says
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


#: the words YAML 1.1 reads as booleans, by the boolean they become
_BOOL_WORDS = {True: ("on", "yes", "true", "y"), False: ("off", "no", "false", "n")}


def yaml_words(schema: dict, value: Any) -> Any:
    """``value`` with each boolean that the schema wants as one of its strings put back as
    that string: YAML 1.1 reads an unquoted ``on`` or ``off`` (``yes``, ``no``) as a boolean,
    so ``runtime.packing: on`` would be refused as "found True". Only where the schema's enum
    holds such a word and no boolean."""
    enum = schema.get("enum")
    if isinstance(value, bool) and enum and not any(isinstance(e, bool) for e in enum):
        word = next((w for w in _BOOL_WORDS[value] if w in enum), None)
        return value if word is None else word
    if isinstance(value, dict) and isinstance(schema.get("properties"), dict):
        props = schema["properties"]
        return {k: yaml_words(props[k], v) if k in props else v for k, v in value.items()}
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [yaml_words(schema["items"], v) for v in value]
    return value


def _expanded_size(root: yaml.Node) -> int:
    """Number of values the document holds once aliases are expanded (refuses cycles and
    nesting past MAX_DEPTH), without expanding them."""
    memo: dict[int, int] = {}
    busy: set[int] = set()

    def size(node: yaml.Node, depth: int) -> int:
        if id(node) in memo:
            return memo[id(node)]
        if depth > MAX_DEPTH:
            raise ConfigError([f"nesting deeper than {MAX_DEPTH} levels"])
        if id(node) in busy:
            raise ConfigError(["a YAML alias refers to itself"])
        busy.add(id(node))
        if isinstance(node, yaml.MappingNode):
            n = 1 + sum(size(k, depth + 1) + size(v, depth + 1) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            n = 1 + sum(size(v, depth + 1) for v in node.value)
        else:
            n = 1
        busy.discard(id(node))
        memo[id(node)] = min(n, MAX_NODES + 1)
        return memo[id(node)]

    return size(root, 0)


def parse_yaml(text: str) -> Any:
    """Safe YAML with the bounds above."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node) > MAX_NODES:
            raise ConfigError([f"more than {MAX_NODES} values once YAML aliases are expanded"])
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _check_values(value: Any, where: str, depth: int = 0) -> None:
    """Refuse what no setting can mean: NaN and infinities, integers past 30 digits, and
    nesting past MAX_DEPTH (JSON has no aliases, but depth still costs recursion)."""
    if depth > MAX_DEPTH:
        raise ConfigError([f"{where}: nesting deeper than {MAX_DEPTH} levels"])
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError([f"{where}: found {value}, expected a finite number"])
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**MAX_INT_DIGITS:
        raise ConfigError(
            [
                f"{where}: found an integer of {len(str(abs(value)))} digits, "
                f"expected at most {MAX_INT_DIGITS}"
            ]
        )
    if isinstance(value, dict):
        for k, v in value.items():
            _check_values(v, f"{where}.{k}" if where else str(k), depth + 1)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_values(v, f"{where}[{i}]", depth + 1)


def read_file(path: str) -> dict:
    """Read a YAML or JSON config file into a dict, or raise a one-line ConfigError."""
    data = _parse(path, _read_text(path))
    if data is None:
        raise ConfigError(
            [f"{path}: config file is empty; expected a mapping with model, data, reward"]
        )
    if not isinstance(data, dict):
        raise ConfigError(
            [f"{path}: expected a mapping at the top level, found {type(data).__name__}"]
        )
    try:
        _check_values(data, "")
    except ConfigError as exc:
        raise ConfigError([f"{path}: {p}" for p in exc.problems]) from exc
    return data


def _read_text(path: str) -> str:
    """The text of the regular file at ``path``, read only up to MAX_BYTES + 1 bytes so a
    huge file is refused without loading it; a one-line ConfigError for anything else."""
    if not os.path.exists(path):
        raise ConfigError([f"{path}: config file not found"])
    if os.path.isdir(path):
        raise ConfigError([f"{path}: is a directory, expected a YAML or JSON file"])
    if not os.path.isfile(path):  # a FIFO or a terminal would block the read; a device never ends
        raise ConfigError([f"{path}: not a regular file, expected a YAML or JSON file"])
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read config file ({exc.strerror or exc})"]) from exc
    if len(raw) > MAX_BYTES:
        raise ConfigError(
            [f"{path}: larger than {MAX_BYTES // 1024} KiB; a config file is expected"]
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError([f"{path}: not UTF-8 text (byte {exc.start})"]) from exc


def _parse(path: str, text: str) -> object:
    """``text`` parsed as JSON (a ``.json`` path) or YAML; a parser's error becomes a
    one-line ConfigError naming the file, and the line and column where known."""
    kind = "JSON" if path.endswith(".json") else "YAML"
    try:
        return json.loads(text) if kind == "JSON" else parse_yaml(text)
    except ConfigError as exc:
        raise ConfigError([f"{path}: {p}" for p in exc.problems]) from exc
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise ConfigError([f"{path}: invalid {kind}{_position(exc)}: {_problem(exc)}"]) from exc
    except RecursionError as exc:
        raise ConfigError([f"{path}: nesting deeper than {MAX_DEPTH} levels"]) from exc
    except ValueError as exc:  # e.g. an integer past Python's digit limit
        reason = "an integer too long to read" if "digits" in str(exc) else str(exc).splitlines()[0]
        raise ConfigError([f"{path}: invalid {kind}: {reason}"]) from exc


def _position(exc: yaml.YAMLError | json.JSONDecodeError) -> str:
    """`` at line L, column C`` (1-based) of a parser's error, or "" when it has none."""
    if isinstance(exc, json.JSONDecodeError):
        return f" at line {exc.lineno}, column {exc.colno}"
    where = getattr(exc, "problem_mark", None)
    return f" at line {where.line + 1}, column {where.column + 1}" if where else ""


def _problem(exc: yaml.YAMLError | json.JSONDecodeError) -> str:
    """What a parser's error says went wrong, without its position."""
    return getattr(exc, "problem", None) or getattr(exc, "msg", "") or str(exc)


_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def split_path(key: str) -> list[str | int]:
    """``a.b[1].c`` (as errors print paths) or ``a.b.1.c`` -> ["a", "b", 1, "c"]."""
    parts: list[str | int] = []
    pos = 0
    for m in _PART.finditer(key):
        if m.start() != pos and key[pos : m.start()] != ".":
            break
        parts.append(int(m.group(2)) if m.group(2) is not None else m.group(1))
        pos = m.end()
    if pos != len(key) or not parts:
        raise ConfigError([f"--set {key[:100]}: not a key path (expected a.b.c or a.b[1].c)"])
    if len(parts) > MAX_DEPTH:  # as in a file: nesting costs recursion
        raise ConfigError([f"--set {key[:40]}...: nesting deeper than {MAX_DEPTH} levels"])
    return [int(p) if isinstance(p, str) and p.isdigit() else p for p in parts]


def apply_overrides(config: dict, overrides: list[str], moved=lambda key: key) -> dict:
    """Apply ``key.path=value`` overrides; the value is read as YAML (``3``, ``true``, ``[a]``).
    ``moved`` maps a deprecated key path to its current one."""
    config = copy.deepcopy(config)
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError([f"--set {item!r}: expected key.path=value"])
        key, raw = item.split("=", 1)
        key = moved(key)
        value = scalar(raw)
        _check_values(value, f"--set {key}")
        parts = split_path(key)
        node: Any = config
        for i, part in enumerate(parts):
            where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts[:i])
            if isinstance(node, list):
                if not isinstance(part, int) or part >= len(node):
                    raise ConfigError(
                        [
                            f"--set {key}: {part!r} is not an index of the list at "
                            f"{where.lstrip('.')}"
                        ]
                    )
            elif not isinstance(node, dict) or isinstance(part, int):
                raise ConfigError(
                    [f"--set {key}: {where.lstrip('.') or 'the config'} is not a mapping"]
                )
            if i == len(parts) - 1:
                node[part] = value
            else:
                if isinstance(node, dict) and not isinstance(node.get(part), (dict, list)):
                    node[part] = {}
                node = node[part]
    return config


def with_values(config: dict, values: dict[str, Any]) -> dict:
    """A copy of ``config`` (as written, before validation) with each dotted key path of
    ``values`` set (``{"train.seed": 3}``), sections made where missing: how code that
    writes a config for a run (a comparison, a probe) changes it."""
    config = copy.deepcopy(config)
    for key, value in values.items():
        *parents, last = key.split(".")
        node = config
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[last] = copy.deepcopy(value)
    return config


def scalar(raw: str) -> Any:
    """Read an override value as YAML, but take ``3e-3`` as a number (YAML 1.1 would not)."""
    try:
        value = parse_yaml(raw)
    except (yaml.YAMLError, ConfigError, ValueError, RecursionError):
        return raw
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


# --- ${env:NAME}: secrets and machine-specific values kept out of the config file ---------

_ENV_REF = re.compile(r"\$\{env:([^}]*)\}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class Resolved(str):
    """A config string whose ``${env:NAME}`` references were replaced by the variables'
    values: plugins read it as the plain string it is. ``template`` keeps the text as it was
    written, and the template is all that a file the run writes may hold (see
    :func:`unresolved`), so an API key given through the environment never lands in
    ``config.json``, a checkpoint or a tracker. Making one registers its value as a secret
    (grpo_core.config.redact), also where it is unpickled, in a reward's worker process."""

    template: str

    def __new__(cls, value: str, template: str) -> Resolved:
        obj = super().__new__(cls, value)
        obj.template = template
        register_resolved(value, template)
        return obj

    def __reduce__(self):  # pickling (reward worker processes) keeps both forms
        return (Resolved, (str(self), self.template))

    def __deepcopy__(self, memo: dict) -> Resolved:
        return self


def resolve_env(value: Any, where: str = "", problems: list[str] | None = None) -> Any:
    """``value`` with every ``${env:NAME}`` inside a string replaced by the environment
    variable's value (as text; a string may hold several, among other text). Strings that
    held a reference become :class:`Resolved`. A variable that is not set, or a malformed
    reference, adds one line to ``problems`` (raised as a ConfigError when none is given)."""
    found: list[str] = [] if problems is None else problems
    out = _resolve(value, where, found)
    if problems is None and found:
        raise ConfigError(found)
    return out


def _resolve(value: Any, where: str, problems: list[str]) -> Any:
    if isinstance(value, dict):
        return {
            k: _resolve(v, f"{where}.{k}" if where else str(k), problems) for k, v in value.items()
        }
    if isinstance(value, list):
        return [_resolve(v, f"{where}[{i}]", problems) for i, v in enumerate(value)]
    if not isinstance(value, str) or isinstance(value, Resolved) or "${env:" not in value:
        return value

    def sub(m: re.Match) -> str:
        name = m.group(1)
        if not _ENV_NAME.match(name):
            problems.append(
                f"{where}: ${{env:{name}}} does not name an environment variable "
                f"(letters, digits and _)"
            )
            return ""
        if name not in os.environ:
            problems.append(
                f"{where}: environment variable {name} is not set (the config "
                f"reads ${{env:{name}}})"
            )
            return ""
        return os.environ[name]

    return Resolved(_ENV_REF.sub(sub, value), value)


def unresolved(value: Any) -> Any:
    """A copy of a config with every resolved string back in its ``${env:NAME}`` form: what
    ``config.json``, checkpoints, trackers and printed configs hold."""
    if isinstance(value, dict):
        return {k: unresolved(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unresolved(v) for v in value]
    if isinstance(value, Resolved):
        return value.template
    return value
