"""The http reward's client (httpx): connections reused between calls, a batch split into
concurrent requests that come back in order, Retry-After honoured (seconds and HTTP dates,
and refused past RETRY_AFTER_MAX), no cookie kept for another port. Real servers on
127.0.0.1; the redirect and reply-size properties are in test_reward_hardening.py."""

from __future__ import annotations

import email.utils
import threading
import time

import pytest
from grpo_core_plugins.rewards.http import RETRY_AFTER_MAX, retry_after
from helpers import RecordingServer

from grpo_core import create


def reward_server(before=None, delay: float = 0.0) -> RecordingServer:
    """A reward server that scores a completion by its length; ``before(service, handler)``
    may answer first (returning True). It records each request's client port, its headers,
    and the most requests in flight at once."""

    def answer(service, h):
        if before is None or not before(service, h):
            time.sleep(delay)
            h.reply(200, {"rewards": [float(len(c)) for c in h.body["completions"]]})

    service = RecordingServer(answer)
    service.url = service.base + "/score"
    return service


@pytest.fixture
def services():
    made = []
    yield lambda *a, **k: made.append(reward_server(*a, **k)) or made[-1]
    for s in made:
        s.close()


def test_calls_reuse_one_connection(services):
    svc = services()
    r = create("reward", "http", {"url": svc.url, "timeout": 5})
    for _ in range(3):
        assert list(r(["p"], ["abc"])) == [3.0]
    r.close()
    assert len(svc.ports) == 3 and len(set(svc.ports)) == 1  # one TCP connection, kept


def test_a_batch_goes_out_as_concurrent_requests_and_comes_back_in_order(services):
    # the server answers none of the four requests until all four are in: sent one after the
    # other, the first would wait for the barrier (two minutes: a hang guard) and fail
    barrier = threading.Barrier(4, timeout=120)
    svc = services(lambda service, h: barrier.wait() and False)
    r = create(
        "reward", "http", {"url": svc.url, "timeout": 300, "batch_size": 2, "concurrency": 4}
    )
    completions = ["a", "bb", "ccc", "dddd", "eeeee", "ffffff", "g"]
    scores = r(["p"] * 7, completions, answer=[str(i) for i in range(7)])
    r.close()
    assert list(scores) == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 1.0]
    assert len(svc.ports) == 4 and svc.most == 4  # 2 + 2 + 2 + 1, all in flight together


def test_retry_after_seconds_sets_the_wait(services):
    def busy_once(service, h):
        if len(service.ports) == 1:
            h.reply(503, {"error": "busy"}, **{"Retry-After": "1"})
            return True
        return False

    svc = services(busy_once)
    r = create("reward", "http", {"url": svc.url, "timeout": 5, "backoff": 0.01})
    assert list(r(["p"], ["ab"])) == [2.0]
    assert svc.times[1] - svc.times[0] >= 1.0  # the server's second, not the 0.01 s backoff


def test_retry_after_longer_than_the_limit_fails_at_once(services):
    svc = services(lambda s, h: h.reply(429, {}, **{"Retry-After": "3600"}) or True)
    r = create("reward", "http", {"url": svc.url, "timeout": 5, "retries": 3})
    with pytest.raises(RuntimeError) as info:
        r(["p"], ["ab"])
    message = str(info.value)
    assert "after 1 attempt(s): HTTP 429" in message and "Retry-After 3600 s" in message
    assert "\n" not in message and len(svc.ports) == 1


def test_retry_after_reads_http_dates():
    now = time.time()
    assert retry_after(email.utils.formatdate(now + 30, usegmt=True), now) == pytest.approx(
        30, abs=1
    )
    assert retry_after(email.utils.formatdate(now - 30, usegmt=True), now) == 0.0
    assert retry_after("7") == 7.0 and retry_after("soon") is None and retry_after(None) is None
    assert RETRY_AFTER_MAX == 60.0


def test_a_cookie_one_port_sets_never_reaches_another(services):
    def set_cookie(service, h):
        h.reply(200, {"rewards": [1.0]}, **{"Set-Cookie": "session=abc; Path=/"})
        return True

    first, second = services(set_cookie), services()
    a = create("reward", "http", {"url": first.url, "timeout": 5})
    a(["p"], ["c"])
    assert len(a._client.cookies.jar) == 0  # the jar took none
    a.url = second.url  # the same client, another port of the same host
    a(["p"], ["c"])
    a(["p"], ["c"])
    a.close()
    assert all("Cookie" not in h and "cookie" not in h for h in second.headers)
