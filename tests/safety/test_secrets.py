"""${env:NAME} in config strings: resolved at load, never written anywhere the run writes."""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml
from helpers import make_config, run_grpo, write_config

from grpo_core import config
from grpo_core.config.file import Resolved, resolve_env, unresolved
from grpo_core.errors import ConfigError

SECRET = "sk-test-9f3c1e5a7b2d4f6a8c0e"


def test_references_resolve_and_unresolve(monkeypatch):
    monkeypatch.setenv("GRPO_T_KEY", SECRET)
    monkeypatch.setenv("GRPO_T_HOST", "example.org")
    cfg = {
        "a": {"h": "Bearer ${env:GRPO_T_KEY}", "n": 3},
        "b": ["https://${env:GRPO_T_HOST}/x?k=${env:GRPO_T_KEY}", "plain"],
    }
    out = resolve_env(cfg)
    assert out["a"]["h"] == f"Bearer {SECRET}" and isinstance(out["a"]["h"], Resolved)
    assert out["b"][0] == f"https://example.org/x?k={SECRET}" and out["b"][1] == "plain"
    assert unresolved(out) == cfg
    assert SECRET not in json.dumps(unresolved(out))
    again = pickle.loads(pickle.dumps(out))  # a reward's worker process gets both forms
    assert again["a"]["h"] == f"Bearer {SECRET}" and again["a"]["h"].template == cfg["a"]["h"]


def test_a_missing_variable_is_one_line_naming_it(monkeypatch):
    monkeypatch.delenv("GRPO_T_UNSET", raising=False)
    with pytest.raises(ConfigError) as exc:
        resolve_env({"reward": {"options": {"url": "${env:GRPO_T_UNSET}"}}, "x": "${env:1bad}"})
    assert exc.value.problems == [
        "reward.options.url: environment variable GRPO_T_UNSET is not set (the config reads "
        "${env:GRPO_T_UNSET})",
        "x: ${env:1bad} does not name an environment variable (letters, digits and _)",
    ]


def test_a_value_that_fails_validation_is_never_printed(
    tiny_model, addition_data, tmp_path, monkeypatch
):
    monkeypatch.setenv("GRPO_T_URL", SECRET)  # not a URL: fails the http reward's pattern
    cfg = make_config(
        tiny_model,
        addition_data,
        str(tmp_path / "r"),
        reward={"name": "http", "options": {"url": "${env:GRPO_T_URL}"}},
    )
    with pytest.raises(ConfigError) as exc:
        config.validate(cfg)
    assert "reward.options.url" in str(exc.value) and "${env:GRPO_T_URL}" in str(exc.value)
    assert SECRET not in str(exc.value)


class KeyedService:
    """A reward service that answers only with the right API key (so the run proves the
    variable was resolved) and records the keys it saw."""

    def __init__(self, key: str):
        self.seen: list[str] = []
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                service.seen.append(self.headers.get("Authorization", ""))
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                ok = self.headers.get("Authorization") == f"Bearer {key}"
                self.send_response(200 if ok else 401)
                self.end_headers()
                if ok:
                    self.wfile.write(
                        json.dumps(
                            {"rewards": [float(c[:1].isdigit()) for c in body["completions"]]}
                        ).encode()
                    )

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/score"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def every_file(root: str) -> list[str]:
    return [os.path.join(d, f) for d, _, files in os.walk(root) for f in files]


def test_a_secret_never_reaches_a_file_the_run_writes(tiny_model, addition_data, tmp_path):
    svc = KeyedService(SECRET)
    out = str(tmp_path / "run")
    loggers = [{"name": "tensorboard"}]  # and every other tracker that is installed
    env = {
        "GRPO_T_KEY": SECRET,
        "WANDB_SILENT": "true",
        "TRACKIO_DIR": os.path.join(out, "trackio"),
    }  # trackio's store, inside the run
    extra = {
        "wandb": {"project": "secrets", "mode": "offline"},
        "mlflow": {},
        "trackio": {"project": "secrets"},
    }
    loggers += [
        {"name": k, "options": v}
        for k, v in extra.items()
        if importlib.util.find_spec(k) is not None
    ]
    cfg = make_config(
        tiny_model,
        addition_data,
        out,
        reward={
            "name": "http",
            "options": {
                "url": svc.url,
                "retries": 0,
                "headers": {"Authorization": "Bearer ${env:GRPO_T_KEY}"},
            },
        },
        train={"steps": 2, "prompts_per_step": 2, "seed": 0},
        output={
            "dir": out,
            "progress": False,
            "samples_every": 1,
            "checkpoint_every": 1,
            "loggers": loggers,
        },
    )
    path = write_config(tmp_path / "c.json", cfg)
    try:
        shown = run_grpo("validate", path, env=env)
        assert shown.returncode == 0, shown.stderr
        assert "Bearer ${env:GRPO_T_KEY}" in shown.stdout and SECRET not in shown.stdout
        first = run_grpo("train", path, env=env)
        assert first.returncode == 0, first.stderr
        cfg["train"]["steps"] = 3  # resuming compares the configs as written: no difference
        resumed = run_grpo("train", write_config(tmp_path / "c.json", cfg), "--resume", env=env)
        assert resumed.returncode == 0, resumed.stderr
    finally:
        svc.close()
    assert svc.seen and set(svc.seen) == {f"Bearer {SECRET}"}  # the reward did get the key
    files = every_file(out)
    assert any("state.json" in f for f in files)
    for tracker in [lg["name"] for lg in loggers]:  # each wrote its own files in the run
        assert any(f"{os.sep}{tracker}{os.sep}" in f for f in files), tracker
    leaks = [f for f in files if SECRET.encode() in open(f, "rb").read()]
    assert not leaks, leaks
    for proc in (shown, first, resumed):
        assert SECRET not in proc.stdout + proc.stderr
    written = json.load(open(os.path.join(out, "config.json")))
    assert written["reward"]["options"]["headers"] == {"Authorization": "Bearer ${env:GRPO_T_KEY}"}
    state = json.load(open(os.path.join(out, "checkpoints", "step-00000003", "state.json")))
    assert (
        state["config"]["reward"]["options"]["headers"]["Authorization"]
        == "Bearer ${env:GRPO_T_KEY}"
    )


def test_compare_writes_configs_with_the_reference(tmp_path, monkeypatch):
    """grpo compare writes a config per run; it must hold the reference, not the value."""
    from grpo_core.cli import compare

    monkeypatch.setenv("GRPO_T_KEY", SECRET)
    cfg = config.validate(
        make_config(
            "m",
            "d.jsonl",
            str(tmp_path / "x"),
            reward={
                "name": "http",
                "options": {
                    "url": "http://127.0.0.1:9/x",
                    "headers": {"X-Key": "${env:GRPO_T_KEY}"},
                },
            },
        )
    )
    calls = []
    monkeypatch.setattr(compare, "train_child", lambda path, *a: calls.append(path) or (1, "stop"))
    cfg = compare.apply(cfg, [("baseline", "rloo", "rloo")])
    (tmp_path / "cmp").mkdir()  # the study directory (compare_cli makes it)
    with pytest.raises(Exception, match="stop"):
        compare.execute(cfg, str(tmp_path / "cmp" / "rloo-seed0"), "rloo seed 0", threading.Event())
    text = open(calls[0]).read()
    assert (
        SECRET not in text
        and "${env:GRPO_T_KEY}" in yaml.safe_load(text)["reward"]["options"]["headers"]["X-Key"]
    )
