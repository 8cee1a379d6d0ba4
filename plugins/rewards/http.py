"""``http``: a remote reward service. POST {prompts, completions, columns} as JSON; the
reply is {"rewards": [...]} (or a bare list). Timeouts, retries with exponential backoff.

Redirects are followed by this module, not by urllib, so that credentials never reach another
origin: a redirect to a different scheme, host or port is refused unless
``allow_cross_origin_redirects`` is set, and then every configured header (Authorization,
cookies, API keys) is dropped from that hop on. Only http(s) targets are followed, at most
``max_redirects`` of them. The reply is read in chunks and refused past ``max_response_bytes``
(at once when its Content-Length announces more), so a runaway server cannot exhaust memory.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request

from grpo_core.hookspecs import Reward
from grpo_core.scores import Scores

CHUNK = 64 * 1024
REDIRECTS = (301, 302, 303, 307, 308)
# Headers that carry credentials: never sent across origins, configured or not.
SENSITIVE = frozenset({"authorization", "proxy-authorization", "cookie"})


class RemoteRewardError(RuntimeError):
    pass


class _Final(RemoteRewardError):
    """A failure that another attempt cannot fix (the reply or redirect is refused)."""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Hand every redirect back to the caller as an HTTPError instead of following it."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def origin(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of an http(s) URL, the port filled in from the scheme."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port  # ValueError for a malformed port
    return scheme, (parts.hostname or "").lower(), port or (443 if scheme == "https" else 80)


class HTTPReward(Reward):
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
    ):
        self.url, self.timeout, self.retries, self.backoff = url, timeout, retries, backoff
        self.configured = dict(headers or {})
        self.headers = {"Content-Type": "application/json", **self.configured}
        self.max_redirects = max_redirects
        self.allow_cross_origin = allow_cross_origin_redirects
        self.max_bytes = max_response_bytes

    def _without_credentials(self, headers: dict) -> dict:
        """``headers`` minus the configured ones and any that carry credentials."""
        drop = {k.lower() for k in self.configured} | SENSITIVE
        return {k: v for k, v in headers.items() if k.lower() not in drop}

    def _read(self, resp) -> bytes:
        """The reply body, refused past ``max_bytes`` without reading much beyond it."""
        length = resp.headers.get("Content-Length")
        if length and length.strip().isdigit() and int(length) > self.max_bytes:
            raise _Final(
                f"reply of {int(length)} bytes announced, over max_response_bytes "
                f"({self.max_bytes}); not read"
            )
        body = bytearray()
        while True:
            chunk = resp.read(min(CHUNK, self.max_bytes + 1 - len(body)))
            if not chunk:
                return bytes(body)
            body += chunk
            if len(body) > self.max_bytes:
                raise _Final(
                    f"reply is over max_response_bytes ({self.max_bytes}); reading stopped"
                )

    def _post(self, body: bytes) -> bytes:
        """One attempt: send, follow the redirects the options allow, return the reply."""
        url, method, data, headers = self.url, "POST", body, dict(self.headers)
        for _ in range(self.max_redirects + 1):
            req = urllib.request.Request(url, data=data, headers=headers, method=method)
            try:
                with _OPENER.open(req, timeout=self.timeout) as resp:
                    return self._read(resp)
            except urllib.error.HTTPError as exc:
                if exc.code not in REDIRECTS:
                    raise
                code, location = exc.code, exc.headers.get("Location") if exc.headers else None
                exc.close()
                if not location:
                    raise _Final(f"HTTP {code} redirect without a Location") from None
            target = urllib.parse.urljoin(url, location.strip())
            try:
                here, there = origin(url), origin(target)
            except ValueError:
                raise _Final(f"redirect to a malformed URL {target[:200]!r} refused") from None
            if there[0] not in ("http", "https") or not there[1]:
                raise _Final(
                    f"redirect to {target[:200]!r} refused: only http(s) URLs are followed"
                )
            if there != here:
                if not self.allow_cross_origin:
                    raise _Final(
                        f"redirect to another origin ({there[0]}://{there[1]}:"
                        f"{there[2]}) not followed; set allow_cross_origin_redirects "
                        "to follow it (configured headers are then not sent)"
                    )
                headers = self._without_credentials(headers)
            if code in (301, 302, 303):  # as browsers do: the next request is a bare GET
                method, data = "GET", None
                headers = {k: v for k, v in headers.items() if k.lower() != "content-type"}
            url = target
        raise _Final(f"more than max_redirects ({self.max_redirects}) redirects")

    def __call__(self, prompts, completions, **columns) -> Scores:
        body = json.dumps(
            {"prompts": prompts, "completions": completions, "columns": columns}, default=str
        ).encode()
        last = "no attempt"
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                reply = json.loads(self._post(body))
                rewards = reply["rewards"] if isinstance(reply, dict) else reply
                if not isinstance(rewards, list):
                    raise RemoteRewardError(f"reply has no list of rewards: {str(reply)[:100]}")
                return Scores(rewards)
            except _Final as exc:
                last = str(exc)
                break
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code} {exc.reason}"
                exc.close()
                if 400 <= exc.code < 500 and exc.code != 429:
                    break  # the request is wrong: retrying will not help
            except (urllib.error.URLError, TimeoutError, OSError) as exc:
                last = f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, RecursionError) as exc:
                last = f"bad reply ({type(exc).__name__}: {str(exc)[:200]})"
        raise RemoteRewardError(
            f"reward service {self.url} failed after {attempt + 1} attempt(s): {last}"
        )


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
    },
}
