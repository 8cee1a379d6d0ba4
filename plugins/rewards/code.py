"""``code``: run the completion's program against the problem's tests, in a sandbox.

The program is the completion's last fenced Python block (```` ```python ````, ```` ```py ````
or a bare ```` ``` ````; ``extract``), or the whole completion. Tests come from the dataset:

- ``stdio``: each test feeds ``input`` on stdin and expects ``output`` on stdout. The column
  ``tests_column`` holds a list of ``{"input", "output"}`` objects (or ``{"inputs": [...],
  "outputs": [...]}``, or either as a JSON string), or two columns ``input_column`` and
  ``output_column`` hold one string each or lists of equal length.
- ``assert``: ``tests_column`` holds Python test code (a string, or a list of strings, one
  test each) run after the program in the same interpreter; a test passes when the program
  and the test code run to their end (a random token printed by the launcher afterwards
  proves it, so ``sys.exit(0)`` before the tests is no pass).

Each test is one run of :func:`grpo_core_plugins.rewards.sandbox.run`: a fresh interpreter
with CPU, memory, file-size, open-file and process limits, a wall-clock limit, an empty
temporary directory and no environment of the trainer's. The score is 1 when every test
passes, else 0 (``partial``: the fraction passed; without it, a completion stops at its first
failure). Completions run ``parallel`` at a time in threads, each waiting on its own child;
the same program against the same tests (a group's repeated answers) runs once per call.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

from grpo_core_plugins.rewards import sandbox

from grpo_core.errors import PluginError
from grpo_core.hookspecs import Reward
from grpo_core.scores import Scores

MAX_CHARS = 200_000  # longest completion searched for a program; longer ones score 0
FENCE_LANGUAGES = frozenset({"", "python", "py", "python3"})


def last_block(text: str) -> str | None:
    """The body of the last closed fenced block tagged Python (or untagged) in ``text``;
    blocks in other languages are skipped whole. One pass over the lines."""
    found, skipping = None, False
    body: list[str] | None = None
    for line in text.splitlines():
        fence = line.strip()
        if body is None and not skipping:
            if fence.startswith("```"):
                language = fence[3:].strip().lower()
                body, skipping = ([], False) if language in FENCE_LANGUAGES else (None, True)
        elif fence == "```":
            if body is not None:
                found = "\n".join(body) + "\n"
            body, skipping = None, False
        elif body is not None:
            body.append(line)
    return found


def extract_program(text: str, how: str) -> str | None:
    """The program in a completion (``how``: ``block``, ``whole`` or ``block_or_whole``), or
    None when there is none."""
    if not isinstance(text, str) or len(text) > MAX_CHARS:
        return None
    if how == "whole":
        return text
    block = last_block(text)
    if block is None and how == "block_or_whole":
        return text
    return block


def same_output(got: bytes, want: str, compare: str) -> bool:
    """Whether a run's stdout is the expected output: ``lines`` ignores trailing whitespace
    on each line and trailing empty lines; ``tokens`` compares whitespace-separated tokens;
    ``exact`` compares the text as it is."""
    text = got.decode("utf-8", "replace")
    if compare == "exact":
        return text == want
    if compare == "tokens":
        return text.split() == want.split()
    return [x.rstrip() for x in text.rstrip().splitlines()] == [
        x.rstrip() for x in want.rstrip().splitlines()
    ]


class CodeReward(Reward):
    max_value = 1.0

    def __init__(
        self,
        mode: str = "stdio",
        tests_column: str = "tests",
        input_column: str | None = None,
        output_column: str | None = None,
        extract: str = "block",
        compare: str = "lines",
        partial: bool = False,
        timeout: float = 4.0,
        wall_timeout: float | None = None,
        memory_mb: int = 512,
        max_output_bytes: int = 1 << 20,
        parallel: int | None = None,
        language: str = "python",  # the only one the schema allows for now
        network_isolation: str = "auto",
    ):
        problems = self.check_options(
            {"mode": mode, "input_column": input_column, "output_column": output_column}
        )
        if problems:
            raise PluginError(f"reward code: {problems[0]}")
        self.mode, self.tests_column = mode, tests_column
        self.io_columns = (input_column, output_column) if input_column and output_column else None
        self.extract, self.compare, self.partial = extract, compare, partial
        self.limits = sandbox.Limits(
            cpu=timeout,
            wall=wall_timeout if wall_timeout is not None else 3 * timeout + 2,
            memory_mb=memory_mb,
            max_output_bytes=max_output_bytes,
        )
        self.parallel = parallel or os.cpu_count() or 1
        isolated = sandbox.isolation()  # probed here, once, before threads start runs
        if network_isolation == "required" and not isolated.network:
            raise PluginError(
                "reward code: network_isolation is 'required' but no network namespace can be "
                "made here (unshare --user --net failed); see docs/safety.md"
            )

    @classmethod
    def check_options(cls, options: dict) -> list[str]:
        """Test columns that do not fit the mode."""
        inp, out = options.get("input_column"), options.get("output_column")
        if (inp is None) != (out is None):
            return ["input_column and output_column: give both (stdio tests from two columns)"]
        if inp is not None and options.get("mode", "stdio") != "stdio":
            return [
                "input_column: only stdio tests come from two columns; assert tests come "
                "from tests_column"
            ]
        return []

    @classmethod
    def columns_for(cls, options: dict) -> tuple[str, ...]:
        if options.get("input_column"):
            return (options["input_column"], options["output_column"])
        return (options.get("tests_column", "tests"),)

    @classmethod
    def example_row(cls, options: dict) -> dict:
        """One problem's tests in the form ``options`` read (for ``grpo plugins check``):
        add two numbers read from stdin, or the same as an assert test."""
        if options.get("input_column"):
            return {options["input_column"]: "2 3\n", options["output_column"]: "5\n"}
        column = options.get("tests_column", "tests")
        if options.get("mode", "stdio") == "assert":
            return {column: ["assert add(2, 3) == 5"]}
        return {column: [{"input": "2 3\n", "output": "5\n"}]}

    def __call__(self, prompts, completions, **columns) -> Scores:
        cases = [self._cases(columns, i) for i in range(len(completions))]
        programs = [extract_program(c, self.extract) for c in completions]
        # the same program against the same tests runs once (a group's repeated answers)
        keys = [(p, repr(c)) for p, c in zip(programs, cases)]
        jobs = dict(zip(keys, zip(programs, cases)))
        with ThreadPoolExecutor(min(self.parallel, max(1, len(jobs)))) as pool:
            done = dict(zip(jobs, pool.map(lambda job: self._score(*job), jobs.values())))
        outcomes = [done[k] for k in keys]
        return Scores(
            [score for score, _ in outcomes],
            extras={"code_result": [why for _, why in outcomes]},
        )

    def _score(self, program: str | None, cases: list) -> tuple[float, str]:
        """(score, what happened) for one program against its tests."""
        if program is None:
            return 0.0, "no program found"
        passed, first_failure = 0, ""
        for i, case in enumerate(cases):
            why = self._run(program, case)
            if why is None:
                passed += 1
                continue
            first_failure = first_failure or f"test {i + 1}: {why}"
            if not self.partial:
                return 0.0, first_failure
        score = passed / len(cases) if self.partial else 1.0
        return score, first_failure or f"passed {passed}/{len(cases)}"

    def _run(self, program: str, case) -> str | None:
        """None when the program passes one test, else why not (a few words)."""
        if self.mode == "assert":
            result = sandbox.run(program + "\n" + case, b"", self.limits, token=True)
            return None if result.completed else _failure(result, "exited before the tests' end")
        stdin, want = case
        result = sandbox.run(program, stdin.encode("utf-8", "replace"), self.limits)
        if not result.ok:
            return _failure(result, "")
        return None if same_output(result.stdout, want, self.compare) else "wrong output"

    def _cases(self, columns: dict, i: int) -> list:
        """Item ``i``'s tests: (stdin, expected stdout) pairs, or test code strings."""
        if self.io_columns:
            inp, out = (_column(columns, c, i) for c in self.io_columns)
            where = f"columns {self.io_columns[0]!r}/{self.io_columns[1]!r}, item {i}"
            inputs, outputs = (v if isinstance(v, list) else [v] for v in (inp, out))
            return _pairs(inputs, outputs, where)
        value = _column(columns, self.tests_column, i)
        where = f"column {self.tests_column!r}, item {i}"
        if self.mode == "assert":
            tests = [value] if isinstance(value, str) else value
            if not (isinstance(tests, list) and tests and all(isinstance(t, str) for t in tests)):
                raise ValueError(
                    f"reward code: {where}: expected test code (a string or a "
                    f"non-empty list of strings), got {type(value).__name__}"
                )
            return tests
        return _stdio_cases(value, where)


def _column(columns: dict, name: str, i: int):
    if name not in columns:
        raise ValueError(f"reward code: no column {name!r} (add it to data.columns)")
    return columns[name][i]


def _stdio_cases(value, where: str) -> list[tuple[str, str]]:
    """(stdin, expected stdout) pairs from a list of {input, output}, {inputs, outputs}, or
    either as JSON text."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (json.JSONDecodeError, RecursionError):
            raise ValueError(f"reward code: {where}: tests are text but not JSON") from None
    if isinstance(value, dict) and "inputs" in value and "outputs" in value:
        return _pairs(value["inputs"], value["outputs"], where)
    if isinstance(value, list) and all(isinstance(t, dict) for t in value):
        return _pairs([t.get("input") for t in value], [t.get("output") for t in value], where)
    raise ValueError(
        f"reward code: {where}: expected a list of {{input, output}} objects or "
        f"{{inputs, outputs}} lists, got {type(value).__name__}"
    )


def _pairs(inputs, outputs, where: str) -> list[tuple[str, str]]:
    ok = isinstance(inputs, list) and isinstance(outputs, list) and len(inputs) == len(outputs)
    if not ok or not inputs or not all(isinstance(x, str) for x in [*inputs, *outputs]):
        raise ValueError(
            f"reward code: {where}: expected as many input as output strings, at least one of each"
        )
    return list(zip(inputs, outputs))


def _failure(result: sandbox.Result, otherwise: str) -> str:
    """Why a run failed, in a few words (its last line of stderr for an error)."""
    if result.timed_out:
        return "wall-clock timeout"
    if result.overflow:
        return "output over max_output_bytes"
    if result.returncode != 0:
        tail = result.stderr.decode("utf-8", "replace").strip().rsplit("\n", 1)[-1][:160]
        return f"exit status {result.returncode}" + (f": {tail}" if tail else "")
    return otherwise


SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "mode": {
            "enum": ["stdio", "assert"],
            "default": "stdio",
            "description": "stdio: input on stdin, expected stdout; assert: test code run "
            "after the program",
        },
        "tests_column": {
            "type": "string",
            "default": "tests",
            "description": "column of tests: a list of {input, output} (stdio) or test code "
            "(assert: a string or a list of strings)",
        },
        "input_column": {
            "type": ["string", "null"],
            "default": None,
            "description": "stdio tests from two columns: the inputs' column",
        },
        "output_column": {
            "type": ["string", "null"],
            "default": None,
            "description": "stdio tests from two columns: the expected outputs' column",
        },
        "extract": {
            "enum": ["block", "whole", "block_or_whole"],
            "default": "block",
            "description": "the program: the last ```python block, the whole completion, or "
            "the block when there is one",
        },
        "compare": {
            "enum": ["lines", "tokens", "exact"],
            "default": "lines",
            "description": "stdout against the expected output: by lines (trailing "
            "whitespace ignored), by whitespace-separated tokens, or exactly",
        },
        "partial": {
            "type": "boolean",
            "default": False,
            "description": "score the fraction of tests passed instead of all-or-nothing",
        },
        "timeout": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": 3600,
            "default": 4.0,
            "description": "CPU seconds per test (RLIMIT_CPU, rounded up)",
        },
        "wall_timeout": {
            "type": ["number", "null"],
            "exclusiveMinimum": 0,
            "default": None,
            "description": "wall-clock seconds per test, then the process group is killed "
            "(null: 3 * timeout + 2)",
        },
        "memory_mb": {
            "type": "integer",
            "minimum": 64,
            "default": 512,
            "description": "address-space limit per test (RLIMIT_AS)",
        },
        "max_output_bytes": {
            "type": "integer",
            "minimum": 1,
            "default": 1 << 20,
            "description": "stdout and stderr kept per test; past it the run is killed",
        },
        "parallel": {
            "type": ["integer", "null"],
            "minimum": 1,
            "default": None,
            "description": "completions run at once (null: the CPU count)",
        },
        "language": {"enum": ["python"], "default": "python"},
        "network_isolation": {
            "enum": ["auto", "required"],
            "default": "auto",
            "description": "required: refuse to build where no network namespace can be made",
        },
    },
}


def register(add) -> None:
    """Register the ``code`` reward with ``add`` (the package's ``reward`` hook's
    ``register``)."""
    add(
        "code",
        CodeReward,
        schema=SCHEMA,
        description="runs the completion's program against tests (stdin/stdout or asserts) "
        "in a sandbox; 1/0 or the fraction passed",
    )
