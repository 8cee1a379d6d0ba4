"""The ``code`` reward: extraction, stdin/stdout and assert tests, partial credit, data
errors, its config inside ``weighted`` with a gate, a short training run; and the sandbox
against hostile programs, each of which must score 0 while the reward goes on scoring.

Every hostile program is written so that the attack succeeding would make it pass its test
(it prints what it stole, or "ok" after the forbidden act): a 0 means the attack failed, not
merely that the output differed. Work is bounded (CPU seconds per run, a 1 MiB output cap,
a 5-step bounded fork loop); the wall-clock limits given are generous and only end hangs.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types

import pytest
from grpo_core_plugins.rewards import sandbox
from grpo_core_plugins.rewards.code import CodeReward, extract_program, last_block, same_output
from helpers import ROOT, make_config, run_grpo

import grpo_core
from grpo_core import config
from grpo_core.cli import plugin_tools
from grpo_core.hookspecs import Reward, hookimpl
from grpo_core.registry import registry

ADD = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
ADD_TESTS = [{"input": "1 2\n", "output": "3\n"}, {"input": "-4 4\n", "output": "0\n"}]

# CPU limit 2 s per run (3 s to the kernel's SIGKILL); 300 s of wall clock can only mean a
# hang, even on a machine loaded 30x (the sleep test, which needs the wall clock, has its own).
HOSTILE = {"timeout": 2, "wall_timeout": 300, "parallel": 2}


def code(body: str) -> str:
    return f"Here is my solution.\n```python\n{body}\n```\n"


def score(options: dict, completions: list[str], tests) -> tuple[list[float], list[str]]:
    reward = grpo_core.create("reward", "code", options)
    out = reward(["p"] * len(completions), completions, tests=[tests] * len(completions))
    return list(out), out.extras["code_result"]


def hostile(body: str, want: str) -> tuple[float, str]:
    """(score, what happened) of a hostile program whose test expects ``want`` on stdout,
    run in one batch with a program that just prints ``want``, which must still pass: the
    reward goes on after whatever the hostile one did."""
    honest = code(f"print({want!r}, end='')")
    scores, why = score(HOSTILE, [code(body), honest], [{"input": "1 2\n", "output": want}])
    assert scores[1] == 1.0, why
    return scores[0], why[0]


# --- extraction and comparison ------------------------------------------------------------


def test_last_python_block_is_the_program():
    text = "```python\nprint(1)\n```\nthen\n```py\nprint(2)\n```\n```cpp\nint main(){}\n```"
    assert last_block(text) == "print(2)\n"  # the cpp block is skipped whole
    assert last_block("```\nx = 1\n```") == "x = 1\n"  # an untagged block counts
    assert last_block("```python\nprint(1)\n") is None  # cut off: never closed
    assert extract_program("print(3)", "block") is None
    assert extract_program("print(3)", "block_or_whole") == "print(3)"
    assert extract_program("```python\nprint(4)\n```", "whole").startswith("```")
    assert extract_program("x" * 300_000, "whole") is None  # over MAX_CHARS


def test_output_comparison_modes():
    assert same_output(b"3  \n\n", "3\n", "lines") and not same_output(b"3 4", "3\n4", "lines")
    assert same_output(b"3 4\n", "3\n4", "tokens") and not same_output(b"3\n", "3", "exact")


# --- scoring -----------------------------------------------------------------------------


def test_stdio_tests_all_or_nothing_and_partial():
    wrong_second = code("a, b = map(int, input().split())\nprint(a + b if a > 0 else 7)")
    completions = [ADD, wrong_second, "no code here", code("import os\nos._exit(0)")]
    scores, why = score({}, completions, ADD_TESTS)
    assert scores == [1.0, 0.0, 0.0, 0.0]
    assert why[0] == "passed 2/2" and why[1] == "test 2: wrong output"
    assert why[2] == "no program found"
    scores, why = score({"partial": True}, completions, ADD_TESTS)
    assert scores == [1.0, 0.5, 0.0, 0.0]


def test_a_repeated_program_runs_once_per_call(monkeypatch):
    runs = []
    real = sandbox.run
    monkeypatch.setattr(sandbox, "run", lambda *a, **k: runs.append(a[0]) or real(*a, **k))
    reward = grpo_core.create("reward", "code", {})
    other = code("a, b = map(int, input().split())\nprint(b + a)")
    out = reward(["p"] * 4, [ADD, ADD, other, ADD], tests=[ADD_TESTS] * 4)
    assert list(out) == [1.0] * 4 and len(runs) == 2 * len(ADD_TESTS)  # two programs


def test_large_input_and_output_closed_before_exit():
    big = "7 " * 500_000  # 1 MB on stdin, written while the program runs
    count = code("print(len(open('/dev/stdin').read().split()))\nimport sys\nsys.stdout.close()")
    scores, why = score({}, [count], [{"input": big, "output": "500000\n"}])
    assert scores == [1.0], why


def test_without_namespaces_the_hook_still_refuses_and_required_refuses_to_build(
    monkeypatch, pong_server
):
    # stands in for a machine where unshare cannot make namespaces (this one can)
    monkeypatch.setattr(sandbox, "isolation", lambda: sandbox.Isolation((), False, False, False))
    with pytest.raises(grpo_core.errors.PluginError, match="network_isolation is 'required'"):
        grpo_core.create("reward", "code", {"network_isolation": "required"})
    port, accepted = pong_server
    body = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=10)\n"
    got, why = hostile(body + "print(s.recv(100).decode(), end='')", "pong\n")
    assert got == 0.0 and "socket" in why and accepted == []


def test_stdio_tests_from_json_text_and_from_two_columns():
    as_text = json.dumps({"inputs": ["1 2\n", "5 6\n"], "outputs": ["3\n", "11\n"]})
    assert score({}, [ADD, code("print(3)")], as_text)[0] == [1.0, 0.0]
    reward = grpo_core.create("reward", "code", {"input_column": "i", "output_column": "o"})
    out = reward(["p", "p"], [ADD, ADD], i=["1 2", ["2 2", "3 3"]], o=["3", ["4", "5"]])
    assert list(out) == [1.0, 0.0]  # 3 3 -> 6, not 5
    assert type(reward).columns_for({"input_column": "i", "output_column": "o"}) == ("i", "o")


def test_assert_tests_and_early_exit_is_no_pass():
    tests = ["assert f(1) == 2", "assert f(10) == 11"]
    completions = [
        code("def f(x):\n    return x + 1"),
        code("def f(x):\n    return 2"),
        code("import sys\nsys.exit(0)\ndef f(x):\n    return x"),  # leaves before the tests
        code("import os\nos._exit(0)"),
    ]
    scores, why = score({"mode": "assert", "partial": True}, completions, tests)
    assert scores == [1.0, 0.5, 0.0, 0.0], why
    assert "exited before the tests' end" in why[3]


def test_malformed_tests_name_the_column_and_item():
    reward = grpo_core.create("reward", "code", {})
    with pytest.raises(ValueError, match=r"column 'tests', item 1: expected a list"):
        reward(["p", "p"], [ADD, ADD], tests=[ADD_TESTS, 5])
    with pytest.raises(ValueError, match="no column 'tests'"):
        reward(["p"], [ADD], answer=["3"])


def test_options_that_do_not_fit_are_config_errors(tmp_path):
    cfg = make_config(
        "m",
        "d.jsonl",
        str(tmp_path / "run"),
        reward={"name": "code", "options": {"input_column": "i", "mode": "assert"}},
    )
    with pytest.raises(grpo_core.errors.ConfigError, match="output_column: give both"):
        config.validate(cfg)


# --- hostile programs: each scores 0, and the correct one beside it 1 ------------------------


def test_fork_bomb_scores_zero():
    body = "import os\nfirst = os.getpid()\nfor _ in range(5):  # 32 processes at most\n"
    body += "    os.fork()\nif os.getpid() != first:\n    os._exit(0)\nprint(3)"
    got, why = hostile(body, "3\n")
    assert got == 0.0 and "os.fork refused" in why


def test_infinite_loop_is_stopped_by_the_cpu_limit():
    got, why = hostile("while True:\n    pass", "3\n")
    assert got == 0.0 and "exit status" in why


def test_sleeping_forever_is_stopped_by_the_wall_clock():
    # wall_timeout 5 s: the program sleeps 10**6 s, so only the kill can end it
    scores, why = score(
        {"timeout": 1, "wall_timeout": 5}, [code("import time\ntime.sleep(10**6)")], ADD_TESTS
    )
    assert scores == [0.0] and why == ["test 1: wall-clock timeout"]


def test_ten_gigabyte_allocation_scores_zero():
    got, why = hostile("x = bytearray(10 * 1024**3)\nprint(3)", "3\n")
    assert got == 0.0 and "MemoryError" in why


def test_printing_a_gigabyte_is_cut_at_the_cap():
    body = "import sys\nchunk = 'x' * 2**20\nfor _ in range(1024):\n    sys.stdout.write(chunk)"
    got, why = hostile(body, "3\n")
    assert got == 0.0 and "output over max_output_bytes" in why
    result = sandbox.run(body, b"", sandbox.Limits(cpu=2, wall=300, max_output_bytes=1 << 16))
    assert result.overflow and len(result.stdout) == 1 << 16  # read no further than the cap


def test_writing_outside_the_directory_fails_and_its_own_directory_is_removed(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the runs' directories go
    target = tmp_path / "escaped.txt"
    got, why = hostile(f"open({str(target)!r}, 'w').write('x')\nprint(3)", "3\n")
    assert got == 0.0 and "open refused" in why and not target.exists()
    got, _ = hostile("open('../escaped.txt', 'w').write('x')\nprint(3)", "3\n")
    assert got == 0.0 and not target.exists()
    inside = "open('notes.txt', 'w').write('3')\nprint(open('notes.txt').read())"
    assert hostile(inside, "3\n")[0] == 1.0  # its own directory is writable
    assert os.listdir(tmp_path) == []  # every run's directory was removed


def test_reading_ssh_keys_fails(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text("FAKE-PRIVATE-KEY-4242\n")
    monkeypatch.setenv("HOME", str(home))  # the trainer's HOME
    want = "FAKE-PRIVATE-KEY-4242\n"
    by_home = "import os\nprint(open(os.path.expanduser('~/.ssh/id_rsa')).read(), end='')"
    got, why = hostile(by_home, want)
    assert got == 0.0 and "No such file" in why  # HOME is the run's own empty directory
    by_path = f"print(open({str(home / '.ssh' / 'id_rsa')!r}).read(), end='')"
    got, why = hostile(by_path, want)
    assert got == 0.0 and "open refused" in why
    listing = f"import os\nprint(os.listdir({str(home / '.ssh')!r}))"
    assert hostile(listing, "['id_rsa']\n")[0] == 0.0


def test_the_trainers_environment_is_not_visible(monkeypatch):
    monkeypatch.setenv("GRPO_TEST_API_TOKEN", "tok-5ecret-value")
    got, _ = hostile(
        "import os\nprint(os.environ.get('GRPO_TEST_API_TOKEN'))", "tok-5ecret-value\n"
    )
    assert got == 0.0
    proc_environ = "print(open('/proc/self/environ').read())"
    assert hostile(proc_environ, "tok-5ecret-value\n")[0] == 0.0
    names = "import os\nprint(' '.join(sorted(os.environ)))"
    assert hostile(names, "HOME LANG LC_ALL PATH TMPDIR\n")[0] == 1.0  # all it gets


@pytest.fixture
def pong_server():
    """A TCP server on 127.0.0.1 that answers every connection with "pong"; yields (port,
    list of accepted connections)."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list = []

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            accepted.append(conn)
            conn.sendall(b"pong\n")
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1], accepted
    server.close()


def test_network_connect_to_a_local_server_fails(pong_server):
    port, accepted = pong_server
    body = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=10)\n"
    body += "print(s.recv(100).decode(), end='')"
    got, why = hostile(body, "pong\n")
    assert got == 0.0 and "refused" in why and accepted == []
    if not sandbox.isolation().network:
        pytest.skip("no network namespace here: only the audit hook stops sockets (safety.md)")
    # the namespace alone, without the audit hook: the loopback is down
    result = sandbox.run(body, b"", sandbox.Limits(cpu=2, wall=300), guard=False)
    assert not result.ok and b"unreachable" in result.stderr and accepted == []


def test_a_killed_reward_process_leaves_no_program_behind(tmp_path):
    if not sandbox.isolation().tethered:
        pytest.skip("setpriv --pdeathsig is not available here: see docs/safety.md")
    work = tmp_path / "runs"
    work.mkdir()
    # a process standing in for a reward worker killed past reward.timeout mid-run
    script = (
        "import sys, tempfile\nfrom grpo_core_plugins.rewards import sandbox\n"
        f"tempfile.tempdir = {str(work)!r}\nprint('go', flush=True)\n"
        "sandbox.run('import time\\ntime.sleep(10**6)', b'', sandbox.Limits(cpu=1, wall=10**6))"
    )
    worker = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    assert worker.stdout.readline() == b"go\n"
    for _ in range(600):  # until the program runs in its directory (60 s: a loaded machine)
        if _running_in(work):
            break
        time.sleep(0.1)
    assert _running_in(work), "the sandboxed program never started"
    worker.kill()
    worker.wait()
    for _ in range(600):  # the kernel kills it with its parent (60 s allowed)
        if not _running_in(work):
            break
        time.sleep(0.1)
    assert not _running_in(work)


def _running_in(folder) -> list[int]:
    """Processes whose working directory is under ``folder``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/cwd").startswith(str(folder)):
                found.append(int(pid))
        except OSError:
            pass
    return found


def test_memory_limit_holds_without_the_audit_hook():
    result = sandbox.run(
        "x = bytearray(10 * 1024**3)", b"", sandbox.Limits(cpu=2, wall=300), guard=False
    )
    assert result.returncode != 0 and b"MemoryError" in result.stderr


# --- in a config, inside weighted with a gate, and in a short training run -----------------


def test_gated_inside_weighted():
    reward = grpo_core.create(
        "reward",
        "weighted",
        {
            "components": [
                {
                    "name": "format",
                    "options": {"tags": [], "patterns": ["```python"]},
                    "as": "fenced",
                },
                {"name": "code", "requires": ["fenced"]},
            ]
        },
    )
    out = reward(
        ["p"] * 3, [ADD, "print(1)", code("print(1)")], tests=[ADD_TESTS] * 3, group_ids=[0, 0, 0]
    )
    assert list(out) == [2.0, 0.0, 1.0] and out.dimensions["code"] == [1.0, 0.0, 0.0]
    assert reward.max_value == 2.0


def test_short_training_run_with_the_code_reward(tiny_model, tmp_path):
    from grpo_core.trainer import train

    data = tmp_path / "problems.jsonl"
    rows = [
        {"prompt": f"{i}+1=", "tests": [{"input": "", "output": f"{i + 1}\n"}]} for i in range(4)
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    reward = {
        "name": "weighted",
        "options": {
            "components": [
                {"name": "format", "options": {"tags": [], "patterns": ["[0-9]"]}, "as": "digit"},
                # whole completion as the program, so every completion really runs
                {
                    "name": "code",
                    "options": {"extract": "whole", "timeout": 2},
                    "requires": ["digit"],
                },
            ]
        },
    }
    cfg = make_config(
        tiny_model,
        str(data),
        str(tmp_path / "run"),
        data={"path": str(data), "columns": ["tests"]},
        reward=reward,
        train={"steps": 2, "prompts_per_step": 2},
    )
    summary = train(config.validate(cfg))
    assert summary["steps"] == 2
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert len(rows) == 2 and all(0 <= r["reward/code"] <= 1 for r in rows)
    samples = [json.loads(line) for line in open(tmp_path / "run" / "samples.jsonl")]
    # every completion was run as a program (the tiny model's are not valid ones)
    assert samples and all(
        s["extras"]["code_result"].startswith(("test 1: ", "passed")) for s in samples
    )


def test_the_example_config_validates_and_its_problems_are_solvable():
    example = os.path.join(ROOT, "examples", "code_reward.yaml")
    out = run_grpo("validate", example, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    cfg = config.load(example)
    with open(os.path.join(ROOT, cfg["data"]["path"]), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    solutions = [  # one per problem, in the file's order
        "a, b = map(int, input().split())\nprint(a + b)",
        "print(input()[::-1])",
        "print(sum(c in 'aeiouAEIOU' for c in input()))",
        "n = int(input())\na, b = 0, 1\nfor _ in range(n):\n    a, b = b, a + b\nprint(a)",
    ]
    reward = grpo_core.create("reward", cfg["reward"]["name"], cfg["reward"]["options"])
    prompts = [r[cfg["data"]["prompt_field"]] for r in rows]
    out = reward(prompts, [code(s) for s in solutions], tests=[r["tests"] for r in rows])
    assert list(out) == [1.1] * len(rows), out.extras
    wrong = reward(prompts, [code("print(0)")] * len(rows), tests=[r["tests"] for r in rows])
    assert list(wrong) == [0.1] * len(rows)  # the format part only


# -- `grpo plugins check reward code`: the reward's example row (hookspecs.Reward.example_row)


@pytest.mark.parametrize(
    "options",
    [None, {"mode": "assert"}, {"input_column": "stdin", "output_column": "stdout"}],
    ids=["stdio", "assert", "two-columns"],
)
def test_plugins_check_passes_with_the_example_row(options, capsys):
    assert plugin_tools.check("reward", "code", options) == 0, capsys.readouterr().out
    assert "0 failed" in capsys.readouterr().out


@pytest.mark.parametrize("mode", ["stdio", "assert"])
def test_the_example_row_holds_tests_the_reward_reads_and_a_solution_passes(mode):
    row = CodeReward.example_row({"mode": mode, "tests_column": "tests"})
    program = ADD if mode == "stdio" else code("def add(a, b):\n    return a + b")
    reward = grpo_core.create("reward", "code", {"mode": mode, "timeout": 2, "wall_timeout": 300})
    scores = reward(["p"], [program], **{c: [v] for c, v in row.items()})
    assert list(scores) == [1.0], scores.extras


class NoExampleRow(CodeReward):
    """``code`` as a plugin without the hook: the check's made-up column is no test data."""

    example_row = Reward.example_row


class UnreadableExampleRow(CodeReward):
    @classmethod
    def example_row(cls, options):
        return {"tests": 5}


class DropsAScore(CodeReward):
    """A reward with a valid example row that returns one score too few."""

    def __call__(self, prompts, completions, **columns):
        return list(super().__call__(prompts, completions, **columns))[1:]


@pytest.mark.parametrize("broken", [NoExampleRow, UnreadableExampleRow, DropsAScore])
def test_plugins_check_still_fails_a_broken_reward(broken, capsys):
    name = f"code_{broken.__name__.lower()}"
    module = types.ModuleType(f"{name}_for_tests")
    module.reward = hookimpl(lambda register: register(name, broken), specname="reward")
    registry().add(module, f"test-{name}")
    assert plugin_tools.check("reward", name) != 0
    assert "FAIL  sample call returns the right shape and types" in capsys.readouterr().out
