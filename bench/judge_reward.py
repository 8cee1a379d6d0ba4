"""Throughput of the ``judge`` reward (completions/s) against a naive sequential client, in
one run, on an OpenAI-compatible endpoint stood in for by a local server.

    python bench/judge_reward.py [--completions 64] [--latency 0.05] [--repeats 5]

The server (127.0.0.1, a thread per connection) answers each chat completion after
``--latency`` seconds, as a remote model would, with a grade (``Score: 7``). What is measured
is the client: how many completions a step grades per second when the endpoint's latency,
not its compute, is the limit. Three runners grade the same batch of distinct completions:

- ``naive``: the peer, what a reward function written without the judge does: one
  ``httpx.post`` per completion, one after another;
- ``judge c=1``: the ``judge`` reward with ``concurrency: 1`` (its own cost: templates,
  parsing, retries bookkeeping, the cache lookup);
- ``judge c=N``: ``concurrency: N`` (``--concurrency``).

A round runs the three in turn, each round in another order; figures are medians over
``--repeats`` rounds, the ratio against ``naive`` the median of the rounds' ratios. Each
runner's scores are checked (all 0.7). The cache is emptied between rounds: every round sends
every request.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

import grpo_core

REPLY = {"choices": [{"message": {"role": "assistant", "content": "Score: 7"}}]}


def serve(latency: float) -> ThreadingHTTPServer:
    """The stand-in endpoint, answering every POST after ``latency`` seconds."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            time.sleep(latency)
            body = json.dumps(REPLY).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def naive(url: str, completions: list[str]) -> list[float]:
    """One request per completion, in turn, the grade read with a split."""
    scores = []
    with httpx.Client(timeout=30) as client:
        for c in completions:
            r = client.post(
                f"{url}/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": c}]},
            )
            text = r.json()["choices"][0]["message"]["content"]
            scores.append(float(text.split(":")[-1]) / 10)
    return scores


def judge(url: str, concurrency: int):
    return grpo_core.create(
        "reward", "judge", {"base_url": url, "model": "m", "concurrency": concurrency}
    )


def timed(fn) -> tuple[float, list[float]]:
    t0 = time.perf_counter()
    scores = list(fn())
    return time.perf_counter() - t0, scores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--completions", type=int, default=64)
    ap.add_argument("--latency", type=float, default=0.05)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    server = serve(args.latency)
    url = f"http://127.0.0.1:{server.server_port}/v1"
    completions = [f"The answer is {i}." for i in range(args.completions)]
    prompts = ["What is the answer?"] * args.completions
    rates: dict[str, list[float]] = {}
    ratios: dict[str, list[float]] = {}
    for k in range(args.repeats):
        runners = {
            "naive": lambda: naive(url, completions),
            "judge c=1": lambda: judge(url, 1)(prompts, completions),
            f"judge c={args.concurrency}": lambda: judge(url, args.concurrency)(
                prompts, completions
            ),
        }
        names = list(runners)
        names = names[k % len(names) :] + names[: k % len(names)]
        seconds = {}
        for name in names:  # a fresh reward each time: an empty cache
            s, scores = timed(runners[name])
            assert scores == [0.7] * len(completions), (name, scores[:3])
            seconds[name] = s
            rates.setdefault(name, []).append(len(completions) / s)
        for name in runners:
            ratios.setdefault(name, []).append(seconds["naive"] / seconds[name])
        print(json.dumps({"round": k, **{n: round(s, 3) for n, s in seconds.items()}}))
    server.shutdown()
    print(f"\n{args.completions} completions, endpoint latency {args.latency * 1000:.0f} ms")
    print(f"{'runner':<14} {'completions/s':>14} {'vs naive':>9}")
    for name in rates:
        rate, ratio = statistics.median(rates[name]), statistics.median(ratios[name])
        print(f"{name:<14} {rate:>14.1f} {ratio:>8.2f}x")


if __name__ == "__main__":
    main()
