"""The ``judge`` reward against a real OpenAI-compatible server on 127.0.0.1 that misbehaves
on purpose: rate limits with Retry-After, hangs, 500s, reset connections, malformed JSON,
refusals, a slow tail past the step's deadline. The server grades by reading the request (the
tests' template is the completion alone, a digit); it counts requests and how many were in
flight at once, so the tests bound work (requests, retries), never wall time."""

from __future__ import annotations

import email.utils
import json
import math
import os
import time

import pytest
import torch
from grpo_core_plugins.rewards.judge import render
from helpers import ROOT, RecordingServer, gsm8k_or_stand_in, make_config, run_grpo

import grpo_core
from grpo_core import config
from grpo_core.config.file import unresolved
from grpo_core.registry import registry
from grpo_core.reward.call import RewardFailure, score

HANG_GUARD = 120  # seconds: only a hang reaches this (a wait that never ends)
KEY = "sk-judge-test-0123456789abcdef"


def chat(content: str | None, **message) -> dict:
    """An OpenAI chat-completions reply with one choice."""
    return {
        "id": "x",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, **message},
                "finish_reason": "stop",
            }
        ],
    }


def judge_server(behave=None) -> RecordingServer:
    """A chat-completions server. By default it answers "Score: N" where N is the user
    message itself (the tests' template is ``{completion}``); ``behave(server, handler, n,
    request)`` may answer first (returning True), ``n`` being the request's number from 1."""

    def answer(server, h):
        if behave is None or not behave(server, h, h.number, h.body):
            text = h.body["messages"][-1]["content"]
            h.reply(200, chat(f"The response is fine.\nScore: {text}"))

    server = RecordingServer(answer)
    server.base += "/v1"
    return server


def hang(server: RecordingServer) -> bool:
    """Answer nothing until the test is over."""
    server.release.wait(HANG_GUARD)
    return True


@pytest.fixture
def judges():
    made = []
    yield lambda *a, **k: made.append(judge_server(*a, **k)) or made[-1]
    for j in made:
        j.close()


def judge_reward(server: RecordingServer, **options):
    """A judge whose template is the completion alone, fast backoff, generous limits (only a
    hang reaches them)."""
    options = {
        "base_url": server.base,
        "model": "judge-model",
        "template": "{completion}",
        "system": None,
        "backoff": 0.01,
        "timeout": 30,
        "deadline": HANG_GUARD,
        **options,
    }
    return grpo_core.create("reward", "judge", options)


def test_scores_are_parsed_and_mapped_to_the_unit_interval(judges):
    server = judges()
    r = judge_reward(server, scale=[0, 8])
    out = r(["p"] * 3, ["8", "2", "0"])
    assert list(out) == [1.0, 0.25, 0.0]
    assert out.extras["judge"] == ["8 of [0, 8]", "2 of [0, 8]", "0 of [0, 8]"]
    bodies = server.bodies
    assert {b["model"] for b in bodies} == {"judge-model"} and bodies[0]["temperature"] == 0.0
    sent = sorted(b["messages"][0]["content"] for b in bodies)
    assert sent == ["0", "2", "8"] and all(len(b["messages"]) == 1 for b in bodies)
    assert r.counts["requests"] == 3 and r.counts["graded"] == 3


def test_rate_limit_retry_after_seconds_then_success(judges):
    def limited(judge, h, n, request):
        if n == 1:
            h.reply(429, {"error": "rate limited"}, **{"Retry-After": "1"})
            return True
        return False

    server = judges(limited)
    r = judge_reward(server)
    assert list(r(["p"], ["5"])) == [0.5]
    assert len(server.bodies) == 2 and r.counts["retried"] == 1
    assert server.times[1] - server.times[0] >= 1.0  # the server's second, not 0.01 s backoff


def test_rate_limit_retry_after_http_date_is_honoured(judges):
    def limited(judge, h, n, request):
        if n == 1:
            when = email.utils.formatdate(time.time() + 2, usegmt=True)
            h.reply(429, {"error": "rate limited"}, **{"Retry-After": when})
            return True
        return False

    server = judges(limited)
    r = judge_reward(server)
    assert list(r(["p"], ["5"])) == [0.5]
    # the date has whole seconds: 2 s ahead is at least 1 s after the first request
    assert len(server.bodies) == 2 and server.times[1] - server.times[0] >= 1.0


def test_retry_after_past_the_deadline_fails_without_waiting(judges):
    server = judges(lambda j, h, n, r: h.reply(429, {}, **{"Retry-After": "30"}) or True)
    r = judge_reward(server, deadline=5, retries=3)
    out = r(["p"], ["5"])
    assert math.isnan(out[0]) and len(server.bodies) == 1  # no second request
    assert "HTTP 429" in out.extras["judge"][0] and "deadline" in out.extras["judge"][0]


def test_a_hang_beyond_the_timeout_is_retried(judges):
    server = judges(lambda server, h, n, request: n == 1 and hang(server))
    r = judge_reward(server, timeout=0.5)
    assert list(r(["p"], ["3"])) == [0.3]
    assert len(server.bodies) == 2 and r.counts["retried"] == 1


def test_a_server_error_then_success(judges):
    server = judges(lambda j, h, n, r: n == 1 and (h.reply(500, {"error": "boom"}) or True))
    r = judge_reward(server)
    out = r(["p"], ["9"])
    assert list(out) == [0.9] and len(server.bodies) == 2
    assert out.extras["judge"] == ["9 of [0, 10]"]


def test_a_reset_connection_then_success(judges):
    def reset(judge, h, n, request):
        if n == 1:
            h.close_connection = True
            h.connection.shutdown(2)  # no reply at all: the client sees the socket close
            return True
        return False

    server = judges(reset)
    r = judge_reward(server)
    assert list(r(["p"], ["4"])) == [0.4] and len(server.bodies) == 2


def test_malformed_json_is_retried_then_fails_as_nan(judges):
    once = judges(lambda j, h, n, r: n == 1 and (h.reply(200, b'{"choices": [') or True))
    assert list(judge_reward(once)(["p"], ["6"])) == [0.6] and len(once.bodies) == 2

    always = judges(lambda j, h, n, r: h.reply(200, b"<html>bad gateway</html>") or True)
    r = judge_reward(always, retries=2)
    out = r(["p"], ["6"])
    assert math.isnan(out[0]) and len(always.bodies) == 3  # 1 + 2 retries, then given up
    assert out.extras["judge"][0].startswith("failed after 3 attempt(s): bad reply")
    assert r.counts["failed"] == 1 and r.counts["retried"] == 2


def test_a_refusal_or_unparseable_answer_is_a_failure_not_zero(judges, capsys):
    replies = {
        "1": chat("I cannot grade this."),
        "2": chat(None, refusal="I can't help with that."),
        "3": chat("Score: 11"),  # off the 0-10 scale
        "4": chat("Score: 7"),
    }
    server = judges(
        lambda j, h, n, req: h.reply(200, replies[req["messages"][-1]["content"]]) or True
    )
    r = judge_reward(server, retries=3)
    out = r(["p"] * 4, ["1", "2", "3", "4"])
    assert [math.isnan(v) for v in out] == [True, True, True, False] and out[3] == 0.7
    notes = out.extras["judge"]
    assert "no score in the reply: 'I cannot grade this.'" in notes[0]
    assert "the judge refused" in notes[1] and "not on the scale" in notes[2]
    assert len(server.bodies) == 4  # an answer that cannot be read is not asked again
    assert "3 of 4 completions not graded" in capsys.readouterr().err
    # through reward.failure: raise stops, zero scores 0 with a warning, drop_group drops
    import torch

    group = torch.tensor([0, 0, 1, 1])
    args = (["p"] * 4, ["1", "2", "3", "4"], {}, group)
    with pytest.raises(RewardFailure, match="returned nan for completion 0"):
        score(r, "judge", *args, policy="raise")
    assert score(r, "judge", *args, policy="zero").rewards.tolist()[:3] == [0.0, 0.0, 0.0]
    dropped = score(r, "judge", *args, policy="drop_group").rewards
    assert torch.isnan(dropped).all()  # both groups hold a failure


def test_the_default_pattern_reads_common_forms_and_the_last_score(judges):
    replies = [
        "Score: 7",
        "**Score:** 7",
        "score = 7.5",
        "Final score: 7/10",
        "A score of 2 would be harsh. Score: 3",
        "Scores vary; no verdict.",
    ]
    server = judges(
        lambda j, h, n, req: (
            h.reply(200, chat(replies[int(req["messages"][-1]["content"])])) or True
        )
    )
    out = judge_reward(server)(["p"] * 6, [str(i) for i in range(6)])
    assert list(out)[:5] == [0.7, 0.7, 0.75, 0.7, 0.3] and math.isnan(out[5])


def test_json_mode_reads_the_key(judges):
    server = judges(
        lambda j, h, n, req: h.reply(200, chat('```json\n{"score": 3, "why": "ok"}\n```')) or True
    )
    r = judge_reward(server, parse="json", scale=[1, 5])
    assert list(r(["p"], ["x"])) == [0.5]
    assert server.bodies[0]["response_format"] == {"type": "json_object"}


def test_a_slow_tail_past_the_deadline_fails_the_rest_graded(judges):
    server = judges(
        lambda server, h, n, req: req["messages"][-1]["content"] == "9" and hang(server)
    )
    r = judge_reward(server, deadline=2, timeout=60, retries=3, concurrency=4)
    out = r(["p"] * 4, ["1", "2", "9", "3"])  # returns (a hang would reach HANG_GUARD)
    assert [out[0], out[1], out[3]] == [0.1, 0.2, 0.3] and math.isnan(out[2])
    assert "deadline" in out.extras["judge"][2]
    assert len(server.bodies) == 4  # the slow one was asked once, not retried after


def test_completions_still_queued_at_the_deadline_fail_unasked(judges):
    server = judges(
        lambda server, h, n, req: req["messages"][-1]["content"] == "9" and hang(server)
    )
    r = judge_reward(server, deadline=2, timeout=60, concurrency=1)
    out = r(["p"] * 3, ["9", "1", "2"])  # one at a time: the hang holds the only slot
    assert all(math.isnan(v) for v in out)
    assert all("deadline" in note for note in out.extras["judge"])
    assert len(server.bodies) == 1  # the two behind it were never sent
    assert r.counts["failed"] == 3


def test_the_cache_asks_each_prompt_and_completion_once(judges):
    server = judges()
    r = judge_reward(server, cache=2)
    first = r(["p", "p", "p"], ["1", "1", "2"])  # a repeat in the batch is asked once
    assert list(first) == [0.1, 0.1, 0.2] and len(server.bodies) == 2
    assert first.extras["judge"] == ["1 of [0, 10]", "cached", "2 of [0, 10]"]
    again = r(["p", "p"], ["2", "1"])
    assert list(again) == [0.2, 0.1] and len(server.bodies) == 2  # nothing asked
    assert again.extras["judge"] == ["cached", "cached"]
    other = r(["q"], ["1"])  # the template does not show the prompt: the same request
    assert list(other) == [0.1] and len(server.bodies) == 2
    r(["p"], ["3"])  # a third entry pushes out the least recently used ("2")
    r(["p"], ["2"])
    assert len(server.bodies) == 4
    assert r.counts["cached"] == 4 and r.counts["requests"] == 4


def test_the_cache_key_holds_the_prompt(judges):
    server = judges(lambda j, h, n, r: h.reply(200, chat("Score: 5")) or True)
    r = judge_reward(server, template="{prompt}: {completion}")
    assert list(r(["a", "b", "a"], ["1", "1", "1"])) == [0.5] * 3
    assert sorted(b["messages"][-1]["content"] for b in server.bodies) == ["a: 1", "b: 1"]


def test_concurrency_is_bounded(judges):
    total, bound = 8, 3

    def crowd(server, h, n, request):
        with server.changed:  # hold each request until `bound` are in (or all have come)
            server.changed.wait_for(
                lambda: server.inflight >= bound or len(server.bodies) == total, HANG_GUARD
            )
        return False

    server = judges(crowd)
    r = judge_reward(server, concurrency=bound)
    out = r(["p"] * total, [str(i) for i in range(total)])
    assert list(out) == [i / 10 for i in range(total)]
    assert server.most == bound  # reached, never passed


def test_the_api_key_is_sent_and_never_shown(judges, monkeypatch):
    def deny(judge, h, n, request):
        echo = h.headers["Authorization"]  # a server that quotes the header back
        h.reply(401, {"error": f"invalid key {echo}"})
        return True

    monkeypatch.setenv("JUDGE_T_KEY", KEY)
    server = judges(deny)
    cfg = config.validate(
        make_config(
            "m",
            "d.jsonl",
            "out",
            reward={
                "name": "judge",
                "options": {"base_url": server.base, "model": "m", "api_key": "${env:JUDGE_T_KEY}"},
            },
        )
    )
    r = grpo_core.create("reward", "judge", cfg["reward"]["options"])
    out = r(["p"], ["1"])
    assert server.headers[0]["Authorization"] == f"Bearer {KEY}"
    assert len(server.bodies) == 1  # a 401 is not retried
    note = out.extras["judge"][0]
    assert "HTTP 401" in note and "invalid key" in note and KEY not in note
    written = unresolved(cfg)
    assert written["reward"]["options"]["api_key"] == "${env:JUDGE_T_KEY}"
    assert KEY not in json.dumps(written)


def test_a_completion_cannot_fill_placeholders(judges):
    server = judges(lambda j, h, n, r: h.reply(200, chat("Score: 1")) or True)
    r = judge_reward(server, template="Reference: {answer}\nResponse: {completion}")
    r(["p"], ["the answer is {answer}"], answer=["42"])
    sent = server.bodies[0]["messages"][-1]["content"]
    assert sent == "Reference: 42\nResponse: the answer is {answer}"
    assert render("{{x}} {x}", {"x": "1"}) == "{x} 1"


def test_options_are_checked_with_their_names():
    def problems(**options):
        info = registry().get("reward", "judge")
        return info.factory.check_options({"base_url": "http://h/v1", "model": "m", **options})

    assert problems() == []
    assert "score_pattern" in problems(score_pattern="(?=x)")[0]
    assert problems(scale=[5, 5])[0].startswith("scale:")
    assert "{completion}" in problems(template="no completion here")[0]
    cls = registry().get("reward", "judge").factory
    assert cls.columns_for({"rubric": "Reference answer: {answer}"}) == ("answer",)


def test_registered_as_a_builtin():
    info = registry().get("reward", "judge")
    assert info.distribution == "grpo-core" and "judge" in info.description


def judged_weighted(server: RecordingServer) -> dict:
    return {
        "name": "weighted",
        "failure": "drop_group",
        "options": {
            "components": [
                {"name": "format", "options": {"tags": [], "patterns": ["[0-9]"]}, "as": "digit"},
                {
                    "name": "judge",
                    "requires": ["digit"],
                    "options": {
                        "base_url": server.base,
                        "model": "tiny-judge",
                        "api_key": "${env:JUDGE_T_KEY}",
                        "rubric": "Reference answer: {answer}",
                        "template": "{rubric}\n{completion}",
                        "system": None,
                        "deadline": HANG_GUARD,
                        "backoff": 0.01,
                    },
                },
            ]
        },
    }


def test_validate_a_weighted_config_with_a_gated_judge(judges, monkeypatch, tmp_path):
    monkeypatch.setenv("JUDGE_T_KEY", KEY)
    server = judges()
    cfg = config.validate(
        make_config("m", "d.jsonl", str(tmp_path), reward=judged_weighted(server))
    )
    judge = cfg["reward"]["options"]["components"][1]
    assert judge["options"]["scale"] == [0, 10] and judge["requires"] == ["digit"]
    with pytest.raises(grpo_core.ConfigError, match="score_pattern"):
        bad = judged_weighted(server)
        bad["options"]["components"][1]["options"]["score_pattern"] = "(a)\\1"
        config.validate(make_config("m", "d.jsonl", str(tmp_path), reward=bad))


def test_training_with_a_gated_judge(judges, monkeypatch, tiny_model, addition_data, tmp_path):
    """A short run on the tiny model: the judge (in the reward's worker process) grades a
    completion by its first digit (0 without one); the key reaches the server only."""
    from grpo_core.trainer import train

    def grade(judge, h, n, request):
        text = request["messages"][-1]["content"].split("\n", 1)[1]
        digits = [c for c in text if c.isdigit()]
        h.reply(200, chat(f"Score: {digits[0] if digits else 0}"))
        return True

    monkeypatch.setenv("JUDGE_T_KEY", KEY)
    server = judges(grade)
    out = tmp_path / "run"
    cfg = config.validate(
        make_config(
            tiny_model,
            addition_data,
            str(out),
            reward=judged_weighted(server),
            train={"steps": 2, "prompts_per_step": 2},
        )
    )
    summary = train(cfg)
    assert summary["steps"] == 2
    assert server.bodies and {h["Authorization"] for h in server.headers} == {f"Bearer {KEY}"}
    assert "Reference answer: " in server.bodies[0]["messages"][-1]["content"]
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert all(0 <= row["reward/judge"] <= 1 for row in rows)  # graded (NaN fails this)
    assert all(row["dropped_rewards"] == 0 for row in rows)
    samples = [json.loads(line) for line in open(out / "samples.jsonl")]
    assert "judge" in samples[0]["extras"] and set(samples[0]["dimensions"]) == {"digit", "judge"}
    written = json.load(open(out / "config.json"))
    assert written["reward"]["options"]["components"][1]["options"]["api_key"] == (
        "${env:JUDGE_T_KEY}"
    )
    files = [os.path.join(d, f) for d, _, names in os.walk(out) for f in names]
    assert not [f for f in files if KEY.encode() in open(f, "rb").read()]


def test_the_example_config_validates(tmp_path, monkeypatch):
    monkeypatch.delenv("JUDGE_API_KEY", raising=False)
    example = os.path.join(ROOT, "examples", "judge_reward.yaml")
    shown = run_grpo(
        "validate", example, *gsm8k_or_stand_in(tmp_path), env={"JUDGE_API_KEY": KEY}, cwd=ROOT
    )
    assert shown.returncode == 0, shown.stderr
    assert "${env:JUDGE_API_KEY}" in shown.stdout and KEY not in shown.stdout + shown.stderr
    unset = run_grpo("validate", example, *gsm8k_or_stand_in(tmp_path), cwd=ROOT)
    assert unset.returncode != 0 and "JUDGE_API_KEY is not set" in unset.stderr


def test_plugins_check_needs_an_endpoint_and_passes_against_one(judges, capsys):
    """Without ``--options`` the check cannot build a judge and says which options it needs;
    with a (local) endpoint every check passes. The judge reads no column the check's
    made-up value cannot stand for, so it gives no example row."""
    from grpo_core.cli import plugin_tools

    assert plugin_tools.check("reward", "judge") != 0
    assert "it needs base_url, model: grpo plugins check reward judge --options JSON" in (
        capsys.readouterr().out
    )
    server = judges()
    options = {"base_url": server.base, "model": "m", "template": "{completion}", "system": None}
    assert plugin_tools.check("reward", "judge", options) == 0, capsys.readouterr().out
    assert "0 failed" in capsys.readouterr().out
    assert server.bodies  # the sample calls reached the endpoint


@pytest.mark.parametrize("normalize", ["none", "group"])
def test_an_unparseable_grade_behind_a_closed_gate_does_not_count(judges, normalize):
    """The judge refuses (no score: NaN) exactly the completions whose format gate is closed:
    those do not count, so no total is NaN or missing, and (normalize: group) the open
    completions are normalised among themselves, not poisoned by the refusals."""

    def grade(judge, h, n, request):
        text = request["messages"][-1]["content"]
        h.reply(200, chat(f"Score: {text[3:]}" if text.startswith("ok") else "I cannot."))
        return True

    server = judges(grade)
    judge = {"base_url": server.base, "model": "m", "template": "{completion}", "system": None}
    reward = grpo_core.create(
        "reward",
        "weighted",
        {
            "normalize": normalize,
            "components": [
                {"name": "format", "options": {"tags": [], "patterns": ["^ok"]}, "weight": 0.0},
                {"name": "judge", "options": judge, "requires": ["format"]},
            ],
        },
    )
    completions = ["ok 8", "ok 2", "no", "ok 6", "ok 4", "none"]
    out = reward(["p"] * 6, completions, group_ids=[0, 0, 0, 1, 1, 1])
    assert [math.isnan(v) for v in out.dimensions["judge"]] == [False, False, True] * 2
    if normalize == "none":
        assert list(out) == [0.8, 0.2, 0.0, 0.6, 0.4, 0.0]
    else:  # two graded per group: (x - mean) / (std + 1e-6), +-0.3 / (0.3 + 1e-6), +-0.1 / ...
        one = 0.3 / (0.3 + 1e-6)
        assert out[0] == pytest.approx(one, rel=1e-9) and out[1] == pytest.approx(-one, rel=1e-9)
        one = 0.1 / (0.1 + 1e-6)
        assert out[3] == pytest.approx(one, rel=1e-9) and out[4] == pytest.approx(-one, rel=1e-9)
        assert out[2] == 0.0 and out[5] == 0.0
    scored = score(reward, "weighted", ["p"] * 6, completions, {}, torch.tensor([0] * 3 + [1] * 3))
    assert scored.problem is None and not scored.rewards.isnan().any()
