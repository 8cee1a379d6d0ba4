"""Format, JSON-schema, length, reward-model, HTTP and weighted rewards; failure policies."""

from __future__ import annotations

import json
import math
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from helpers import make_config

import grpo_core
from grpo_core import config
from grpo_core.reward.call import RewardFailure, score


def create(name, **options):
    return grpo_core.create("reward", name, options)


def test_format_tags_order_and_partial():
    r = create("format", tags=["think", "answer"])
    good = "<think>hmm</think> <answer>4</answer>"
    cases = [
        good,
        "<answer>4</answer><think>x</think>",
        "<think>a</think>",
        "<think>a</think><think>b</think><answer>4</answer>",
        "plain",
    ]
    assert list(r(["p"] * 5, cases)) == [1.0, 0.0, 0.0, 0.0, 0.0]
    partial = create("format", tags=["think", "answer"], partial=True)
    # rules: think once, answer once, in order
    assert list(partial(["p"] * 3, [good, cases[1], cases[2]])) == [1.0, 2 / 3, 1 / 3]
    strict = create("format", tags=["think", "answer"], only_tags=True)
    assert list(strict(["p"] * 2, [good, good + " trailing"])) == [1.0, 0.0]
    rx = create("format", tags=[], patterns=["^Answer: \\d+$"])
    assert list(rx(["p"] * 2, ["Answer: 12", "Answer: twelve"])) == [1.0, 0.0]


def test_json_schema_reward():
    schema = {
        "type": "object",
        "required": ["name", "age"],
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    }
    r = create("json_schema", schema=schema)
    texts = [
        '{"name": "a", "age": 3}',
        'Here:\n```json\n{"name": "a", "age": 3}\n```',
        '{"name": "a", "age": "x"}',
        "not json",
        '{"name": "a"}',
    ]
    assert list(r(["p"] * 5, texts)) == [1.0, 1.0, 0.0, 0.0, 0.0]
    p = create("json_schema", schema=schema, partial=True)
    assert list(p(["p"] * 4, texts[2:] + [texts[0]])) == [2 / 3, 0.0, 2 / 3, 1.0]
    col = create("json_schema", schema_column="schema")
    assert list(col(["p"] * 2, ["[1, 2]", "{}"], schema=[{"type": "array"}] * 2)) == [1.0, 0.0]
    with pytest.raises(grpo_core.PluginError):
        create("json_schema")


def test_length_reward_dapo_overlong():
    r = create("length", max_length=20, buffer=10)
    lengths = [5, 10, 15, 20, 25]
    assert list(r(["p"] * 5, ["x"] * 5, completion_tokens=lengths)) == [0.0, 0.0, -0.5, -1.0, -1.0]
    t = create("length", target=10)
    assert list(t(["p"] * 2, ["x"] * 2, completion_tokens=[10, 15])) == [0.0, -0.5]


@pytest.fixture(scope="module")
def tiny_classifier(tmp_path_factory):
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    from grpo_core.tiny import build_tokenizer

    path = str(tmp_path_factory.mktemp("rm"))
    tok = build_tokenizer()
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_labels=1,
        pad_token_id=tok.pad_token_id,
    )
    Qwen2ForSequenceClassification(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_reward_model_scores_a_batch(tiny_classifier):
    r = create("reward_model", model=tiny_classifier, batch_size=2)
    out = list(r(["1+1=", "1+1=", "2+2="], ["2", "3", "4"]))
    assert len(out) == 3 and all(math.isfinite(v) for v in out) and len(set(out)) == 3
    again = list(r(["1+1=", "2+2="], ["2", "4"]))  # batching does not change a score
    assert again == pytest.approx([out[0], out[2]], abs=1e-5)
    norm = create("reward_model", model=tiny_classifier, normalize="batch")
    z = torch.tensor(list(norm(["a", "b", "c"], ["x", "y", "z"])))
    assert abs(z.mean()) < 1e-5 and abs(z.std() - 1) < 1e-3


def test_reward_model_refuses_pickle_weights(tmp_path, tiny_classifier):
    import shutil

    from transformers import AutoModelForSequenceClassification

    dst = tmp_path / "pickled"
    shutil.copytree(tiny_classifier, dst)
    model = AutoModelForSequenceClassification.from_pretrained(str(dst))
    os.remove(dst / "model.safetensors")
    torch.save(model.state_dict(), dst / "pytorch_model.bin")
    with pytest.raises(grpo_core.UserError, match="cannot load"):
        create("reward_model", model=str(dst))


class Service:
    """A real HTTP reward server on 127.0.0.1 with scripted behaviour."""

    def __init__(self, fail_first=0, delay=0.0, never=False):
        self.calls = 0
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                service.calls += 1
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if never:  # holds the request, far past any client's timeout here
                    time.sleep(60)
                    return
                if service.calls <= fail_first:
                    self.send_response(503)
                    self.end_headers()
                    return
                time.sleep(delay)
                out = json.dumps({"rewards": [float(len(c)) for c in body["completions"]]})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(out.encode())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/score"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_http_reward_answers_and_retries():
    svc = Service(fail_first=2)
    try:
        r = create("http", url=svc.url, retries=3, backoff=0.01, timeout=5)
        assert list(r(["p", "p"], ["ab", "abcd"], answer=["1", "2"])) == [2.0, 4.0]
        assert svc.calls == 3  # failed twice, then answered
    finally:
        svc.close()


def test_http_reward_slow_but_within_timeout():
    svc = Service(delay=0.3)
    try:
        assert list(create("http", url=svc.url, timeout=5)(["p"], ["abc"])) == [3.0]
    finally:
        svc.close()


def test_http_reward_never_answers_gives_clear_error():
    svc = Service(never=True)
    try:
        r = create("http", url=svc.url, timeout=0.3, retries=1, backoff=0.01)
        with pytest.raises(RuntimeError, match=r"failed after 2 attempt\(s\).*Timeout"):
            r(["p"], ["abc"])
        # the work: two requests, each ended by the client's timeout (the server held both)
        assert svc.calls == 2
    finally:
        svc.close()


def test_http_reward_connection_refused():
    r = create("http", url="http://127.0.0.1:9/none", retries=0, timeout=1)
    with pytest.raises(RuntimeError, match="127.0.0.1:9"):
        r(["p"], ["x"])


def test_weighted_with_gate_and_dimensions():
    r = create(
        "weighted",
        components=[
            {"name": "format", "options": {"tags": ["answer"]}, "weight": 0.5},
            {"name": "math", "weight": 2.0, "requires": ["format"]},
        ],
    )
    texts = ["<answer>4</answer>", "4", "<answer>5</answer>"]
    out = r(["p"] * 3, texts, answer=["4"] * 3)
    assert list(out) == [2.5, 0.0, 0.5]  # the bare right answer fails the format gate
    assert out.dimensions == {"format": [1.0, 0.0, 1.0], "math": [1.0, 1.0, 0.0]}


def test_weighted_group_normalisation():
    r = create(
        "weighted",
        normalize="group",
        components=[{"name": "length", "options": {"target": 4}, "as": "len"}],
    )
    out = r(["p"] * 4, ["a"] * 4, completion_tokens=[4, 2, 8, 8], group_ids=[0, 0, 1, 1])
    assert list(out)[:2] == pytest.approx([1.0, -1.0], abs=1e-5)
    assert list(out)[2:] == [0.0, 0.0]


def test_weighted_rejects_unknown_gate():
    with pytest.raises(grpo_core.PluginError, match="requires: .fmt. is not a dimension"):
        create("weighted", components=[{"name": "math", "requires": ["fmt"]}])


GROUP = torch.tensor([0, 0, 1, 1])


def test_failure_policies():
    def raises(p, c, **k):
        raise ValueError("boom")

    def short(p, c, **k):
        return [1.0]

    def nan_second(p, c, **k):
        return [1.0, float("nan"), 0.0, 1.0]

    args = (["p"] * 4, ["c"] * 4, {}, GROUP)
    for fn, text in (
        (raises, "raised ValueError: boom"),
        (short, "returned 1 scores for 4"),
        (nan_second, "returned nan for completion 1"),
    ):
        with pytest.raises(RewardFailure, match=text):
            score(fn, "demo", *args, policy="raise")
    z = score(nan_second, "demo", *args, policy="zero")
    assert z.rewards.tolist() == [1.0, 0.0, 0.0, 1.0] and "completion 1" in z.problem
    d = score(nan_second, "demo", *args, policy="drop_group")
    assert torch.isnan(d.rewards[:2]).all() and d.rewards[2:].tolist() == [0.0, 1.0]
    assert torch.isnan(score(raises, "demo", *args, policy="drop_group").rewards).all()
    assert score(short, "demo", *args, policy="zero").rewards.tolist() == [0.0] * 4


def test_weighted_dimensions_in_training_metrics(tiny_model, addition_data, tmp_path):
    from grpo_core.trainer import train

    reward = {
        "name": "weighted",
        "options": {
            "components": [
                {"name": "format", "options": {"tags": [], "patterns": ["[0-9]"]}, "as": "digit"},
                {"name": "math", "requires": ["digit"]},
            ]
        },
    }
    cfg = config.validate(
        make_config(
            tiny_model,
            addition_data,
            str(tmp_path / "run"),
            reward=reward,
            train={"steps": 2, "prompts_per_step": 2},
        )
    )
    train(cfg)
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    for r in rows:
        assert 0 <= r["reward/digit"] <= 1 and 0 <= r["reward/math"] <= 1
    samples = [json.loads(line) for line in open(tmp_path / "run" / "samples.jsonl")]
    assert set(samples[0]["dimensions"]) == {"digit", "math"}
    assert "extracted" in samples[0]["extras"]


def test_nan_reward_never_reaches_the_loss(tiny_model, addition_data, tmp_path):
    import types

    from grpo_core.hookspecs import hookimpl
    from grpo_core.registry import registry
    from grpo_core.trainer import train

    module = types.ModuleType("nan_reward_for_tests")

    @hookimpl
    def reward(register):
        register(
            "half_nan",
            lambda: (
                lambda p, c, **k: [
                    float("nan") if i % 3 == 0 else float(i % 2) for i in range(len(c))
                ]
            ),
        )

    module.reward = reward
    registry().add(module, "test-nan")
    cfg = config.validate(
        make_config(
            tiny_model,
            addition_data,
            str(tmp_path / "run"),
            reward={"name": "half_nan", "failure": "drop_group"},
            train={"steps": 2, "prompts_per_step": 4},
        )
    )
    summary = train(cfg)
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in rows)
    assert all(r["dropped_rewards"] > 0 for r in rows) and summary["steps"] == 2
