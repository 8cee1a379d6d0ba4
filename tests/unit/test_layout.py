"""The core's shape: no import cycle, the tools above the core, every package installed, a
short loop. (Function size is bounded by ruff's complexity rule, C901, run in CI.)"""

from __future__ import annotations

import ast
import inspect
import os

from helpers import ROOT

from grpo_core import trainer

CORE = os.path.join(ROOT, "grpo_core")


def modules() -> dict[str, str]:
    """grpo_core module name -> file, every package and module."""
    out = {}
    for folder, _, files in os.walk(CORE):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, f), ROOT)[:-3].replace(os.sep, ".")
                out[rel.removesuffix(".__init__")] = os.path.join(folder, f)
    return out


def imports(path: str, known: set[str]) -> set[str]:
    """grpo_core modules a file imports, at top level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from pkg import mod` imports the module; `from pkg import name`, the package
            names = [
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
                for a in node.names
            ]
        found |= {n for n in names if n in known}
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {m: imports(p, known) - {m} for m, p in mods.items()}


def test_no_import_cycle_in_the_core():
    g = graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(g[m]):
            if state.get(n) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(n) :] + [n]))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m)
    assert "grpo_core.trainer" in g and "grpo_core.cli.main" in g  # the walk saw the tree


def test_the_core_never_imports_the_tools():
    g = graph()
    core = [m for m in g if not m.startswith(("grpo_core.cli", "grpo_core.integrations"))]
    offenders = {m: sorted(n for n in g[m] if n.startswith("grpo_core.cli")) for m in core}
    assert not any(offenders.values()), offenders


def test_every_package_is_installed():
    """pyproject.toml lists packages by hand (plugins/ installs as grpo_core_plugins): a folder
    missing from the list would import from a checkout and fail from an installed wheel."""
    import tomllib

    listed = set(
        tomllib.load(open(os.path.join(ROOT, "pyproject.toml"), "rb"))["tool"]["setuptools"][
            "packages"
        ]
    )
    found = set()
    for top, name in (("grpo_core", "grpo_core"), ("plugins", "grpo_core_plugins")):
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            if "__init__.py" in files:
                rel = os.path.relpath(folder, os.path.join(ROOT, top))
                found.add(name if rel == "." else f"{name}.{rel.replace(os.sep, '.')}")
    assert found == listed, (sorted(found - listed), sorted(listed - found))


def test_the_training_loop_reads_on_one_screen():
    lines = inspect.getsource(trainer.train).splitlines()
    assert len(lines) <= 80, len(lines)


def test_the_trainer_never_probes_plugins():
    """Plugins declare what they need (grpo_core.hookspecs); the loop reads declarations."""
    for name in ("trainer", "run", "phases"):
        tree = ast.parse(open(os.path.join(CORE, f"{name}.py"), encoding="utf-8").read())
        probes = [
            n.lineno
            for n in ast.walk(tree)
            if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Name)
            and n.func.id in ("getattr", "hasattr")
        ]
        assert not probes, (name, probes)
