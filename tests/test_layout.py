"""The core's shape: no import cycle, the tools above the core, small modules, a short loop."""

from __future__ import annotations

import ast
import inspect
import os

from conftest import ROOT

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
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known
                     else node.module for a in node.names]
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
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(n):] + [n]))
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


def test_core_modules_stay_small():
    sizes = {m: sum(1 for _ in open(p, encoding="utf-8")) for m, p in modules().items()
             if not m.startswith("grpo_core.cli")}
    assert max(sizes.values()) <= 320, sorted(sizes.items(), key=lambda x: -x[1])[:3]


def test_the_training_loop_reads_on_one_screen():
    lines = inspect.getsource(trainer.train).splitlines()
    assert len(lines) <= 80, len(lines)


def test_the_trainer_never_probes_plugins():
    """Plugins declare what they need (grpo_core.hookspecs); the loop reads declarations."""
    for name in ("trainer", "run", "phases"):
        tree = ast.parse(open(os.path.join(CORE, f"{name}.py"), encoding="utf-8").read())
        probes = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call)
                  and isinstance(n.func, ast.Name) and n.func.id in ("getattr", "hasattr")]
        assert not probes, (name, probes)
