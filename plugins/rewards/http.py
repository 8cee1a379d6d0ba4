"""``http``: a remote reward service. POST {prompts, completions, columns} as JSON; the
reply is {"rewards": [...]} (or a bare list). Timeouts, retries with exponential backoff."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

from grpo_core.scores import Scores


class RemoteRewardError(RuntimeError):
    pass


class HTTPReward:
    def __init__(self, url: str, timeout: float = 30.0, retries: int = 3, backoff: float = 0.5,
                 headers: dict | None = None):
        self.url, self.timeout, self.retries, self.backoff = url, timeout, retries, backoff
        self.headers = {"Content-Type": "application/json", **(headers or {})}

    def __call__(self, prompts, completions, **columns) -> Scores:
        body = json.dumps({"prompts": prompts, "completions": completions,
                           "columns": columns}, default=str).encode()
        last = "no attempt"
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            req = urllib.request.Request(self.url, data=body, headers=self.headers,
                                         method="POST")
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    reply = json.loads(resp.read())
                rewards = reply["rewards"] if isinstance(reply, dict) else reply
                if not isinstance(rewards, list):
                    raise RemoteRewardError(f"reply has no list of rewards: {str(reply)[:100]}")
                return Scores(rewards)
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code} {exc.reason}"
                if 400 <= exc.code < 500 and exc.code != 429:
                    break  # the request is wrong: retrying will not help
            except (urllib.error.URLError, TimeoutError, OSError) as exc:
                last = f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"
            except (json.JSONDecodeError, KeyError) as exc:
                last = f"bad reply ({type(exc).__name__}: {exc})"
        raise RemoteRewardError(f"reward service {self.url} failed after {attempt + 1} "
                                f"attempt(s): {last}")


SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["url"],
    "properties": {
        "url": {"type": "string", "pattern": "^https?://"},
        "timeout": {"type": "number", "exclusiveMinimum": 0, "default": 30.0},
        "retries": {"type": "integer", "minimum": 0, "default": 3},
        "backoff": {"type": "number", "minimum": 0, "default": 0.5},
        "headers": {"type": "object", "additionalProperties": {"type": "string"}, "default": {}},
    },
}
