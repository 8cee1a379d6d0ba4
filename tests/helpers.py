"""What tests share besides fixtures: the repo's paths, a small complete config, the real
``grpo`` entry point in a subprocess, the shared real data (skipped with a reason where a
clone lacks ../shared), and a recording HTTP server on 127.0.0.1. Imported as ``helpers`` (pytest's ``pythonpath`` holds tests/)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "data")


def make_config(model_path: str, data_path: str, out: str, **sections) -> dict:
    """A small but complete config dict; ``sections`` are merged into its sections."""
    cfg = {
        "model": {"name_or_path": model_path},
        "data": {"path": data_path, "columns": ["answer"]},
        "sampling": {"group_size": 4, "max_new_tokens": 4},
        "train": {"steps": 3, "prompts_per_step": 4, "micro_batch_groups": 2, "seed": 0},
        "optimizer": {"lr": 1e-3},
        "runtime": {"device": "cpu"},
        "reward": {"name": "math"},
        "output": {"dir": out, "progress": False, "samples_every": 1},
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    return cfg


def write_config(path, cfg: dict) -> str:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cfg, f)
    return str(path)


def run_grpo(*args, env=None, timeout=600, cwd=None) -> subprocess.CompletedProcess:
    """Run the real ``grpo`` entry point in a subprocess."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "grpo_core.cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=cwd,
    )


def gsm8k_or_stand_in(tmp_path) -> list[str]:
    """``--set`` overrides for an example config that reads ../shared/data/gsm8k: none where
    the real data is there, else a two-row stand-in with the same fields, so the config's
    validation (schema, plugins, columns) is still tested in a clone without ../shared."""
    if os.path.exists(os.path.join(SHARED, "gsm8k")):
        return []
    path = tmp_path / "gsm8k.jsonl"
    path.write_text(
        "".join(
            json.dumps({"question": f"What is {i} + 1?", "answer": f"#### {i + 1}"}) + "\n"
            for i in range(2)
        )
    )
    return ["--set", f"data.path={path}", "--set", f"eval.data={path}"]


def needs_shared(sub: str) -> str:
    path = os.path.join(SHARED, sub)
    if not os.path.exists(path):
        pytest.skip(f"{path} not present (real data lives in ../shared/data beside the repo)")
    return path


class RecordingServer:
    """An HTTP/1.1 server on 127.0.0.1 (keep-alive) for the HTTP clients under test. Each
    POST's JSON body is read and recorded with its client port, headers and arrival time, and
    the most requests in flight at once is kept; then ``answer(server, handler)`` replies,
    the handler carrying ``body`` (the parsed request), ``number`` (its count, from 1) and
    ``reply(code, payload, **headers)``. ``changed`` is notified at each arrival; ``release``
    is set on close, ending any answer that waits on it (a hang)."""

    def __init__(self, answer: Callable):
        self.ports: list[int] = []
        self.headers: list[dict] = []
        self.bodies: list = []
        self.times: list[float] = []
        self.inflight = self.most = 0
        self.changed = threading.Condition()
        self.release = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                self.body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.changed:
                    server.ports.append(self.client_address[1])
                    server.headers.append(dict(self.headers))
                    server.bodies.append(self.body)
                    server.times.append(time.monotonic())
                    self.number = len(server.ports)
                    server.inflight += 1
                    server.most = max(server.most, server.inflight)
                    server.changed.notify_all()
                try:
                    answer(server, self)
                finally:
                    with server.changed:
                        server.inflight -= 1

            def reply(self, code, payload, **headers):
                out = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(code)
                for k, v in {"Content-Length": str(len(out)), **headers}.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(out)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
