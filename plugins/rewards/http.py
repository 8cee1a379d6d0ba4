"""``http``: a remote reward service. POST {prompts, completions, columns} as JSON; the
reply is {"rewards": [...]} (or a bare list). Timeouts, retries with exponential backoff.

Built on httpx: one client per reward whose connections stay open between calls (pooled,
``concurrency`` of them at most). A batch goes in one request, or with ``batch_size`` in
requests of that many completions, ``concurrency`` of them in flight at once. A 429 or 503
reply's ``Retry-After`` (seconds or an HTTP date) sets the wait before the next attempt; one
over ``RETRY_AFTER_MAX`` seconds fails the call instead of stalling the step.

Redirects are followed by this module, not by httpx, so that credentials never reach another
origin: a redirect to a different scheme, host or port is refused unless
``allow_cross_origin_redirects`` is set, and then every configured header (Authorization,
cookies, API keys) is dropped from that hop on. Only http(s) targets are followed, at most
``max_redirects`` of them. No cookie a server sets is kept (a jar that accepts none), so none
can travel to another port of the same host. The reply is read in chunks, decompressed, and
refused past ``max_response_bytes`` (at once when its Content-Length announces more), so a
runaway server cannot exhaust memory.

The transport (:class:`Client`) and the retry loop (:func:`with_retries`) are shared with the
``judge`` reward.
"""

from __future__ import annotations

import email.utils
import json
import random
import time
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any

import httpx

from grpo_core.hookspecs import Reward
from grpo_core.scores import Scores

CHUNK = 64 * 1024
REDIRECTS = (301, 302, 303, 307, 308)
# Headers that carry credentials: never sent across origins, configured or not.
SENSITIVE = frozenset({"authorization", "proxy-authorization", "cookie"})
#: the longest Retry-After waited for, in seconds
RETRY_AFTER_MAX = 60.0


class RemoteRewardError(RuntimeError):
    pass


class _Final(RemoteRewardError):
    """A failure that another attempt cannot fix (the reply or redirect is refused)."""


class _Status(RemoteRewardError):
    """A reply with an error status; ``wait``: what its Retry-After asks, in seconds;
    ``detail``: the start of its body (what the server said was wrong), credentials removed."""

    def __init__(self, code: int, reason: str, wait: float | None, detail: str = ""):
        super().__init__(f"HTTP {code} {reason}")
        self.code, self.wait, self.detail = code, wait, detail


class Exhausted(RemoteRewardError):
    """Every attempt :func:`with_retries` allowed failed: ``last`` says how the last one did,
    ``attempts`` counts the requests made, ``detail`` is the last error reply's
    :attr:`_Status.detail`."""

    def __init__(self, last: str, attempts: int, detail: str = ""):
        super().__init__(last)
        self.last, self.attempts, self.detail = last, attempts, detail


def origin(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of an http(s) URL, the port filled in from the scheme."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port  # ValueError for a malformed port
    return scheme, (parts.hostname or "").lower(), port or (443 if scheme == "https" else 80)


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds a ``Retry-After`` header value asks to wait (delay-seconds or an HTTP date,
    RFC 9110 10.2.3), never negative; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def with_retries(
    send: Callable[[float | None], Any],
    retries: int,
    backoff: float,
    deadline: float | None = None,
    jitter: bool = False,
) -> tuple[Any, int]:
    """``send(time_left)`` tried up to ``retries + 1`` times; returns its value and the number
    of attempts. A connection failure, a 5xx or 429 reply, or a reply that is not the JSON
    expected waits ``backoff * 2**k`` seconds (with ``jitter``, a random 50-100% of it, so
    clients that failed together do not return together) or the reply's Retry-After, then
    tries again; a refusal (``_Final``, another 4xx) does not. With ``deadline`` (a
    ``time.monotonic()`` value) no attempt starts that could not begin before it, and
    ``send`` gets the seconds left. Raises :class:`Exhausted` when no attempt succeeded."""
    last, detail, wait, made = "no attempt", "", 0.0, 0
    for attempt in range(retries + 1):
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and wait >= left:
            last = (
                f"{last}; the step's deadline came before another attempt"
                if made
                else "the step's deadline passed before the first attempt"
            )
            break
        time.sleep(wait)
        wait = backoff * 2**attempt * (random.uniform(0.5, 1.0) if jitter else 1.0)
        made += 1
        try:
            return send(None if deadline is None else deadline - time.monotonic()), made
        except _Final as exc:
            last = str(exc)
            break
        except _Status as exc:
            last, detail = str(exc), exc.detail
            if 400 <= exc.code < 500 and exc.code != 429:
                break  # the request is wrong: retrying will not help
            if exc.wait is not None and exc.code in (429, 503):
                if exc.wait > RETRY_AFTER_MAX:
                    last += f" (Retry-After {exc.wait:.0f} s, over {RETRY_AFTER_MAX:.0f} s)"
                    break
                wait = exc.wait
        except (httpx.TransportError, OSError) as exc:
            last, detail = f"{type(exc).__name__}: {exc}", ""
        except (
            json.JSONDecodeError,
            UnicodeDecodeError,
            KeyError,
            RecursionError,
            httpx.DecodingError,
        ) as exc:
            last, detail = f"bad reply ({type(exc).__name__}: {str(exc)[:200]})", ""
    raise Exhausted(last, made, detail)


class Client:
    """One endpoint reached with POST through a pooled httpx client (made on first use, not
    pickled): redirects followed as the module doc says, replies read within a size cap.
    Subclasses set ``url``, ``timeout``, ``configured`` (the user's headers), ``headers``
    (all sent), ``max_redirects``, ``allow_cross_origin``, ``max_bytes``, ``concurrency``."""

    url: str
    timeout: float
    configured: dict
    headers: dict
    max_redirects: int
    allow_cross_origin: bool
    max_bytes: int
    concurrency: int
    _client: httpx.Client | None = None

    def __getstate__(self) -> dict:
        """Pickled for a worker process without the client: the worker opens its own."""
        return {**self.__dict__, "_client": None}

    def _pool(self) -> httpx.Client:
        """The client, made on first use: pooled connections, no redirects followed by it,
        no cookies kept."""
        if self._client is None:
            self._client = httpx.Client(
                timeout=self.timeout,
                follow_redirects=False,
                cookies=CookieJar(policy=DefaultCookiePolicy(allowed_domains=[])),
                limits=httpx.Limits(
                    max_connections=self.concurrency, max_keepalive_connections=self.concurrency
                ),
            )
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _without_credentials(self, headers: dict) -> dict:
        """``headers`` minus the configured ones and any that carry credentials."""
        drop = {k.lower() for k in self.configured} | SENSITIVE
        return {k: v for k, v in headers.items() if k.lower() not in drop}

    def _scrub(self, text: str) -> str:
        """``text`` with every configured header value (a key, a token) replaced by ``***``."""
        for value in self.configured.values():
            for secret in {value, value.partition(" ")[2]}:  # "Bearer <token>": the token too
                if len(secret) >= 4:
                    text = text.replace(secret, "***")
        return text

    def _read(self, resp: httpx.Response) -> bytes:
        """The reply body, refused past ``max_bytes`` without reading much beyond it."""
        length = resp.headers.get("Content-Length")
        if length and length.strip().isdigit() and int(length) > self.max_bytes:
            raise _Final(
                f"reply of {int(length)} bytes announced, over max_response_bytes "
                f"({self.max_bytes}); not read"
            )
        body = bytearray()
        for chunk in resp.iter_bytes(CHUNK):
            body += chunk
            if len(body) > self.max_bytes:
                raise _Final(
                    f"reply is over max_response_bytes ({self.max_bytes}); reading stopped"
                )
        return bytes(body)

    def _failed(self, resp: httpx.Response) -> _Status:
        """The error an error reply stands for, with the start of its body."""
        head = b""
        for chunk in resp.iter_bytes(CHUNK):
            head = chunk[:300]
            break
        detail = self._scrub(" ".join(head.decode("utf-8", "replace").split()))
        wait = retry_after(resp.headers.get("Retry-After"))
        return _Status(resp.status_code, resp.reason_phrase, wait, detail)

    def _post(self, body: bytes, timeout: float | None = None) -> bytes:
        """One attempt (``timeout``: seconds for each of its network operations, None: the
        client's): send, follow the redirects the options allow, return the reply."""
        url, method, data, headers = self.url, "POST", body, dict(self.headers)
        limit = httpx.USE_CLIENT_DEFAULT if timeout is None else max(timeout, 0.001)
        for _ in range(self.max_redirects + 1):
            with self._pool().stream(
                method, url, content=data, headers=headers, timeout=limit
            ) as resp:
                code = resp.status_code
                if code not in REDIRECTS:
                    if code >= 400:
                        raise self._failed(resp)
                    return self._read(resp)
                location = resp.headers.get("Location")
            if not location:
                raise _Final(f"HTTP {code} redirect without a Location")
            url, headers = self._next_hop(url, location, headers)
            if code in (301, 302, 303):  # as browsers do: the next request is a bare GET
                method, data = "GET", None
                headers = {k: v for k, v in headers.items() if k.lower() != "content-type"}
        raise _Final(f"more than max_redirects ({self.max_redirects}) redirects")

    def _next_hop(self, url: str, location: str, headers: dict) -> tuple[str, dict]:
        """Where a redirect from ``url`` leads and the headers that may go there; refused
        (``_Final``) unless it is http(s), and same-origin or allowed across."""
        target = urllib.parse.urljoin(url, location.strip())
        try:
            here, there = origin(url), origin(target)
        except ValueError:
            raise _Final(f"redirect to a malformed URL {target[:200]!r} refused") from None
        if there[0] not in ("http", "https") or not there[1]:
            raise _Final(f"redirect to {target[:200]!r} refused: only http(s) URLs are followed")
        if there != here:
            if not self.allow_cross_origin:
                raise _Final(
                    f"redirect to another origin ({there[0]}://{there[1]}:{there[2]}) not "
                    "followed; set allow_cross_origin_redirects to follow it (configured "
                    "headers are then not sent)"
                )
            headers = self._without_credentials(headers)
        return target, headers


class HTTPReward(Client, Reward):
    def __init__(
        self,
        url: str,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.5,
        headers: dict | None = None,
        max_redirects: int = 5,
        allow_cross_origin_redirects: bool = False,
        max_response_bytes: int = 64 * 1024 * 1024,
        batch_size: int | None = None,
        concurrency: int = 4,
    ):
        self.url, self.timeout, self.retries, self.backoff = url, timeout, retries, backoff
        self.configured = dict(headers or {})
        self.headers = {"Content-Type": "application/json", **self.configured}
        self.max_redirects = max_redirects
        self.allow_cross_origin = allow_cross_origin_redirects
        self.max_bytes = max_response_bytes
        self.batch_size, self.concurrency = batch_size, concurrency
        self._client = None

    def __call__(self, prompts, completions, **columns) -> Scores:
        n = len(completions)
        size = self.batch_size or n
        if not size or size >= n or len(prompts) != n:
            return Scores(self._score(prompts, completions, columns))
        spans = [(s, min(s + size, n)) for s in range(0, n, size)]

        def part(span: tuple[int, int]) -> list:
            lo, hi = span
            cut = {
                k: v[lo:hi] if isinstance(v, list) and len(v) == n else v
                for k, v in columns.items()
            }
            rewards = self._score(prompts[lo:hi], completions[lo:hi], cut)
            if len(rewards) != hi - lo:
                raise RemoteRewardError(
                    f"reward service {self.url} answered {len(rewards)} rewards for a request "
                    f"of {hi - lo} completions"
                )
            return rewards

        self._pool()  # made here, not raced for by the threads
        with ThreadPoolExecutor(min(self.concurrency, len(spans))) as pool:
            return Scores([r for rewards in pool.map(part, spans) for r in rewards])

    def _score(self, prompts: list, completions: list, columns: dict) -> list:
        """One request's rewards, with retries (:func:`with_retries`)."""
        body = json.dumps(
            {"prompts": prompts, "completions": completions, "columns": columns}, default=str
        ).encode()
        try:
            rewards, _ = with_retries(
                lambda _: self._rewards(self._post(body)), self.retries, self.backoff
            )
        except Exhausted as exc:
            raise RemoteRewardError(
                f"reward service {self.url} failed after {exc.attempts} attempt(s): {exc.last}"
            ) from None
        return rewards

    @staticmethod
    def _rewards(body: bytes) -> list:
        """The list of rewards in a reply: {"rewards": [...]} or a bare list."""
        reply = json.loads(body)
        rewards = reply["rewards"] if isinstance(reply, dict) else reply
        if not isinstance(rewards, list):
            raise RemoteRewardError(f"reply has no list of rewards: {str(reply)[:100]}")
        return rewards


SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["url"],
    "properties": {
        "url": {"type": "string", "pattern": "^https?://"},
        "timeout": {"type": "number", "exclusiveMinimum": 0, "default": 30.0},
        "retries": {"type": "integer", "minimum": 0, "default": 3},
        "backoff": {"type": "number", "minimum": 0, "default": 0.5},
        "headers": {"type": "object", "additionalProperties": {"type": "string"}, "default": {}},
        "max_redirects": {
            "type": "integer",
            "minimum": 0,
            "default": 5,
            "description": "same-origin redirects followed per attempt",
        },
        "allow_cross_origin_redirects": {
            "type": "boolean",
            "default": False,
            "description": "follow redirects to another scheme, host or port; the configured "
            "headers are then dropped",
        },
        "max_response_bytes": {
            "type": "integer",
            "minimum": 1,
            "default": 64 * 1024 * 1024,
            "description": "largest reply read; a larger one is an error",
        },
        "batch_size": {
            "type": ["integer", "null"],
            "minimum": 1,
            "default": None,
            "description": "completions per request (null: the whole batch in one)",
        },
        "concurrency": {
            "type": "integer",
            "minimum": 1,
            "default": 4,
            "description": "requests in flight at once, and connections kept open",
        },
    },
}
