"""What ``grpo plugins`` shows and does: the installed table, conformance checks, scaffolds."""

from __future__ import annotations

from grpo_core.registry import registry

COLUMNS = ("kind", "name", "distribution", "version", "description")


def listing() -> list[dict]:
    """Every registered plugin as {kind, name, distribution, version, description}."""
    return [{"kind": p.kind, "name": p.name, "distribution": p.distribution,
             "version": p.version, "description": p.description} for p in registry().all()]


def table(rows: list[dict]) -> str:
    widths = {c: max([len(c)] + [len(str(r[c])) for r in rows]) for c in COLUMNS}
    lines = ["  ".join(c.upper().ljust(widths[c]) for c in COLUMNS)]
    lines += ["  ".join(str(r[c]).ljust(widths[c]) for c in COLUMNS) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


# --- conformance checks -----------------------------------------------------------------------

def _sample_call(kind: str, plugin):
    """One call on a sample batch of the plugin's kind; returns a comparable result."""
    import torch

    if kind == "reward":
        prompts = ["What is 2+3?", "Name a colour."] * 2
        completions = ["The answer is \\boxed{5}.", "blue", "<think>x</think>", "5"]
        columns = {"answer": ["5", "blue", "5", "5"], "completion_tokens": [8, 1, 5, 1],
                   "group_ids": [0, 0, 1, 1]}
        return list(plugin(prompts, completions, **columns)), (prompts, columns)
    if kind == "baseline":
        rewards = torch.tensor([[1.0, 0.0, 0.5, 0.0], [2.0, 2.0, 2.0, 2.0],
                                [0.3, 0.9, 0.1, 0.7]])
        greedy = torch.tensor([0.5, 2.0, 0.4]) if getattr(plugin, "needs_greedy", False) \
            else None
        return plugin.advantages(rewards, greedy), (rewards, greedy)
    if kind == "kl":
        start = plugin.value
        plugin.update(0.05, 32)
        return (start, plugin.value), None
    return None, None


def check(kind: str, name: str, options: dict | None = None) -> int:
    """``grpo plugins check``: run the conformance checks, print a report, 0 if all pass."""
    import math

    import jsonschema
    import torch

    import grpo_core
    from grpo_core.hookspecs import KINDS

    results: list[tuple[str, bool, str]] = []

    def record(label: str, ok: bool, detail: str = "") -> bool:
        results.append((label, ok, detail))
        return ok

    if kind not in KINDS:
        record("kind", False, f"{kind!r} is not one of {list(KINDS)}")
        return _report(kind, name, results)
    info = registry().plugins.get((kind, name))
    if not record("registered", info is not None,
                  f"from {info.distribution} {info.version}" if info else
                  f"no {kind} plugin {name!r}; installed: {registry().names(kind)}"):
        return _report(kind, name, results)
    try:
        jsonschema.Draft202012Validator.check_schema(info.schema)
        record("schema is valid JSON Schema", info.schema.get("type") == "object",
               "" if info.schema.get("type") == "object" else "top level must be type object")
    except jsonschema.SchemaError as exc:
        record("schema is valid JSON Schema", False, exc.message)
    try:
        plugin = grpo_core.create(kind, name, options)
        record("builds with default options", True)
    except Exception as exc:  # the report, not a traceback, is the point here
        record("builds with default options", False, f"{type(exc).__name__}: {exc}")
        return _report(kind, name, results)
    if kind == "generator":
        missing = [m for m in ("setup", "generate", "sync_weights") if not hasattr(plugin, m)]
        record("has setup, generate, sync_weights", not missing, f"missing {missing}")
        return _report(kind, name, results)
    try:
        first, _ = _sample_call(kind, plugin)
        ok, detail = True, ""
        if kind == "reward":
            ok = len(first) == 4 and all(isinstance(v, (int, float)) for v in first)
            detail = f"returned {first!r}"
        elif kind == "baseline":
            ok = isinstance(first, torch.Tensor) and first.shape == (3, 4) and bool(
                torch.isfinite(first).all())
            detail = f"returned {type(first).__name__} {getattr(first, 'shape', '')}"
        elif kind == "kl":
            state = plugin.state_dict()
            fresh = grpo_core.create(kind, name, options)
            fresh.load_state_dict(state)
            ok = all(isinstance(v, (int, float)) and math.isfinite(v) for v in first) and \
                fresh.value == plugin.value
            detail = f"value {first[0]} -> {first[1]}; state_dict round trip"
        record("sample call returns the right shape and types", ok, "" if ok else detail)
    except Exception as exc:
        record("sample call returns the right shape and types", False,
               f"{type(exc).__name__}: {exc}")
        return _report(kind, name, results)
    try:
        again, _ = _sample_call(kind, grpo_core.create(kind, name, options))
        if kind == "kl":
            first_fresh, _ = _sample_call(kind, grpo_core.create(kind, name, options))
            same = again == first_fresh
        elif kind == "baseline":
            second, _ = _sample_call(kind, grpo_core.create(kind, name, options))
            same = torch.equal(again, second)
        else:
            same = again == first
        record("same input gives the same output", bool(same))
    except Exception as exc:
        record("same input gives the same output", False, f"{type(exc).__name__}: {exc}")
    if kind == "reward":
        for label, text in (("empty completion", ""), ("very long completion", "x " * 100_000)):
            try:
                out = list(plugin(["p"], [text], answer=["1"], completion_tokens=[len(text)],
                                  group_ids=[0]))
                ok = len(out) == 1 and isinstance(out[0], (int, float))
                record(f"handles an {label}" if label[0] == "e" else f"handles a {label}", ok,
                       f"returned {out!r}")
            except Exception as exc:
                record(f"handles an {label}" if label[0] == "e" else f"handles a {label}", False,
                       f"{type(exc).__name__}: {exc}")
    return _report(kind, name, results)


def _report(kind: str, name: str, results: list[tuple[str, bool, str]]) -> int:
    for label, ok, detail in results:
        print(f"{'PASS' if ok else 'FAIL'}  {label}" + (f"  ({detail})" if detail and not ok
                                                       else ""))
    failed = sum(not ok for _, ok, _ in results)
    print(f"{kind} {name}: {len(results) - failed} passed, {failed} failed")
    return 0 if failed == 0 else 2


# --- scaffolding --------------------------------------------------------------------------------

SKELETON = {
    "reward": '''
class {cls}:
    """TODO: say what this reward measures and why."""

    def __init__(self, scale: float = 1.0):
        self.scale = scale

    def __call__(self, prompts, completions, **columns):
        # one float per completion; columns holds dataset fields and completion_tokens
        return [self.scale * min(len(c), 100) / 100 for c in completions]


@hookimpl
def reward(register):
    register("{name}", {cls}, schema=SCHEMA, description="TODO: one line")
''',
    "baseline": '''
class {cls}:
    """TODO: say what this baseline subtracts and why."""

    needs_greedy = False

    def __init__(self, scale: float = 1.0):
        self.scale = scale

    def advantages(self, rewards, greedy_rewards=None):
        # rewards: [prompts, G], NaN = missing; return the same shape
        ok = rewards.isfinite()
        mean = rewards.nan_to_num().sum(-1, keepdim=True) / ok.sum(-1, keepdim=True).clamp(min=1)
        return ((rewards - mean) * self.scale).nan_to_num()


@hookimpl
def baseline(register):
    register("{name}", {cls}, schema=SCHEMA, description="TODO: one line")
''',
    "kl": '''
class {cls}:
    """TODO: say how the coefficient moves."""

    constant = False

    def __init__(self, scale: float = 0.01):
        self.value = scale

    def update(self, kl, n_samples):
        pass

    def state_dict(self):
        return {{"value": self.value}}

    def load_state_dict(self, state):
        self.value = state["value"]


@hookimpl
def kl(register):
    register("{name}", {cls}, schema=SCHEMA, description="TODO: one line")
''',
}


def new(name: str, kind: str, out: str) -> int:
    """``grpo plugins new``: a package that passes ``grpo plugins check`` as written."""
    import keyword
    import os
    import re

    from grpo_core.errors import UserError

    if kind not in SKELETON:
        raise UserError(f"--kind: expected one of {sorted(SKELETON)} (generators are larger: "
                        f"start from plugins/hf_generator.py)")
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name) or keyword.iskeyword(name):
        raise UserError(f"plugin name {name!r}: use lower-case letters, digits and _")
    pkg = f"grpo_{name}"
    root = os.path.join(out, f"grpo-{name.replace('_', '-')}")
    if os.path.exists(root):
        raise UserError(f"{root} already exists")
    cls = "".join(p.title() for p in name.split("_"))
    os.makedirs(os.path.join(root, pkg))
    os.makedirs(os.path.join(root, "tests"))
    files = {
        "pyproject.toml": f'''[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "grpo-{name.replace('_', '-')}"
version = "0.1.0"
description = "A grpo-core {kind} plugin"
requires-python = ">=3.10"
dependencies = ["grpo-core>=0.1"]

[project.entry-points.grpo_core]
{name} = "{pkg}"

[tool.setuptools]
packages = ["{pkg}"]
''',
        f"{pkg}/__init__.py": f'''"""grpo-core {kind} plugin ``{name}``."""

from grpo_core.hookspecs import hookimpl

GRPO_CORE_API = (1,)

SCHEMA = {{
    "type": "object",
    "additionalProperties": False,
    "properties": {{"scale": {{"type": "number", "default": {1.0 if kind != "kl" else 0.01}}}}},
}}
''' + SKELETON[kind].format(cls=cls, name=name),
        f"tests/test_{name}.py": f'''import subprocess
import sys


def test_conformance():
    out = subprocess.run([sys.executable, "-m", "grpo_core.cli", "plugins", "check", "{kind}",
                          "{name}"], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
''',
        "README.md": f"# grpo-{name.replace('_', '-')}\n\nA grpo-core {kind} plugin. "
                     f"`pip install .`, then select it with `{kind}: {{name: {name}}}`.\n",
    }
    for rel, text in files.items():
        with open(os.path.join(root, rel), "w", encoding="utf-8") as f:
            f.write(text.lstrip("\n"))
    print(f"wrote {root}: pip install -e {root} && grpo plugins check {kind} {name}")
    return 0
