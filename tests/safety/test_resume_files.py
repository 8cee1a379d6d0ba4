"""A resumed run repeats nothing (issues #52, #53): after a SIGKILL and ``--resume``, every
per-step file the run keeps (``metrics.jsonl``, ``samples.jsonl``, ``samples.txt``) holds each
step once, byte for byte what an uninterrupted run writes, even when the kill cut a line in
the middle of its write. (The asynchronous loop's case is in
tests/multiprocess/test_async.py.)"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

from helpers import ROOT, make_config, write_config

from grpo_core.observe.metrics import truncate_step_files

FILES = ("metrics.jsonl", "samples.jsonl", "samples.txt")
HANG = 600  # seconds: a guard against a hang only, never a bound on speed
#: what a SIGKILL in the middle of each file's write leaves at its end (a write is one system
#: call, which no signal from a test can land inside reliably: the cut is planted)
CUT = {
    "metrics.jsonl": '{"step": 9, "reward": 0.',
    "samples.jsonl": '{"step": 9, "group": 0, "prompt": "1+',
    "samples.txt": "--- step 9 group 0 rew",
}


def config(tiny_model, data, out, steps=4):
    return make_config(
        tiny_model,
        data,
        out,
        # in the trainer's process: one process fewer to start per run
        reward={
            "name": "format",
            "options": {"tags": [], "patterns": ["[0-9]"]},
            "isolation": "inline",
        },
        sampling={"group_size": 2, "max_new_tokens": 4},
        train={"steps": steps, "prompts_per_step": 2, "micro_batch_groups": 2, "seed": 5},
        runtime={"device": "cpu", "threads": 1},  # the same kernels: the same bits
        output={"dir": out, "checkpoint_every": 1, "progress": False, "samples_every": 1},
    )


def lines(out: str) -> int:
    path = os.path.join(out, "metrics.jsonl")
    return sum(1 for _ in open(path)) if os.path.exists(path) else 0


def grpo_train(path: str, *flags: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "grpo_core.cli", "train", path, *flags],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def read(out: str, name: str) -> str:
    with open(os.path.join(out, name), encoding="utf-8") as f:
        return f.read()


def test_sigkill_mid_write_then_resume_repeats_no_line(tiny_model, addition_data, tmp_path):
    whole, cut = str(tmp_path / "whole"), str(tmp_path / "cut")
    done = grpo_train(write_config(tmp_path / "w.json", config(tiny_model, addition_data, whole)))
    assert done.wait(HANG) == 0, done.stderr.read()
    path = write_config(tmp_path / "c.json", config(tiny_model, addition_data, cut))
    p = grpo_train(path)
    try:
        t0 = time.monotonic()
        while lines(cut) < 2:  # steps 0 and 1 written; killed in the steps after
            assert p.poll() is None and time.monotonic() - t0 < HANG, p.stderr.read()
            time.sleep(0.02)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    for name, tail in CUT.items():
        with open(os.path.join(cut, name), "a", encoding="utf-8") as f:
            f.write(tail)
    resumed = grpo_train(path, "--resume")
    assert resumed.wait(HANG) == 0, resumed.stderr.read()
    err = resumed.stderr.read()
    assert "resumed from" in err, err
    for name in ("samples.jsonl", "samples.txt"):  # each step once, as the whole run wrote it
        assert read(cut, name) == read(whole, name), name
    got, want = ([json.loads(x) for x in open(os.path.join(d, FILES[0]))] for d in (cut, whole))
    assert [r["step"] for r in got] == [0, 1, 2, 3]  # timings differ; the results do not
    assert [(r["reward"], r["completion_len"]) for r in got] == [
        (r["reward"], r["completion_len"]) for r in want
    ]
    steps = [json.loads(x)["step"] for x in open(os.path.join(cut, "samples.jsonl"))]
    assert steps == sorted(steps) and sorted(set(steps)) == [0, 1, 2, 3]


def test_truncation_keeps_the_steps_before_and_rebuilds_the_text(tmp_path):
    """The cut alone: rows from the step on, and a line cut short, are dropped; the text file
    is rebuilt from the rows kept, a non-finite value (JSON null) reading nan."""
    rows = [
        {
            "step": s,
            "group": g,
            "prompt": f"p{s}",
            "completion": "a\n--- step 0 group 0 reward 1.000",  # hostile: looks like a header
            "reward": None if s == 1 else 0.5,
            "advantage": -0.25,
            "dimensions": {"math": None if s == 1 else 1.0},
            "extras": {},
        }
        for s in range(4)
        for g in range(2)
    ]
    (tmp_path / "samples.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows) + CUT["samples.jsonl"]
    )
    (tmp_path / "samples.txt").write_text("anything" + CUT["samples.txt"])
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s}) + "\n" for s in range(4)) + CUT["metrics.jsonl"]
    )
    truncate_step_files(str(tmp_path), 2)
    kept = [json.loads(x) for x in open(tmp_path / "samples.jsonl")]
    assert kept == rows[:4]
    assert [json.loads(x)["step"] for x in open(tmp_path / "metrics.jsonl")] == [0, 1]
    text = (tmp_path / "samples.txt").read_text()
    assert text.count("PROMPT: ") == 4 and "anything" not in text and "rew\n" not in text
    assert "--- step 1 group 1 reward nan advantage -0.250 {'math': nan}\nPROMPT: p1\n" in text
    assert text.startswith("--- step 0 group 0 reward 0.500 advantage -0.250 {'math': 1.0}\n")


def test_sigkill_then_resume_logs_each_step_once_to_the_runs_own_mlflow(
    tiny_model, addition_data, tmp_path
):
    """The MLflow store in the run directory (the default without a tracking URI): killed
    after a step was logged but before its checkpoint, the resumed run logs that step again;
    the active MLflow run must hold each step's metric points and table once."""
    import pytest

    pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
    from mlflow.tracking import MlflowClient

    out = str(tmp_path / "cut")
    cfg = config(tiny_model, addition_data, out, steps=6)
    cfg["output"] = {**cfg["output"], "checkpoint_every": 2, "loggers": [{"name": "mlflow"}]}
    path = write_config(tmp_path / "c.json", cfg)
    p = grpo_train(path)
    try:
        t0 = time.monotonic()
        while lines(out) < 1:  # the store is made before the first step
            assert p.poll() is None and time.monotonic() - t0 < HANG, p.stderr.read()
            time.sleep(0.02)
        client = MlflowClient(f"sqlite:///{out}/mlflow/mlflow.db")
        (exp,) = [e for e in client.search_experiments() if e.name == "grpo-core"]
        (killed,) = client.search_runs([exp.experiment_id])
        logged: list[int] = []
        while max(logged, default=0) < 2:  # step 2 logged, checkpoint after step 1 only
            assert p.poll() is None and time.monotonic() - t0 < HANG, p.stderr.read()
            time.sleep(0.05)
            logged = [m.step for m in client.get_metric_history(killed.info.run_id, "reward")]
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    # as if the kill had landed before any later checkpoint's rename: the oldest one is kept,
    # so the resumed run replays steps the store already holds
    first, *later = sorted(
        glob.glob(os.path.join(out, "**", "step-*", "state.json"), recursive=True)
    )
    for state in later:
        shutil.rmtree(os.path.dirname(state))
    logged = [m.step for m in client.get_metric_history(killed.info.run_id, "reward")]
    assert json.load(open(first))["step"] <= max(logged)
    resumed = grpo_train(path, "--resume")
    assert resumed.wait(HANG) == 0, resumed.stderr.read()
    (run,) = client.search_runs([exp.experiment_id])  # the active one
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "reward")]
    want = [json.loads(x) for x in open(os.path.join(out, FILES[0]))]
    assert steps == [r["step"] for r in want] == list(range(6))
    got = sorted(client.get_metric_history(run.info.run_id, "reward"), key=lambda m: m.step)
    assert [m.value for m in got] == [r["reward"] for r in want]
    assert run.data.tags["grpo_run_id"] == killed.data.tags["grpo_run_id"]
    tables = [f.path for f in client.list_artifacts(run.info.run_id, "completions")]
    assert tables == [f"completions/step-{s:08d}.json" for s in range(6)]
    for name in tables:  # each step's 2 prompts x 2 completions, once
        local = client.download_artifacts(run.info.run_id, name, str(tmp_path / "t"))
        assert len(json.load(open(local))["data"]) == 4, name
    assert [f.path for f in client.list_artifacts(run.info.run_id)][0] == "completions"
    assert "config.json" in [f.path for f in client.list_artifacts(run.info.run_id)]
