"""The core's shape: no import cycle between modules nor between folders, the tools above the
core, the pure loss functions apart from the code that runs models, plugins on the documented
contract, every package installed, a short loop. (Function size is bounded by ruff's
complexity rule, C901, run in CI.)

Imports are what a module loads: at top level or inside functions, not those under
``if TYPE_CHECKING:``, which only name types for annotations (the strategies name the
``Run`` they are handed, and the run holds them)."""

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


def _loaded(tree: ast.AST):
    """The nodes of a module outside ``if TYPE_CHECKING:`` blocks."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in (
            "TYPE_CHECKING",
            "typing.TYPE_CHECKING",
        ):
            yield from (n for child in node.orelse for n in [child, *_loaded(child)])
            continue
        yield node
        yield from _loaded(node)


def import_names(path: str) -> list[tuple[str, list[str]]]:
    """(module, names) of every absolute import a file makes when loaded."""
    found = []
    for node in _loaded(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, [a.name for a in node.names]))
    return found


def imports(path: str, known: set[str]) -> set[str]:
    """grpo_core modules a file imports, at top level or inside functions."""
    found = set()
    for node in _loaded(ast.parse(open(path, encoding="utf-8").read())):
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


def folder(module: str) -> str:
    """A module's folder under grpo_core (``grpo_core.loss.groups`` -> ``loss``); a module at
    the top is a folder of its own (``grpo_core.phases`` -> ``phases``)."""
    return module.split(".")[1] if "." in module else module


def test_no_folder_imports_one_that_imports_it_back():
    g = graph()
    edges: dict[str, set[str]] = {}
    for m, ns in g.items():
        edges.setdefault(folder(m), set()).update(folder(n) for n in ns if folder(n) != folder(m))

    def reaches(a: str, b: str) -> list[str] | None:
        """A path of folder imports from a to b, if any."""
        seen, todo = {a}, [[a]]
        while todo:
            path = todo.pop()
            for n in sorted(edges.get(path[-1], ())):
                if n == b:
                    return path + [n]
                if n not in seen:
                    seen.add(n)
                    todo.append(path + [n])
        return None

    cycles = [reaches(b, a) for a in sorted(edges) for b in sorted(edges[a])]
    cycles = [[*c[-1:], *c] for c in cycles if c]
    assert not cycles, cycles[0]
    assert {"loss", "model", "samplers", "targets", "config"} <= set(edges)  # the walk saw them


def test_the_config_is_the_ground_floor():
    """config/ reads and checks what a run is asked to do; beside itself it imports only the
    contract (hookspecs, registry, errors, the sampling settings in rollout), so everything
    can read the config and nothing it imports reads it back."""
    g = graph()
    above = {
        m: sorted(n for n in ns if folder(n) != "config" and n not in GROUND)
        for m, ns in g.items()
        if folder(m) == "config"
    }
    assert not any(above.values()), above


GROUND = {"grpo_core.errors", "grpo_core.hookspecs", "grpo_core.registry", "grpo_core.rollout"}


def test_the_loss_is_torch_the_records_and_itself():
    """grpo_core/loss holds pure tensor functions: torch, the standard library, the records
    (rollout; the objective's PolicyTerm in the contract) and its own modules; the code that
    runs and loads models is grpo_core/model."""
    import sys

    allowed = ("grpo_core.loss", "grpo_core.rollout", "grpo_core.records", "grpo_core.hookspecs")
    found = {}
    for m, path in modules().items():
        if folder(m) != "loss":
            continue
        for module, _ in import_names(path):
            top = module.split(".")[0]
            ok = module.startswith(allowed) or top in ("torch", "__future__")
            if not ok and (top == "grpo_core" or top not in sys.stdlib_module_names):
                found.setdefault(m, []).append(module)
    assert not found, found


#: what docs/plugins.md lists as the contract a plugin may import from grpo_core
CONTRACT_HEADING = "## What a plugin may import"


def contract_modules() -> set[str]:
    text = open(os.path.join(ROOT, "docs", "plugins.md"), encoding="utf-8").read()
    section = text.split(CONTRACT_HEADING, 1)[1].split("\n## ", 1)[0]
    return {line.split("`")[1] for line in section.splitlines() if line.startswith("- `grpo_core")}


def off_contract(module: str, names: list[str], contract: set[str], known: set[str]) -> list[str]:
    """The grpo_core modules an import reaches that the contract does not list: the public face
    ``grpo_core`` gives its names, but a submodule imported through it counts as itself; a
    listed module covers the modules below it."""
    if module.split(".")[0] != "grpo_core":
        return []
    # `from pkg import mod` reaches the module; `from pkg import name`, the package
    reached = [f"{module}.{n}" if f"{module}.{n}" in known else module for n in names or [""]]
    reached = [m for m in reached if m != "grpo_core"]  # the public face's own names
    listed = contract - {"grpo_core"}
    return [m for m in reached if not any(m == c or m.startswith(c + ".") for c in listed)]


def test_plugins_import_only_the_documented_contract():
    contract, known = contract_modules(), set(modules())
    assert {"grpo_core", "grpo_core.hookspecs", "grpo_core.scores"} <= contract  # section read
    assert off_contract("grpo_core.engine.zero", ["x"], contract, known)  # the rule can fail
    assert off_contract("grpo_core", ["phases"], contract, known)
    found = {}
    for folder_, _, files in os.walk(os.path.join(ROOT, "plugins")):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder_, f)
                for module, names in import_names(path):
                    bad = off_contract(module, names, contract, known)
                    if bad:
                        found.setdefault(os.path.relpath(path, ROOT), []).extend(bad)
    assert not found, found


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
    spine = ["trainer.py", "run.py", "phases.py", "plan.py", "records.py", "saving.py"]
    spine += [
        f"{d}/{f}" for d in ("samplers", "targets") for f in os.listdir(os.path.join(CORE, d))
    ]
    for name in [n for n in spine if n.endswith(".py")]:
        tree = ast.parse(open(os.path.join(CORE, name), encoding="utf-8").read())
        probes = [
            n.lineno
            for n in ast.walk(tree)
            if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Name)
            and n.func.id in ("getattr", "hasattr")
        ]
        assert not probes, (name, probes)
