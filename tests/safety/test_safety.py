"""Issue #30: resolved secrets never printed or written, ``--overwrite`` never deleting a
run's inputs, SIGINT/SIGTERM stopping with a checkpoint, and bad values and late refusals
ending in one line. Real runs (the tiny model), real subprocesses, signals and HTTP servers."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from helpers import ROOT, make_config, run_grpo, write_config
from test_hardening import cfg_for, cli, one_line_error

from grpo_core import Scores, config
from grpo_core.config.file import resolve_env
from grpo_core.config.redact import redact
from grpo_core.data.prompts import TRUNCATE, fit_prompts, make_batch
from grpo_core.hookspecs import hookimpl
from grpo_core.registry import registry
from grpo_core.store import checkpoint
from grpo_core.store.models import load_tokenizer
from grpo_core.trainer import train

SECRET = "sk-live-5d1b7e9a3c2f4e6d8b0a"


def every_file(root) -> list[str]:
    return [os.path.join(d, f) for d, _, files in os.walk(root) for f in files]


def leaks(root, *outputs: str) -> list[str]:
    """Files under ``root`` and outputs that hold the secret."""
    found = [f for f in every_file(root) if SECRET.encode() in open(f, "rb").read()]
    return found + [f"output {i}" for i, text in enumerate(outputs) if SECRET in text]


# --- secrets ----------------------------------------------------------------------------


def test_a_resolved_value_is_redacted_wherever_it_is_printed(monkeypatch, capsys):
    monkeypatch.setenv("GRPO_T_SECRET", SECRET)
    resolved = resolve_env({"h": "Bearer ${env:GRPO_T_SECRET}"})["h"]
    assert resolved == f"Bearer {SECRET}"
    assert (
        redact(f"401 for key={SECRET} ({resolved})")
        == "401 for key=${env:GRPO_T_SECRET} (Bearer ${env:GRPO_T_SECRET})"
    )
    print(f"warning: {SECRET}", file=sys.stderr)
    print(f"url?k={SECRET}")
    out = capsys.readouterr()
    assert SECRET not in out.err + out.out and "${env:GRPO_T_SECRET}" in out.err


class FailingService:
    """A reward service on 127.0.0.1 that answers every request with HTTP 500."""

    def __init__(self):
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(500)
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/score"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def http_config(tiny_model, data, out, url, failure) -> dict:
    return make_config(
        tiny_model,
        data,
        str(out),
        reward={
            "name": "http",
            "failure": failure,
            "options": {
                "url": url + "?key=${env:GRPO_T_SECRET}",
                "retries": 1,
                "backoff": 0,
                "headers": {"X-Key": "${env:GRPO_T_SECRET}"},
            },
        },
        train={"steps": 2, "prompts_per_step": 2, "seed": 0},
        output={
            "dir": str(out),
            "progress": True,
            "samples_every": 1,
            "checkpoint_every": 1,
            "loggers": [{"name": "tensorboard"}],
        },
    )


def test_a_failing_http_reward_never_shows_its_key(tiny_model, addition_data, tmp_path):
    """The service fails (HTTP 500): each warning and the final error name the URL, whose
    query holds the key, and grpo compare keeps each run's output in a log file."""
    svc = FailingService()
    env = {"GRPO_T_SECRET": SECRET}
    try:
        zero = write_config(
            tmp_path / "z.json",
            http_config(tiny_model, addition_data, tmp_path / "zero", svc.url, "zero"),
        )
        warned = run_grpo("train", zero, env=env)
        fail = write_config(
            tmp_path / "r.json",
            http_config(tiny_model, addition_data, tmp_path / "raise", svc.url, "raise"),
        )
        failed = run_grpo("train", fail, env=env)
        study = run_grpo(
            "compare",
            fail,
            "--vary",
            "optimizer.lr=1e-3",
            "--seeds",
            "1",
            "--out",
            str(tmp_path / "study"),
            env=env,
        )
    finally:
        svc.close()
    assert warned.returncode == 0, warned.stderr
    assert "?key=${env:GRPO_T_SECRET} failed" in warned.stderr  # the message names the URL
    assert failed.returncode == 2 and "?key=${env:GRPO_T_SECRET}" in failed.stderr
    assert "Traceback" not in failed.stderr
    assert study.returncode == 2 and any(f.endswith(".log") for f in every_file(tmp_path / "study"))
    assert not leaks(
        tmp_path,
        warned.stdout,
        warned.stderr,
        failed.stdout,
        failed.stderr,
        study.stdout,
        study.stderr,
    )


def test_a_missing_data_file_is_named_as_written(tiny_model, tmp_path):
    cfg = cfg_for(tiny_model, "${env:GRPO_T_SECRET}/train.jsonl", tmp_path / "r")
    shown = run_grpo(
        "validate", write_config(tmp_path / "c.json", cfg), env={"GRPO_T_SECRET": f"/data/{SECRET}"}
    )
    assert shown.returncode == 2 and "${env:GRPO_T_SECRET}/train.jsonl" in shown.stderr
    assert SECRET not in shown.stderr + shown.stdout


# --- --overwrite --------------------------------------------------------------------------


def snapshot(root) -> dict[str, int]:
    return {f: os.path.getsize(f) for f in every_file(root)}


@pytest.mark.parametrize("inside", ["model.name_or_path", "data.path", "eval.data"])
def test_overwrite_never_deletes_an_input_of_the_run(
    tiny_model, addition_data, tmp_path, capsys, inside
):
    out = tmp_path / "run"
    train(config.validate(cfg_for(tiny_model, addition_data, out, steps=1)))
    shutil.copy(addition_data, out / "mine.jsonl")
    model, data = tiny_model, addition_data
    extra = {}
    if inside == "model.name_or_path":  # continuing from the earlier result
        model = str(out / "final")
    elif inside == "data.path":
        data = str(out / "mine.jsonl")
    else:
        extra["eval"] = {"data": str(out / "mine.jsonl"), "split": "train"}
    before = snapshot(out)
    path = write_config(tmp_path / "c.json", cfg_for(model, data, out, steps=1, **extra))
    one_line_error(
        *cli(["train", path, "--overwrite"], capsys), "--overwrite", inside, "nothing was deleted"
    )
    assert snapshot(out) == before
    elsewhere = write_config(tmp_path / "e.json", cfg_for(tiny_model, addition_data, out, steps=1))
    assert cli(["train", elsewhere, "--overwrite"], capsys)[0] == 0  # still clears the run
    assert not (out / "mine.jsonl").exists()


# --- SIGINT / SIGTERM -------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_the_run_with_a_checkpoint(tiny_model, addition_data, tmp_path, sig):
    """Sent to the whole process group, as Ctrl-C in a terminal does (the reward's worker
    process gets it too, and must live until the step ends)."""
    out = tmp_path / "run"
    cfg = cfg_for(tiny_model, addition_data, out, steps=500)
    cfg["output"]["checkpoint_every"] = 0  # the signal's checkpoint is the only one
    path = write_config(tmp_path / "c.json", cfg)
    p = subprocess.Popen(
        [sys.executable, "-m", "grpo_core.cli", "train", path],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    t0 = time.monotonic()
    while not (out / "metrics.jsonl").exists() or len(open(out / "metrics.jsonl").readlines()) < 2:
        # a hang guard: ten minutes, which a loaded machine cannot reach
        assert p.poll() is None and time.monotonic() - t0 < 600, p.stderr.read()
        time.sleep(0.05)
    os.killpg(p.pid, sig)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 128 + sig, err
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    saved = sorted(os.listdir(out / "checkpoints"))
    assert len(saved) == 1 and str(out / "checkpoints" / saved[0]) in lines[0]
    assert signal.Signals(sig).name in lines[0] and "--resume" in lines[0]
    ckpt = out / "checkpoints" / saved[0]
    assert checkpoint.damage(str(ckpt)) is None
    steps = len(open(out / "metrics.jsonl").readlines())
    assert int(saved[0].split("-")[1]) == steps  # at the step boundary: every step it ran
    cfg["train"]["steps"] = steps + 1
    more = run_grpo("train", write_config(tmp_path / "m.json", cfg), "--resume", cwd=ROOT)
    assert more.returncode == 0, more.stderr
    assert [json.loads(x)["step"] for x in open(out / "metrics.jsonl")] == list(range(steps + 1))


# --- memory and bad values ----------------------------------------------------------------


class CountingTokenizer:
    """A real tokenizer that records the longest text it was asked to tokenize."""

    def __init__(self, tok):
        self.tok, self.longest = tok, 0

    def __call__(self, text, **kw):
        self.longest = max(self.longest, len(text))
        return self.tok(text, **kw)

    def __getattr__(self, name):
        return getattr(self.tok, name)


def test_a_huge_prompt_is_never_tokenized_whole(tiny_model):
    tok = CountingTokenizer(load_tokenizer(config.section("model", {"name_or_path": tiny_model})))
    huge = "7 + " * 2_000_000  # 8 MB
    rows = [{"prompt": "1+1=", "answer": "2"}, {"prompt": huge, "answer": "3"}]
    dc = config.section(
        "data",
        {
            "path": "d.jsonl",
            "prompt_field": "prompt",
            "chat_template": "auto",
            "system_prompt": None,
            "long_prompts": "drop",
            "columns": ["answer"],
        },
    )
    kept, long = fit_prompts(rows, tok, dc, 50)
    assert long == 1 and kept == rows[:1] and tok.longest < 100_000
    kept, _ = fit_prompts(rows, tok, dataclasses.replace(dc, long_prompts="truncate_left"), 50)
    assert kept[1][TRUNCATE] == 50
    batch = make_batch(kept, dc, tok)
    assert len(batch.prompt_ids[1]) == 50 and tok.longest < 100_000
    # the end kept is the end of the whole prompt's tokens (checked where tokenizing it whole
    # is cheap: 40,000 characters, past the bound for 50 tokens)
    long = {"prompt": "7 + " * 10_000, "answer": "3", TRUNCATE: 50}
    whole = tok.tok(make_batch([long], dc, tok).prompts[0], add_special_tokens=False)
    assert make_batch([long], dc, tok).prompt_ids[0] == whole["input_ids"][-50:]
    assert tok.longest < 40_000


def test_validate_says_what_train_does_with_long_prompts(tiny_model, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(
        json.dumps({"prompt": "1+1=", "answer": "2"})
        + "\n"
        + json.dumps({"prompt": "9" * 3_000_000, "answer": "3"})
        + "\n"
    )
    cfg = cfg_for(tiny_model, str(data), tmp_path / "r")
    shown = run_grpo("validate", write_config(tmp_path / "c.json", cfg))
    assert shown.returncode == 0, shown.stderr
    assert "1 of the first 2 rows have prompts longer than" in shown.stderr
    assert "train will leave them out (data.long_prompts: drop)" in shown.stderr
    cfg["data"]["long_prompts"] = "error"
    refused = run_grpo("validate", write_config(tmp_path / "e.json", cfg))
    assert refused.returncode == 2 and "row 1 has a prompt of 30000" in refused.stderr
    assert "characters (more than" in refused.stderr and "Traceback" not in refused.stderr


def test_an_integer_too_long_to_read_in_a_data_row(tiny_model, tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": ' + "7" * 5000 + "}\n")
    path = write_config(tmp_path / "c.json", cfg_for(tiny_model, str(data), tmp_path / "r"))
    one_line_error(*cli(["validate", path], capsys), "d.jsonl:1", "more than 4300 digits")


def _register(name, fn):
    module = types.ModuleType(f"safety_{name}")
    module.reward = hookimpl(lambda register: register(name, lambda: fn), specname="reward")
    registry().add(module, f"test-{name}")


def test_a_reward_returning_text_fails_under_its_policy(
    tiny_model, addition_data, tmp_path, capsys
):
    _register("text_reward", lambda p, c, **k: "1" * len(c))
    cfg = cfg_for(tiny_model, addition_data, tmp_path / "r", steps=1)
    cfg["reward"] = {"name": "text_reward", "failure": "raise"}
    one_line_error(
        *cli(["train", write_config(tmp_path / "c.json", cfg)], capsys),
        "returned a str, expected a list of 4 numbers",
        "reward.failure: raise",
    )
    cfg["reward"]["failure"], cfg["output"]["dir"] = "zero", str(tmp_path / "z")
    code, err = cli(["train", write_config(tmp_path / "z.json", cfg)], capsys)
    assert code == 0 and "returned a str" in err, err
    assert all(r["reward"] == 0.0 for r in map(json.loads, open(tmp_path / "z" / "samples.jsonl")))


def test_non_numeric_dimensions_are_left_out_and_samples_stay_json(
    tiny_model, addition_data, tmp_path, capsys
):
    _register(
        "odd_dims",
        lambda p, c, **k: Scores(
            [float("nan")] + [1.0] * (len(c) - 1),
            dimensions={"words": ["a"] * len(c), "gaps": [None] + [1.0] * (len(c) - 1)},
        ),
    )
    cfg = cfg_for(tiny_model, addition_data, tmp_path / "r", steps=1)
    cfg["reward"] = {"name": "odd_dims", "failure": "drop_group"}
    code, err = cli(["train", write_config(tmp_path / "c.json", cfg)], capsys)
    assert code == 0 and "dimension 'words' holds str 'a', expected numbers; left out" in err
    text = open(tmp_path / "r" / "samples.jsonl").read()
    assert "NaN" not in text
    samples = [
        json.loads(x, parse_constant=lambda c: pytest.fail(c)) for x in text.split("\n") if x
    ]
    assert samples[0]["reward"] is None and samples[0]["dimensions"] == {"gaps": None}


# --- refusals that came late or not at all ------------------------------------------------


def test_validate_refuses_a_fifo_at_once(tiny_model, addition_data, tmp_path):
    fifo = tmp_path / "c.yaml"
    os.mkfifo(fifo)
    shown = run_grpo("validate", str(fifo), timeout=60)
    assert shown.returncode == 2 and "not a regular file" in shown.stderr
    data = tmp_path / "d.jsonl"
    os.mkfifo(data)
    cfg = cfg_for(tiny_model, str(data), tmp_path / "r")
    shown = run_grpo("validate", write_config(tmp_path / "d.json", cfg), timeout=60)
    assert (
        shown.returncode == 2
        and "data.path" in shown.stderr
        and "not a regular file" in shown.stderr
    )


@pytest.mark.parametrize(
    "reward,needle",
    [
        (
            {
                "name": "weighted",
                "options": {"components": [{"name": "math", "requires": ["nope"]}]},
            },
            "reward.options.components[0].requires: 'nope' is not a dimension",
        ),
        (
            {"name": "length", "options": {"max_length": 100, "buffer": 200}},
            "reward.options.buffer: 200 must not exceed max_length (100)",
        ),
    ],
)
def test_validate_checks_options_the_plugin_would_refuse(
    tiny_model, addition_data, tmp_path, capsys, reward, needle
):
    cfg = cfg_for(tiny_model, addition_data, tmp_path / "r")
    cfg["reward"] = reward
    one_line_error(*cli(["validate", write_config(tmp_path / "c.json", cfg)], capsys), needle)


def test_a_data_files_glob_that_matches_nothing(tiny_model, tmp_path, capsys):
    cfg = cfg_for(tiny_model, "json", tmp_path / "r")
    cfg["data"]["data_files"] = str(tmp_path / "nowhere" / "*.jsonl")
    one_line_error(
        *cli(["validate", write_config(tmp_path / "c.json", cfg)], capsys),
        "data.data_files",
        "matches no file",
    )


def test_a_malformed_rng_entry_falls_back_to_an_older_checkpoint(
    tiny_model, addition_data, tmp_path, capsys
):
    out = tmp_path / "run"
    train(config.validate(cfg_for(tiny_model, addition_data, out, steps=3)))
    state_path = out / "checkpoints" / "step-00000003" / "state.json"
    state = json.loads(state_path.read_text())
    state["rng"]["python"] = "(3, (1, 2"
    state_path.write_text(json.dumps(state))
    more = write_config(tmp_path / "m.json", cfg_for(tiny_model, addition_data, out, steps=4))
    code, err = cli(["train", more, "--resume"], capsys)
    assert code == 0 and "step-00000003 is damaged" in err and "rng" in err, err
    assert [json.loads(x)["step"] for x in open(out / "metrics.jsonl")] == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "args,needle",
    [
        (["plan-memory", "--model", "/dev/zero"], "not a regular file"),
        (["plan-memory", "--model", "BADJSON"], "invalid JSON"),
        (["plan-memory", "--model", "BADSIZE"], "hidden_size is 'big', expected a positive"),
        (["plot", "RUN", "--out", "/dev/null/x"], "--out: cannot create /dev/null/x"),
    ],
)
def test_small_commands_end_in_one_line(tiny_model, addition_data, tmp_path, capsys, args, needle):
    (tmp_path / "bad.json").write_text('{"hidden_size": ')
    (tmp_path / "size.json").write_text(
        json.dumps(
            {
                "hidden_size": "big",
                "num_hidden_layers": 2,
                "num_attention_heads": 2,
                "intermediate_size": 8,
                "vocab_size": 10,
            }
        )
    )
    run = tmp_path / "run"
    if "RUN" in args:
        train(config.validate(cfg_for(tiny_model, addition_data, run, steps=1)))
    names = {
        "BADJSON": str(tmp_path / "bad.json"),
        "BADSIZE": str(tmp_path / "size.json"),
        "RUN": str(run),
    }
    one_line_error(*cli([names.get(a, a) for a in args], capsys), needle)


def test_a_refused_simultaneous_start_names_the_lock_holder(tiny_model, addition_data, tmp_path):
    """Starts racing for one new directory: each refused one names the PID that holds it,
    never calls the directory foreign."""
    out = tmp_path / "run"
    path = write_config(tmp_path / "c.json", cfg_for(tiny_model, addition_data, out, steps=1))
    starts = [
        subprocess.Popen(
            [sys.executable, "-m", "grpo_core.cli", "train", path],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    errors = [p.communicate(timeout=600)[1] for p in starts]
    codes = [p.returncode for p in starts]
    assert codes.count(0) >= 1, errors
    for code, err in zip(codes, errors):
        if code:
            assert (
                "is in use by another grpo process (PID" in err or "holds an earlier run" in err
            ), err
            assert "not a grpo run directory" not in err, err
