"""Asynchronous rollouts (grpo_core.overlap), with the real generator process: exact at
k = 0, bounded staleness at k = 1 and 2, nothing lost or repeated across a SIGKILL and
--resume, and no silent hang when either side dies or stalls."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from helpers import ROOT, make_config, write_config
from safetensors.torch import load_file

from grpo_core import config
from grpo_core.cli.main import main
from grpo_core.data.prompts import PromptStream
from grpo_core.errors import UserError
from grpo_core.trainer import train

pytestmark = pytest.mark.multiprocess


def _cfg(model: str, data: str, out: str, steps: int = 4, **sampling) -> dict:
    """Two prompts a step (the samples file shows both), one thread per process: the same
    kernels in both processes give the same bits."""
    return make_config(
        model,
        data,
        out,
        sampling={"group_size": 4, "max_new_tokens": 6, **sampling},
        train={"steps": steps, "prompts_per_step": 2, "micro_batch_groups": 2, "seed": 0},
        runtime={"device": "cpu", "threads": 1},
    )


def _metrics(out: str) -> list[dict]:
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _samples(out: str) -> dict[int, list[tuple[str, str]]]:
    """Each step's (prompt, completion) pairs (a resumed run keeps each step once)."""
    steps: dict[int, list] = {}
    with open(os.path.join(out, "samples.jsonl"), encoding="utf-8") as f:
        for rec in map(json.loads, f):
            steps.setdefault(rec["step"], []).append((rec["prompt"], rec["completion"]))
    return steps


def _final(out: str) -> dict[str, torch.Tensor]:
    return load_file(os.path.join(out, "final", "model.safetensors"))


def test_k0_in_its_own_process_equals_the_synchronous_loop(warm_model, addition_data, tmp_path):
    """Tolerance zero, from the arithmetic: the generator process holds a bit-exact copy of
    the weights (a memcpy through shared memory), runs the same kernels on one thread on the
    same prompts and noise, so its logits, tokens and log-probs are the same bits; the
    trainer then computes the same loss from the same inputs in the same order."""
    runs = {}
    for name, generation in (("inline", "inline"), ("process", "process")):
        out = str(tmp_path / name)
        train(config.validate(_cfg(warm_model, addition_data, out, generation=generation)))
        runs[name] = out
    a, b = (_metrics(runs[n]) for n in ("inline", "process"))
    assert any(r["reward"] > 0 for r in a) and any(r["loss"] != 0 for r in a)  # it learns
    for ra, rb in zip(a, b, strict=True):
        for key in ("reward", "loss", "loss/policy", "grad_norm", "entropy"):
            assert ra[key] == rb[key], (ra["step"], key)
        assert rb["async/staleness"] == 0
    assert _samples(runs["inline"]) == _samples(runs["process"])
    wa, wb = _final(runs["inline"]), _final(runs["process"])
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize("k", [1, 2])
def test_no_rollout_is_older_than_k(tiny_model, addition_data, tmp_path, k):
    out = str(tmp_path / "run")
    cfg = _cfg(tiny_model, addition_data, out, steps=5, max_staleness=k)
    cfg["objective"] = {"name": "grpo", "tis": {"cap": 1.5, "level": "sequence"}}
    train(config.validate(cfg))
    records = _metrics(out)
    assert [r["async/staleness"] for r in records] == [min(s, k) for s in range(5)]
    assert all(r["async/version"] == max(r["step"] - k, 0) for r in records)
    assert all(0 < r["async/tis_weight"] <= 1.5 for r in records)


@pytest.mark.parametrize(
    ("sections", "field"),
    [
        ({"sampling": {"max_staleness": 1, "generation": "inline"}}, "sampling.max_staleness"),
        ({"sampling": {"max_staleness": 1}, "groups": {"dynamic_sampling": True}}, "groups.dyn"),
        ({"sampling": {"generation": "process"}, "model": {"lora": {"r": 4}}}, "model.lora"),
    ],
)
def test_what_it_cannot_run_is_refused_in_one_line(
    tiny_model, addition_data, tmp_path, sections, field
):
    cfg = make_config(tiny_model, addition_data, str(tmp_path / "run"))
    for key, value in sections.items():
        cfg[key] = {**cfg.get(key, {}), **value}
    with pytest.raises(UserError) as err:
        train(config.validate(cfg))
    message = str(err.value)
    assert message.startswith(field) and "generation" in message and "\n" not in message


# -- real processes: the CLI, killed --------------------------------------------------------


def _start(cfg: dict, tmp_path, *args: str) -> subprocess.Popen:
    path = write_config(tmp_path / f"config-{len(os.listdir(tmp_path))}.json", cfg)
    return subprocess.Popen(
        [sys.executable, "-m", "grpo_core.cli", "train", path, *args],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _generator_of(pid: int) -> int | None:
    """The pid of the trainer ``pid``'s generator process, if it runs."""
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat", encoding="utf-8") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{name}/cmdline", encoding="utf-8") as f:
                cmd = f.read()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid and "grpo_core.overlap" in cmd:
            return int(name)
    return None


def _until(check, timeout: float = 600.0, what: str = ""):
    # a hang guard, not a bound on speed: ten minutes, which a loaded machine cannot reach
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = check()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _lines(out: str) -> int:
    try:
        with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie has ended
    except OSError:
        return True


def test_sigkill_then_resume_trains_every_prompt_once(warm_model, addition_data, tmp_path):
    """k = 2, a checkpoint every 2 steps; SIGKILL the trainer mid-run, then --resume. The
    generator dies with it; the resumed run trains each step on the prompts of the data
    order, with the same completions and final weights as an uninterrupted run: the
    checkpoint kept the rollouts already sampled for the next two steps."""
    steps, whole, cut = 12, str(tmp_path / "whole"), str(tmp_path / "cut")
    cfg = _cfg(warm_model, addition_data, cut, steps=steps, max_staleness=2)
    cfg["output"]["checkpoint_every"] = 2
    proc = _start(cfg, tmp_path)
    generator = _until(lambda: _generator_of(proc.pid), what="the generator process")
    _until(lambda: _lines(cut) >= 3 or proc.poll() is not None, what="three steps")
    assert proc.poll() is None, "the run ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    _until(lambda: _gone(generator), what="the generator process to end with its trainer")
    assert _lines(cut) < steps
    kept = os.path.join(cut, "checkpoints")
    written = [d for d in os.listdir(kept) if d.startswith("step-")]
    assert written and all(os.path.isfile(os.path.join(kept, d, "inflight.pt")) for d in written)
    # what a kill in the middle of a samples write leaves (one system call, which no signal
    # from a test lands inside reliably: planted)
    for name, tail in (
        ("samples.jsonl", '{"step": 9, "group": 0, "pro'),
        ("samples.txt", "--- st"),
    ):
        with open(os.path.join(cut, name), "a", encoding="utf-8") as f:
            f.write(tail)
    resumed = _start(cfg, tmp_path, "--resume")
    assert resumed.wait(timeout=600) == 0, resumed.stderr.read()
    train(config.validate({**cfg, "output": {**cfg["output"], "dir": whole}}))
    for name in ("samples.jsonl", "samples.txt"):  # each step once, as the whole run wrote it
        with open(os.path.join(cut, name), encoding="utf-8") as a:
            with open(os.path.join(whole, name), encoding="utf-8") as b:
                assert a.read() == b.read(), name

    order = PromptStream([json.loads(x) for x in open(addition_data, encoding="utf-8")], 0)
    got, want = _samples(cut), _samples(whole)
    assert sorted(got) == list(range(steps)) and got == want
    expected = [order.take(2) for _ in range(steps)]
    for s in range(steps):  # each step's prompts are the data order's next two
        assert [p for p, _ in got[s][::4]] == [r["prompt"] for r in expected[s]]
    wa, wb = _final(cut), _final(whole)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def _one_line(stderr: str, needle: str) -> str:
    lines = [x for x in stderr.splitlines() if needle in x]
    assert len(lines) == 1, stderr[-2000:]
    return lines[0]


def test_a_killed_generator_ends_the_run_naming_it(tiny_model, addition_data, tmp_path):
    out = str(tmp_path / "run")
    proc = _start(_cfg(tiny_model, addition_data, out, steps=200, max_staleness=1), tmp_path)
    generator = _until(lambda: _generator_of(proc.pid), what="the generator process")
    _until(lambda: _lines(out) >= 1, what="a step")
    os.kill(generator, signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    line = _one_line(err, "generator process died")
    assert "at step" in line and "waited" in line


def test_a_stalled_generator_times_out_naming_it(tiny_model, addition_data, tmp_path):
    out = str(tmp_path / "run")
    cfg = _cfg(tiny_model, addition_data, out, steps=200, max_staleness=1, generation_timeout=3)
    proc = _start(cfg, tmp_path)
    generator = _until(lambda: _generator_of(proc.pid), what="the generator process")
    _until(lambda: _lines(out) >= 1, what="a step")
    os.kill(generator, signal.SIGSTOP)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    line = _one_line(err, "generator process stalled")
    assert "waited 3 s for the rollout of step" in line
    _until(lambda: _gone(generator), what="the stopped generator to end with its trainer")


def test_a_stalled_trainer_ends_its_generator(tiny_model, addition_data, tmp_path):
    out = str(tmp_path / "run")
    cfg = _cfg(tiny_model, addition_data, out, steps=200, max_staleness=1, generation_timeout=3)
    proc = _start(cfg, tmp_path)
    generator = _until(lambda: _generator_of(proc.pid), what="the generator process")
    _until(lambda: _lines(out) >= 1, what="a step")
    proc.send_signal(signal.SIGSTOP)
    try:
        _until(lambda: _gone(generator), what="the generator to give up on its trainer")
    finally:
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    line = _one_line(err, "grpo generator process:")
    assert "waited 3 s for" in line and "from the trainer" in line


def test_grpo_validate_refuses_it_too(tiny_model, addition_data, tmp_path, capsys):
    cfg = make_config(tiny_model, addition_data, str(tmp_path / "run"))
    cfg["sampling"]["max_staleness"] = 2
    cfg["groups"] = {"resample_zero_std_max": 2}
    assert main(["validate", write_config(tmp_path / "c.json", cfg)]) != 0
    assert "groups.resample_zero_std_max: is not supported with asynchronous" in (
        capsys.readouterr().err
    )


def test_sigkill_while_the_generator_starts_leaves_no_shared_file(
    tiny_model, addition_data, tmp_path
):
    """The moment that left the weights file in /dev/shm until reboot: the generator process
    has started and not yet mapped it."""
    from grpo_core.overlap.weights import _shm_dir

    cfg = _cfg(tiny_model, addition_data, str(tmp_path / "run"), steps=50, max_staleness=1)
    proc = _start(cfg, tmp_path)
    try:
        generator = _until(lambda: _generator_of(proc.pid), what="the generator process")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    _until(lambda: _gone(generator), what="the generator process to end with its trainer")
    assert not glob.glob(os.path.join(_shm_dir(), f"grpo-weights-{proc.pid}-*"))
