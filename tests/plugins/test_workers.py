"""The killable worker pool: results, time budget, crashes, memory limit, set-up state, clean
shutdown, and callers that multiprocessing's spawn cannot serve (unguarded script, script on
stdin, notebook-style exec), each in a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from helpers import ROOT

from grpo_core.workers import WorkerCrashed, WorkerError, WorkerFailure, WorkerPool, WorkerTimeout

HELPERS = """
import os, time

def make_state(k):
    return {"k": k, "pid": os.getpid(), "calls": 0}

def work(state, x):
    state["calls"] += 1
    return state["k"] * x, state["pid"], state["calls"]

def noisy(x):
    print("plugin output on stdout", x)  # must not disturb the channel
    return x + 1

def boom(x):
    raise KeyError(f"no {x}")
"""


@pytest.fixture(scope="module")
def helpers(tmp_path_factory):
    """A module the workers import by name, found through the sys.path the pool passes on."""
    root = tmp_path_factory.mktemp("helpers")
    (root / "wp_helpers.py").write_text(HELPERS)
    sys.path.insert(0, str(root))
    yield "wp_helpers"
    sys.path.remove(str(root))


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def gone(pids, within: float = 300.0) -> bool:  # a hang guard: killed processes go at once
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("fork_server", [True, False])
def test_setup_runs_once_per_worker_and_results_keep_order(helpers, fork_server):
    with WorkerPool(
        f"{helpers}:work",
        setup=f"{helpers}:make_state",
        setup_args=(3,),
        size=2,
        fork_server=fork_server,
    ) as pool:
        out = pool.map(list(range(40)), timeout=5)
        assert [r[0] for r in out] == [3 * x for x in range(40)]
        pids = {r[1] for r in out}
        assert os.getpid() not in pids and 1 <= len(pids) <= 2
        for pid in pids:  # per worker, the calls counter counts up: one state, set up once
            calls = [r[2] for r in out if r[1] == pid]
            assert calls == list(range(1, len(calls) + 1))


def test_errors_and_stdout_do_not_break_the_channel(helpers, capfd):
    with WorkerPool(f"{helpers}:noisy", size=1) as pool:
        assert pool.map([1, 2], timeout=5) == [2, 3]
    with WorkerPool(f"{helpers}:boom", size=1) as pool:
        out = pool.map(["a", "b"], timeout=5)
    assert all(isinstance(r, WorkerError) and r.type_name == "KeyError" for r in out)
    assert "no a" in str(out[0]) and "boom" in out[0].trace
    with WorkerPool("math:sqrt", size=1) as pool:
        out = pool.map([16, lambda: 0, 4], timeout=5)  # a payload that cannot be pickled
    assert out[0] == 4.0 and isinstance(out[1], WorkerError) and out[2] == 2.0


def test_timeout_kills_and_replaces_the_worker_from_any_thread():
    pool = WorkerPool("time:sleep", size=2)
    result = {}

    def run():
        result["out"] = pool.map([0.05, 3600, 0.05, 0.05], timeout=0.5)

    t = threading.Thread(target=run)  # no signals: works off the main thread
    t.start()
    t.join(600)  # a hang guard (ten minutes): the hour-long item must be cut, not waited for
    assert not t.is_alive()
    out = result["out"]
    assert isinstance(out[1], WorkerTimeout) and isinstance(out[1], WorkerFailure)
    assert out[0] is None and out[2] is None and out[3] is None
    assert pool.timeouts == 1
    assert pool.map([0.01, 0.01], timeout=5) == [None, None]  # a replacement serves
    assert pool.wait_ready(60) and pool.started == 3 and len(pool.workers) == 2
    pool.close()


def test_crash_is_reported_and_the_rest_still_run():
    with WorkerPool("os:_exit", size=1) as pool:
        out = pool.map([3, 1], timeout=5)
        assert all(isinstance(r, WorkerCrashed) for r in out)
        assert pool.crashes == 2
    with WorkerPool("math:factorial", size=1) as pool:
        assert pool.map([3, 4], timeout=5) == [6, 24]


def test_memory_limit_fails_only_the_big_item():
    with WorkerPool("builtins:bytearray", size=1, memory_mb=400) as pool:
        out = pool.map([10, 3 * 10**9, 10], timeout=10)
    assert out[0] == bytearray(10) and out[2] == bytearray(10)
    assert isinstance(out[1], (WorkerError, WorkerCrashed))
    if isinstance(out[1], WorkerError):
        assert out[1].type_name == "MemoryError"


def test_a_target_that_cannot_be_imported_raises():
    pool = WorkerPool("no_such_module_xyz:f", size=1, boot_timeout=30)
    with pytest.raises(RuntimeError, match="no_such_module_xyz"):
        pool.map([1], timeout=5)
    pool.close()


def test_close_leaves_no_processes():
    pool = WorkerPool("time:sleep", size=3)
    assert pool.wait_ready(60)
    pids = [w.pid for w in pool.workers] + [pool.server[0].pid]
    assert all(alive(p) for p in pids)
    pool.map([0.01, 5], timeout=0.3)
    pids += [w.pid for w in pool.workers]
    pool.close()
    assert gone(pids), [p for p in pids if alive(p)]


UNGUARDED = textwrap.dedent("""
    import time
    t0 = time.perf_counter()
    print("top level ran")
    from grpo_core.integrations.trl import trl_reward
    from grpo_core.workers import WorkerPool
    reward = trl_reward("math")
    t1 = time.perf_counter()
    scores = reward(prompts=["q"] * 3, completions=["\\\\boxed{x+1}", "\\\\boxed{\\\\frac{1}{2}}",
                    "it is 7"], answer=["1+x", "0.5", "8"])
    print(f"first call: imports and create {t1 - t0:.2f} s, then the call {time.perf_counter() - t1:.2f} s")
    print("scores", scores)
    with WorkerPool("math:sqrt", size=2) as pool:
        print("pool", pool.map([4.0, 9.0], timeout=10))
""")


def run_python(args, stdin=None):
    return subprocess.run(
        [sys.executable, *args], input=stdin, capture_output=True, text=True, timeout=300, cwd=ROOT
    )


def check_output(proc):
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("top level ran") == 1, proc.stdout  # never re-imported
    assert "scores [1.0, 1.0, 0.0]" in proc.stdout
    assert "pool [2.0, 3.0]" in proc.stdout
    for line in proc.stdout.splitlines():
        if line.startswith("first call"):
            print(line)  # shown with -s; a loaded 2-core CI machine is no place to assert it


def test_unguarded_script(tmp_path):
    script = tmp_path / "quickstart.py"
    script.write_text(UNGUARDED)
    check_output(run_python([str(script)]))


def test_script_on_stdin():
    check_output(run_python(["-"], stdin=UNGUARDED))


def test_notebook_style_callers():
    check_output(run_python(["-c", UNGUARDED]))
    exec_in_fresh_namespace = f"exec(compile({UNGUARDED!r}, '<cell>', 'exec'), {{}})"
    check_output(run_python(["-c", exec_in_fresh_namespace]))


def descendants(pid: int) -> set[int]:
    """The live processes below ``pid`` (its children, theirs, ...)."""
    parent = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                parent[int(name)] = int(fields[1])
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        found.update(kids)
        todo += kids
    return found


def test_components_of_one_kind_share_their_workers():
    """Forty ``math`` components started forty pools (42 processes, 1.15 GB) before."""
    import grpo_core

    before = descendants(os.getpid())
    components = [{"name": "math", "as": f"m{i}"} for i in range(40)]
    r = grpo_core.create("reward", "weighted", {"components": components})
    try:
        scores = r(["q"] * 2, ["\\boxed{\\frac{1}{2}}", "\\boxed{x+1}"], answer=["0.5", "1+x"])
        assert list(scores) == [40.0, 40.0]  # each component: both right
        started = descendants(os.getpid()) - before
        # one pool: its fork server and its workers (two by default)
        assert 1 <= len(started) <= 3, len(started)
    finally:
        for p in r.parts:
            p["fn"].close()
    assert gone(started)


def test_too_many_components_are_refused_by_validate(tmp_path):
    from grpo_core import config
    from grpo_core.errors import ConfigError

    cfg = {
        "model": {"name_or_path": "m"},
        "data": {"path": os.path.join(ROOT, "tests", "data", "prompts.jsonl")},
        "reward": {
            "name": "weighted",
            "options": {"components": [{"name": "format", "as": f"f{i}"} for i in range(257)]},
        },
    }
    with pytest.raises(ConfigError) as info:
        config.validate(cfg)
    assert any("256" in p and "components" in p for p in info.value.problems), info.value.problems
