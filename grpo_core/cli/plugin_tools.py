"""What ``grpo plugins`` shows and does: the installed table, conformance checks, scaffolds."""

from __future__ import annotations

from collections.abc import Callable

from grpo_core.hookspecs import Reward
from grpo_core.registry import registry

COLUMNS = ("kind", "name", "distribution", "version", "description")


def listing() -> list[dict]:
    """Every registered plugin as {kind, name, distribution, version, description}."""
    return [
        {
            "kind": p.kind,
            "name": p.name,
            "distribution": p.distribution,
            "version": p.version,
            "description": p.description,
        }
        for p in registry().all()
    ]


def table(rows: list[dict]) -> str:
    widths = {c: max([len(c)] + [len(str(r[c])) for r in rows]) for c in COLUMNS}
    lines = ["  ".join(c.upper().ljust(widths[c]) for c in COLUMNS)]
    lines += ["  ".join(str(r[c]).ljust(widths[c]) for c in COLUMNS) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


# --- conformance checks -----------------------------------------------------------------------


def _declared(reward, options: dict) -> tuple[str, ...]:
    """The dataset columns a reward declares for ``options`` (the sample batch has them)."""
    return tuple(type(reward).columns_for(options)) if isinstance(reward, Reward) else ()


def _reward_columns(reward, options: dict, made_up: list) -> dict[str, list]:
    """The sample batch's dataset columns: ``answer`` and each declared column set to the
    made-up answers, then the reward's own ``example_row`` values (a realistic row, repeated
    per completion) where it gives one."""
    row = type(reward).example_row(options) if isinstance(reward, Reward) else {}
    return {
        "answer": made_up,
        **{c: made_up for c in _declared(reward, options)},
        **{c: [value] * len(made_up) for c, value in row.items()},
    }


def _sample_call(kind: str, plugin, options: dict):
    """One call on a sample batch of the plugin's kind; returns a comparable result."""
    import torch

    if kind == "reward":
        prompts = ["What is 2+3?", "Name a colour."] * 2
        completions = ["The answer is \\boxed{5}.", "blue", "<think>x</think>", "5"]
        answers = ["5", "blue", "5", "5"]
        columns = {
            **_reward_columns(plugin, options, answers),
            "completion_tokens": [8, 1, 5, 1],
            "group_ids": [0, 0, 1, 1],
        }
        return list(plugin(prompts, completions, **columns)), (prompts, columns)
    if kind == "baseline":
        rewards = torch.tensor([[1.0, 0.0, 0.5, 0.0], [2.0, 2.0, 2.0, 2.0], [0.3, 0.9, 0.1, 0.7]])
        greedy = torch.tensor([0.5, 2.0, 0.4]) if plugin.needs_greedy else None
        return plugin.advantages(rewards, greedy), (rewards, greedy)
    if kind == "kl":
        start = plugin.value
        plugin.update(0.05, 32)
        return (start, plugin.value), None
    if kind == "objective":
        logp = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.1]], requires_grad=True)
        old = torch.tensor([[-1.1, -0.4, -2.0], [-0.3, -1.0, -0.3]])
        mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
        term = plugin(logp, old, torch.tensor([1.0, -1.0]), mask)
        (term.loss * mask).sum().backward()
        return term, (logp.grad, mask)
    if kind == "environment":  # each text answers a fresh episode's first turn
        row = {"answer": "5", **type(plugin).example_row(options)}
        return [plugin.step(plugin.reset(dict(row)), t) for t in ENV_TEXTS], row
    return None, None


def _try_logger(plugin) -> tuple[bool, str]:
    """A logger's whole life on two steps of made-up metrics and one sample."""
    import tempfile

    try:
        with tempfile.TemporaryDirectory() as run_dir:
            plugin.start(run_dir, "check", {"model": {"name_or_path": "x"}}, 0)
            for step in range(2):
                plugin.log({"reward": 0.5 * step, "loss": 1.0 - step}, step)
            plugin.log_samples(
                [
                    {
                        "group": 0,
                        "prompt": "1+1=",
                        "completion": "2",
                        "reward": 1.0,
                        "advantage": 0.5,
                        "reward/math": 1.0,
                    }
                ],
                1,
            )
            plugin.close()
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}"
    return True, ""


def _try_callback(plugin) -> tuple[bool, str]:
    """A callback's boundaries on a made-up two-step run: each call returns, and
    ``on_step_end`` answers a bool or None."""
    import os
    import tempfile

    answers = []
    try:
        with tempfile.TemporaryDirectory() as run_dir:
            plugin.on_train_begin(run_dir, {"model": {"name_or_path": "x"}}, 0)
            for step in range(2):
                answers.append(plugin.on_step_end(step, {"step": step, "reward": 0.5}))
                plugin.on_save(step + 1, os.path.join(run_dir, "checkpoints", f"{step + 1}"))
            plugin.on_train_end({"run_dir": run_dir, "steps": 2})
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}"
    wrong = [a for a in answers if a is not None and not isinstance(a, bool)]
    if wrong:
        return False, f"on_step_end returned {wrong[0]!r}; expected True, False or None"
    return True, ""


#: first model turns an environment answers in the conformance check
ENV_TEXTS = ("5", "<calc>2+3</calc>", '<tool_call>{"name": "x"}</tool_call>', "I give up.")


def _environment_ok(plugin, out) -> tuple[bool, str]:
    """An environment's declarations have the right types and each answer is an Observation
    of a text and flags."""
    from grpo_core.hookspecs import Observation

    problems = []
    if not (
        isinstance(plugin.stop_strings, (tuple, list))
        and all(isinstance(x, str) and x for x in plugin.stop_strings)
    ):
        problems.append(f"stop_strings {plugin.stop_strings!r}: expected non-empty strings")
    if not (
        isinstance(plugin.delimiters, (tuple, list))
        and len(plugin.delimiters) == 2
        and all(isinstance(x, str) for x in plugin.delimiters)
    ):
        problems.append(f"delimiters {plugin.delimiters!r}: expected two strings")
    if not (isinstance(plugin.role, str) and plugin.role):
        problems.append(f"role {plugin.role!r}: expected a chat role")
    for o in out:
        if not (
            isinstance(o, Observation)
            and isinstance(o.text, str)
            and all(isinstance(v, bool) for v in (o.done, o.tool_call, o.tool_error))
        ):
            problems.append(
                f"step returned {o!r}, expected an Observation(text: str, done: bool, ...)"
            )
            break
    return not problems, "; ".join(problems)


Record = Callable[..., bool]  # (label, ok, detail="") -> ok: adds a line to the report


def check(kind: str, name: str, options: dict | None = None) -> int:
    """``grpo plugins check``: run the conformance checks, print a report, 0 if all pass."""
    from grpo_core.hookspecs import KINDS

    results: list[tuple[str, bool, str]] = []

    def record(label: str, ok: bool, detail: str = "") -> bool:
        results.append((label, ok, detail))
        return ok

    if kind not in KINDS:
        record("kind", False, f"{kind!r} is not one of {list(KINDS)}")
        return _report(kind, name, results)
    info = registry().plugins.get((kind, name))
    if (
        not record(
            "registered",
            info is not None,
            f"from {info.distribution} {info.version}"
            if info
            else f"no {kind} plugin {name!r}; installed: {registry().names(kind)}",
        )
        or info is None
    ):
        return _report(kind, name, results)
    _check_schema(info.schema, record)
    built, plugin = _check_builds(kind, name, options, record, info.schema.get("required", []))
    if not built or kind in ("generator", "critic"):  # they need a model: the contract is
        return _report(kind, name, results)  # all that is checked
    if kind == "logger":
        record("start, log, log_samples, close in a temporary directory", *_try_logger(plugin))
        return _report(kind, name, results)
    if kind == "callback":
        record(
            "each boundary on a two-step run; on_step_end a bool or None", *_try_callback(plugin)
        )
        return _report(kind, name, results)
    _check_calls(kind, name, plugin, info.schema, options, record)
    return _report(kind, name, results)


def _check_schema(schema: dict, record: Record) -> None:
    """Records whether a plugin's options schema is a valid JSON Schema of an object (the
    config validates options against it)."""
    import jsonschema

    try:
        jsonschema.Draft202012Validator.check_schema(schema)
        record(
            "schema is valid JSON Schema",
            schema.get("type") == "object",
            "" if schema.get("type") == "object" else "top level must be type object",
        )
    except jsonschema.SchemaError as exc:
        record("schema is valid JSON Schema", False, exc.message)


def _check_builds(
    kind: str, name: str, options: dict | None, record: Record, required: list
) -> tuple[bool, object]:
    """Builds the plugin with ``options`` and records whether that worked; returns (built,
    the plugin). A failure is reported, not raised: the report is the point. A plugin with
    required options (a judge's endpoint) cannot be checked without them: the line says how
    to give them."""
    import grpo_core

    try:
        plugin = grpo_core.create(kind, name, options)
        record("builds with default options and derives from its kind's base class", True)
    except Exception as exc:  # the report, not a traceback, is the point here
        missing = [o for o in required if o not in (options or {})]
        hint = (
            f"; it needs {', '.join(missing)}: grpo plugins check {kind} {name} --options JSON"
            if missing
            else ""
        )
        record(
            "builds with default options and derives from its kind's base class",
            False,
            f"{type(exc).__name__}: {exc}{hint}",
        )
        return False, None
    return True, plugin


def _check_calls(
    kind: str, name: str, plugin, schema: dict, options: dict | None, record: Record
) -> None:
    """The checks that call a built plugin (not a generator or logger): a sample call,
    determinism, then the edge cases of its kind."""
    from grpo_core.config import validate_options

    options = validate_options(schema, options, f"{kind}.{name}.options")
    try:
        first, extra = _sample_call(kind, plugin, options)
        ok, detail = _sample_ok(kind, name, plugin, options, first, extra)
        record("sample call returns the right shape and types", ok, "" if ok else detail)
    except Exception as exc:
        record(
            "sample call returns the right shape and types", False, f"{type(exc).__name__}: {exc}"
        )
        return
    _check_repeatable(kind, name, options, first, record)
    if kind == "environment":
        _check_environment_edges(plugin, extra, record)
    if kind == "reward":
        _check_reward_edges(plugin, options, record)


def _sample_ok(kind: str, name: str, plugin, options: dict, first, extra) -> tuple[bool, str]:
    """Whether the sample call's result (``first``, with ``extra`` from _sample_call) has
    the shape and types its kind promises; (ok, what it returned)."""
    import math

    import torch

    import grpo_core

    ok, detail = True, ""
    if kind == "reward":
        ok = len(first) == 4 and all(isinstance(v, (int, float)) for v in first)
        detail = f"returned {first!r}"
    elif kind == "baseline":
        ok = (
            isinstance(first, torch.Tensor)
            and first.shape == (3, 4)
            and bool(torch.isfinite(first).all())
        )
        detail = f"returned {type(first).__name__} {getattr(first, 'shape', '')}"
    elif kind == "objective":
        grad, mask = extra
        ok = (
            first.loss.shape == mask.shape
            and bool(torch.isfinite(first.loss).all())
            and all(v.shape == mask.shape for v in first.counts.values())
            and bool((grad[mask.bool()] != 0).any())
        )
        detail = f"loss {tuple(first.loss.shape)}, counts {list(first.counts)}"
    elif kind == "kl":
        state = plugin.state_dict()
        fresh = grpo_core.create(kind, name, options)
        fresh.load_state_dict(state)
        ok = (
            all(isinstance(v, (int, float)) and math.isfinite(v) for v in first)
            and fresh.value == plugin.value
        )
        detail = f"value {first[0]} -> {first[1]}; state_dict round trip"
    elif kind == "environment":
        ok, detail = _environment_ok(plugin, first)
    return ok, detail


def _check_repeatable(kind: str, name: str, options: dict, first, record: Record) -> None:
    """Records whether a fresh plugin given the same input gives the same output (stateful
    kinds are compared fresh against fresh)."""
    import torch

    import grpo_core

    try:
        again, _ = _sample_call(kind, grpo_core.create(kind, name, options), options)
        if kind == "kl":
            first_fresh, _ = _sample_call(kind, grpo_core.create(kind, name, options), options)
            same = again == first_fresh
        elif kind == "objective":
            same = torch.equal(again.loss, first.loss)
        elif kind == "baseline":
            second, _ = _sample_call(kind, grpo_core.create(kind, name, options), options)
            same = torch.equal(again, second)
        else:
            same = again == first
        record("same input gives the same output", bool(same))
    except Exception as exc:
        record("same input gives the same output", False, f"{type(exc).__name__}: {exc}")


def _check_environment_edges(plugin, row: dict, record: Record) -> None:
    """Records whether an environment answers an empty and a very long first turn with a
    well-formed Observation."""
    for label, text in (("an empty turn", ""), ("a very long turn", "x " * 100_000)):
        try:
            out = plugin.step(plugin.reset(dict(row)), text)
            ok, detail = _environment_ok(plugin, [out])
            record(f"handles {label}", ok, detail)
        except Exception as exc:
            record(f"handles {label}", False, f"{type(exc).__name__}: {exc}")


def _check_reward_edges(plugin, options: dict, record: Record) -> None:
    """Records whether a reward scores an empty and a very long completion with one
    number each."""
    for label, text in (("empty completion", ""), ("very long completion", "x " * 100_000)):
        try:
            columns = _reward_columns(plugin, options, ["1"])
            out = list(
                plugin(["p"], [text], **columns, completion_tokens=[len(text)], group_ids=[0])
            )
            ok = len(out) == 1 and isinstance(out[0], (int, float))
            record(
                f"handles an {label}" if label[0] == "e" else f"handles a {label}",
                ok,
                f"returned {out!r}",
            )
        except Exception as exc:
            record(
                f"handles an {label}" if label[0] == "e" else f"handles a {label}",
                False,
                f"{type(exc).__name__}: {exc}",
            )


def _report(kind: str, name: str, results: list[tuple[str, bool, str]]) -> int:
    for label, ok, detail in results:
        print(
            f"{'PASS' if ok else 'FAIL'}  {label}" + (f"  ({detail})" if detail and not ok else "")
        )
    failed = sum(not ok for _, ok, _ in results)
    print(f"{kind} {name}: {len(results) - failed} passed, {failed} failed")
    return 0 if failed == 0 else 2


# --- scaffolding --------------------------------------------------------------------------------

SKELETON = {
    "reward": '''
class {cls}(Reward):
    """TODO: say what this reward measures and why."""

    def __init__(self, scale: float = 1.0):
        self.scale = scale
        self.max_value = scale  # the best score, if there is one (None otherwise)

    @classmethod
    def columns_for(cls, options: dict) -> tuple[str, ...]:
        return ()  # the dataset fields __call__ reads; grpo validate checks the data has them

    def __call__(self, prompts, completions, **columns):
        # one float per completion; columns holds dataset fields and completion_tokens
        return [self.scale * min(len(c), 100) / 100 for c in completions]


@hookimpl
def reward(register):
    register("{name}", {cls}, schema=SCHEMA, description="TODO: one line")
''',
    "baseline": '''
class {cls}(Baseline):
    """TODO: say what this baseline subtracts and why."""

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
class {cls}(KLController):
    """TODO: say how the coefficient moves."""

    def __init__(self, scale: float = 0.01):
        self.value = scale

    def update(self, kl, n_samples):
        pass  # state_dict / load_state_dict of the base class keep self.value


@hookimpl
def kl(register):
    register("{name}", {cls}, schema=SCHEMA, description="TODO: one line")
''',
    "objective": '''
class {cls}(Objective):
    """TODO: say what this objective optimises and why."""

    def __init__(self, scale: float = 1.0):
        self.scale = scale

    def __call__(self, logp, old_logp, advantages, mask):
        # logp, old_logp, mask: [B, T]; advantages: [B] -> per-token loss [B, T]
        ratio = torch.exp(logp - old_logp)
        return PolicyTerm(-self.scale * ratio * advantages[:, None])


@hookimpl
def objective(register):
    register("{name}", {cls}, schema=SCHEMA, description="TODO: one line")
''',
    "callback": '''
class {cls}(Callback):
    """TODO: say what runs at the step boundaries, and why."""

    def __init__(self, scale: float = 1.0):
        self.scale = scale  # stop once the reward has fallen this far below its best
        self.best = None

    def on_step_end(self, step, metrics):
        # metrics: the step's record, as metrics.jsonl has it; True ends the run after it
        reward = metrics.get("reward")
        if reward is None:
            return None
        self.best = reward if self.best is None else max(self.best, reward)
        return reward < self.best - self.scale


@hookimpl
def callback(register):
    register("{name}", {cls}, schema=SCHEMA, description="TODO: one line")
''',
    "environment": '''
class {cls}(Environment):
    """TODO: say what the model talks to, and when an episode ends."""

    role = "user"  # chat role of observations ("tool" for a tool's results)
    stop_strings = ()  # strings that end a model turn besides EOS (a tool call's closing tag)
    delimiters = ("\\n", "\\n")  # around an observation when there is no chat template

    def __init__(self, scale: float = 1.0):
        self.limit = max(1, round(20 * scale))  # words an answer may have

    def reset(self, row):
        # one episode per trajectory; row is the dataset row. Keep per-episode data in the
        # state you return, never on self (one instance serves every episode)
        return {{"turns": 0}}

    def step(self, state, text):
        # text: the model's turn; return the observation, or done=True to end the episode
        state["turns"] += 1
        if len(text.split()) <= self.limit:
            return Observation("thanks", done=True)
        return Observation(f"shorter, please: at most {{self.limit}} words")


@hookimpl
def environment(register):
    register("{name}", {cls}, schema=SCHEMA, description="TODO: one line")
''',
}

BASES = {
    "reward": "Reward",
    "baseline": "Baseline",
    "kl": "KLController",
    "objective": "Objective, PolicyTerm",
    "environment": "Environment, Observation",
    "callback": "Callback",
}


def new(name: str, kind: str, out: str) -> int:
    """``grpo plugins new``: a package that passes ``grpo plugins check`` as written."""
    import keyword
    import os
    import re

    from grpo_core.errors import UserError

    if kind not in SKELETON:
        raise UserError(
            f"--kind: expected one of {sorted(SKELETON)} (generators are larger: "
            f"start from plugins/generators/hf.py)"
        )
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name) or keyword.iskeyword(name):
        raise UserError(f"plugin name {name!r}: use lower-case letters, digits and _")
    pkg = f"grpo_{name}"
    root = os.path.join(out, f"grpo-{name.replace('_', '-')}")
    if os.path.exists(root):
        raise UserError(f"{root} already exists")
    cls = "".join(p.title() for p in name.split("_"))
    imports = "\nimport torch\n" if kind == "objective" else ""
    api = "(3,)" if kind == "callback" else "(2, 3)"  # API 3 added callbacks, nothing else
    try:
        os.makedirs(os.path.join(root, pkg))
        os.makedirs(os.path.join(root, "tests"))
    except OSError as exc:
        raise UserError(f"--out: cannot create {root}: {exc.strerror or exc}") from exc
    files = {
        "pyproject.toml": f'''[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "grpo-{name.replace("_", "-")}"
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
{imports}
from grpo_core.hookspecs import {BASES[kind]}, hookimpl

GRPO_CORE_API = {api}

SCHEMA = {{
    "type": "object",
    "additionalProperties": False,
    "properties": {{"scale": {{"type": "number", "default": {1.0 if kind != "kl" else 0.01}}}}},
}}
'''
        + SKELETON[kind].format(cls=cls, name=name),
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
