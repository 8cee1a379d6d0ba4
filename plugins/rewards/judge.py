"""``judge``: a model behind an OpenAI-compatible endpoint grades each completion.

Each completion is put in a rubric template (the prompt, the completion, dataset columns such
as a reference answer), sent as ``POST {base_url}/chat/completions`` (vLLM, SGLang, a hosted
API), and the judge's reply is read for a score: the last match of ``score_pattern`` (RE2), or
a key of the JSON reply with ``parse: json``. The score must lie on ``scale`` [lo, hi] and is
mapped to [0, 1].

What real endpoints do is survived, not trusted (the transport and retry loop are the ``http``
reward's: pooled httpx connections, size-capped replies, no redirect to another origin):

- at most ``concurrency`` requests in flight (threads, and as many pooled connections);
- a 429 or 5xx, a timeout, a reset connection or a reply that is not the JSON expected is
  retried up to ``retries`` times, waiting an exponential backoff with jitter, or what a
  Retry-After asks (seconds or an HTTP date; over 60 s, or past the deadline, it fails);
- ``deadline`` seconds per call (one step's batch): no attempt starts after it, an attempt's
  timeout is cut to it, and a completion not graded by then fails;
- a reply with no score in it (a refusal, "I cannot grade this", a number off the scale) is
  not retried and fails.

A completion that fails gets NaN, which ``reward.failure`` then handles (stop, 0, or drop the
group), never a silent 0; a warning line on stderr says how many failed and why. Scores are
cached by (model, request messages) in an LRU of ``cache`` entries (digests, so memory is
bounded), and a batch asks once for completions that render the same request, so the same
prompt and completion are never graded twice. Per completion, the extra ``judge`` says what
happened ("7 of [0, 10]", "cached", "failed: ..."); ``counts`` keeps the totals (requests,
retried, graded, cached, failed).

The API key (``api_key``, usually ``${env:NAME}``) goes only in the Authorization header:
config files keep the reference, the key is redacted from output, and error messages quote
the endpoint, never the key.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import threading
import time
from collections import Counter, OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass

from grpo_core_plugins.rewards.http import Client, Exhausted, with_retries
from grpo_core_plugins.rewards.json_schema import parse_json
from grpo_core_plugins.rewards.regex import RegexRefused, clean, compile_linear

from grpo_core.errors import PluginError
from grpo_core.hookspecs import Reward
from grpo_core.scores import Scores

ABOUT = "an LLM judge behind an OpenAI-compatible endpoint grades with a rubric"
DEFAULT_SYSTEM = "You are a strict, fair grader. Judge the response by the rubric alone."
DEFAULT_RUBRIC = "Grade how correct, complete and clear the response is."
DEFAULT_TEMPLATE = """{rubric}

[Task]
{prompt}

[Response]
{completion}

Grade the response on a scale from {min} to {max}. End your reply with a line "Score: N"."""
DEFAULT_PATTERN = r"(?i)\bscore\b\W{0,8}?(-?[0-9]+(?:\.[0-9]+)?)"
#: placeholders the reward fills itself; any other ``{name}`` is a dataset column
OWN = frozenset({"prompt", "completion", "min", "max"})
#: columns every reward gets without a dataset field
RESERVED = frozenset({"completion_tokens", "group_ids", "messages"})
_PLACEHOLDER = compile_linear(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")
SHOWN = 160  # characters of a reply quoted in a failure


def placeholders(text: str) -> list[str]:
    """The ``{name}`` placeholders of a template, in order, once each (``{{``/``}}`` are
    literal braces)."""
    names = [m.group(1) for m in _PLACEHOLDER.finditer(text) if m.group(1)]
    return list(dict.fromkeys(names))


def render(text: str, values: dict[str, str]) -> str:
    """``text`` with each placeholder replaced by its value in one pass, so a value (a
    completion that writes ``{answer}``) is never read as a placeholder itself."""
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)] if m.group(1) else m.group(0)[0], text)


def with_rubric(template: str, rubric: str) -> str:
    """The template with ``{rubric}`` replaced by the rubric's own text, which may hold
    placeholders too; everything else is left for :func:`render`."""
    return _PLACEHOLDER.sub(lambda m: rubric if m.group(1) == "rubric" else m.group(0), template)


def _text(value) -> str:
    """A prompt or column value as text: chat messages as ``role: content`` lines."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(m, dict) and "content" in m for m in value):
        return "\n\n".join(f"{m.get('role', 'user')}: {_text(m['content'])}" for m in value)
    return json.dumps(value, default=str, ensure_ascii=False)


@dataclass
class Outcome:
    """One request's result: the score in [0, 1] (NaN: failed) and what happened."""

    score: float
    note: str


class JudgeReward(Client, Reward):
    """Each completion's grade from an LLM judge, in [0, 1]; NaN where none was had."""

    max_value = 1.0  # the top of the scale

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        rubric: str = DEFAULT_RUBRIC,
        template: str = DEFAULT_TEMPLATE,
        system: str | None = DEFAULT_SYSTEM,
        score_pattern: str = DEFAULT_PATTERN,
        parse: str = "pattern",
        json_key: str = "score",
        scale: list | None = None,
        temperature: float = 0.0,
        max_tokens: int = 1024,
        concurrency: int = 8,
        timeout: float = 60.0,
        retries: int = 4,
        backoff: float = 1.0,
        deadline: float | None = 300.0,
        cache: int = 10_000,
        max_response_bytes: int = 1024 * 1024,
    ):
        options = {"template": template, "rubric": rubric, "score_pattern": score_pattern}
        problems = self.check_options({**options, "scale": scale or [0, 10]})
        if problems:
            raise PluginError(f"reward judge: {problems[0]}")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.system, self.parse, self.json_key = model, system, parse, json_key
        self.lo, self.hi = (float(v) for v in (scale or [0, 10]))
        self.template = with_rubric(template, rubric)
        self.fields = [n for n in placeholders(self.template) if n not in OWN]
        self.pattern = compile_linear(score_pattern, dotall=True)
        self.temperature, self.max_tokens = temperature, max_tokens
        self.timeout, self.retries, self.backoff = timeout, retries, backoff
        self.deadline = deadline
        self.configured = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.headers = {"Content-Type": "application/json", **self.configured}
        self.max_redirects, self.allow_cross_origin = 5, False
        self.max_bytes, self.concurrency = max_response_bytes, concurrency
        self.cache_size = cache
        self._client = None
        self._setup()

    def _setup(self) -> None:
        """What is not pickled: the cache, the counts and their lock."""
        self._cache: OrderedDict[bytes, float] = OrderedDict()
        self.counts: Counter = Counter()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        return {k: v for k, v in state.items() if k not in ("_cache", "counts", "_lock")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._setup()

    @classmethod
    def check_options(cls, options: dict) -> list[str]:
        """The score pattern compiles on RE2; the scale is [lo, hi] with lo < hi; the
        template shows the judge the completion."""
        problems = []
        try:
            compile_linear(options.get("score_pattern", DEFAULT_PATTERN), dotall=True)
        except RegexRefused as exc:
            problems.append(f"score_pattern: {exc}")
        lo, hi = options.get("scale") or [0, 10]
        if not lo < hi:
            problems.append(f"scale: [{lo}, {hi}] must be [lowest, highest] with lowest < highest")
        template = with_rubric(
            options.get("template", DEFAULT_TEMPLATE), options.get("rubric", DEFAULT_RUBRIC)
        )
        if "completion" not in placeholders(template):
            problems.append("template: has no {completion}; the judge would never see it")
        return problems

    @classmethod
    def columns_for(cls, options: dict) -> tuple[str, ...]:
        """The dataset columns the template and rubric name (``{answer}``, say)."""
        template = with_rubric(
            options.get("template", DEFAULT_TEMPLATE), options.get("rubric", DEFAULT_RUBRIC)
        )
        return tuple(n for n in placeholders(template) if n not in OWN | RESERVED)

    # --- one call: a step's batch ----------------------------------------------------------

    def __call__(self, prompts, completions, **columns) -> Scores:
        n = len(completions)
        if len(prompts) != n:
            raise ValueError(f"reward judge: {len(prompts)} prompts for {n} completions")
        missing = [c for c in self.fields if c not in columns]
        if missing:
            raise ValueError(
                f"reward judge: the template reads {{{missing[0]}}} but the batch has no "
                f"column {missing[0]!r} (list it in data.columns)"
            )
        requests = [self._messages(i, prompts, completions, columns) for i in range(n)]
        keys = [self._key(m) for m in requests]
        outcomes = self._grade_all(dict(zip(keys, requests)))
        scores, notes, seen = [], [], set()
        for k in keys:  # a repeat in the batch was not asked again
            o = outcomes[k]
            scores.append(o.score)
            notes.append("cached" if k in seen and not math.isnan(o.score) else o.note)
            seen.add(k)
        failed = [i for i, v in enumerate(scores) if math.isnan(v)]
        with self._lock:
            self.counts["cached"] += notes.count("cached")
            self.counts["failed"] += len(failed)
            self.counts["graded"] += n - notes.count("cached") - len(failed)
        if failed:
            print(
                f"warning: reward judge ({self.model} at {self.url}): {len(failed)} of {n} "
                f"completions not graded; completion {failed[0]}: {notes[failed[0]]}",
                file=sys.stderr,
            )
        return Scores(scores, extras={"judge": notes})

    def _messages(self, i: int, prompts: list, completions: list, columns: dict) -> list:
        values = {c: _text(columns[c][i]) for c in self.fields}
        values |= {"prompt": _text(prompts[i]), "completion": str(completions[i])}
        values |= {"min": f"{self.lo:g}", "max": f"{self.hi:g}"}
        user = {"role": "user", "content": render(self.template, values)}
        return [{"role": "system", "content": self.system}, user] if self.system else [user]

    def _key(self, messages: list) -> bytes:
        """The cache key of a request: a digest of the model and the messages."""
        text = json.dumps([self.model, messages], ensure_ascii=False)
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()

    def _grade_all(self, todo: dict[bytes, list]) -> dict[bytes, Outcome]:
        """Outcomes for distinct requests: from the cache, else asked, ``concurrency`` at a
        time, until the deadline."""
        out: dict[bytes, Outcome] = {}
        with self._lock:
            for key in list(todo):
                if key in self._cache:
                    self._cache.move_to_end(key)
                    out[key] = Outcome(self._cache[key], "cached")
                    del todo[key]
        if not todo:
            return out
        deadline = None if self.deadline is None else time.monotonic() + self.deadline
        self._pool()  # one client for all threads (their connections are the bound)
        pool = ThreadPoolExecutor(min(self.concurrency, len(todo)), "judge")
        futures = {pool.submit(self._grade, k, m, deadline): k for k, m in todo.items()}
        left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        done, late = wait(futures, timeout=left)
        pool.shutdown(wait=False, cancel_futures=True)  # a late request ends by its timeout
        out.update({futures[f]: f.result() for f in done})
        note = f"failed: not graded within the step's deadline ({self.deadline:g} s)"
        out.update({futures[f]: Outcome(math.nan, note) for f in late})
        return out

    def _grade(self, key: bytes, messages: list, deadline: float | None) -> Outcome:
        """Ask the judge about one request; never raises."""
        body = json.dumps(self._request(messages)).encode()  # ASCII: any text goes

        def send(left: float | None) -> dict:
            return _choice(self._post(body, None if left is None else min(self.timeout, left)))

        try:
            choice, attempts = with_retries(
                send, self.retries, self.backoff, deadline=deadline, jitter=True
            )
        except Exhausted as exc:
            self._count(exc.attempts)
            why = self._scrub(f"{exc.last}: {exc.detail}" if exc.detail else exc.last)
            if deadline is not None and time.monotonic() >= deadline:
                why = f"not graded within the step's deadline ({self.deadline:g} s); {why}"
            return Outcome(math.nan, f"failed after {exc.attempts} attempt(s): {why}")
        except Exception as exc:  # an error no retry is for (a bug): this completion fails
            return Outcome(math.nan, f"failed: {type(exc).__name__}: {self._scrub(str(exc))}")
        self._count(attempts)
        try:
            value = self._score(choice)
        except ValueError as exc:
            return Outcome(math.nan, f"failed: {exc}")
        with self._lock:
            self._cache[key] = value
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        raw = value * (self.hi - self.lo) + self.lo
        return Outcome(value, f"{raw:g} of [{self.lo:g}, {self.hi:g}]")

    def _count(self, attempts: int) -> None:
        with self._lock:
            self.counts["requests"] += attempts
            self.counts["retried"] += max(attempts - 1, 0)

    def _request(self, messages: list) -> dict:
        body = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        if self.parse == "json":
            body["response_format"] = {"type": "json_object"}
        return body

    def _score(self, choice: dict) -> float:
        """The normalised score in a reply's first choice; ValueError says why there is none."""
        message = choice["message"]
        if message.get("refusal"):
            raise ValueError(f"the judge refused: {_shown(message['refusal'])}")
        content = message.get("content")
        if not isinstance(content, str) or not content.strip():
            raise ValueError(f"empty reply (finish_reason {choice.get('finish_reason')!r})")
        text = self._parsed(content)
        if text is None:
            cut = " (cut at max_tokens)" if choice.get("finish_reason") == "length" else ""
            raise ValueError(f"no score in the reply{cut}: {_shown(content)}")
        try:
            raw = float(text) if len(text) <= 40 else math.nan
        except ValueError:
            raw = math.nan
        if not self.lo <= raw <= self.hi:  # NaN fails too
            raise ValueError(f"score {text[:40]!r} is not on the scale [{self.lo:g}, {self.hi:g}]")
        return (raw - self.lo) / (self.hi - self.lo)

    def _parsed(self, content: str) -> str | None:
        """The score's text: the JSON key's value, or the pattern's last match (its first
        group when it has one)."""
        if self.parse == "json":
            try:
                value = parse_json(content)
            except (ValueError, RecursionError):
                return None
            found = value.get(self.json_key) if isinstance(value, dict) else None
            ok = isinstance(found, (int, float, str)) and not isinstance(found, bool)
            return str(found).strip() if ok else None
        found = deque(self.pattern.finditer(clean(content)), maxlen=1)  # the last match
        if not found:
            return None
        return found[0].group(1) if found[0].groups() else found[0].group(0)


def _choice(body: bytes) -> dict:
    """The first choice of a chat-completions reply; KeyError (retried) when it has none."""
    reply = json.loads(body)
    choices = reply.get("choices") if isinstance(reply, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise KeyError("choices")
    if not isinstance(choices[0].get("message"), dict):
        raise KeyError("choices[0].message")
    return choices[0]


def _shown(text: str) -> str:
    text = " ".join(str(text).split())
    return repr(text if len(text) <= SHOWN else text[:SHOWN] + "...")


SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["base_url", "model"],
    "properties": {
        "base_url": {
            "type": "string",
            "pattern": "^https?://",
            "description": "the OpenAI-compatible API root, e.g. http://127.0.0.1:8000/v1",
        },
        "model": {"type": "string", "minLength": 1, "description": "the judge model's name"},
        "api_key": {
            "type": ["string", "null"],
            "default": None,
            "description": "sent as 'Authorization: Bearer ...'; write ${env:NAME}",
        },
        "rubric": {"type": "string", "default": DEFAULT_RUBRIC, "description": "{rubric}"},
        "template": {
            "type": "string",
            "default": DEFAULT_TEMPLATE,
            "description": "the user message: {prompt}, {completion}, {rubric}, {min}, {max} "
            "and dataset columns such as {answer}; {{ and }} are literal braces",
        },
        "system": {"type": ["string", "null"], "default": DEFAULT_SYSTEM},
        "parse": {
            "enum": ["pattern", "json"],
            "default": "pattern",
            "description": "pattern: the last match of score_pattern; json: JSON mode, "
            "the reply's json_key",
        },
        "score_pattern": {
            "type": "string",
            "default": DEFAULT_PATTERN,
            "description": "RE2 regex; its first group (else the match) is the score",
        },
        "json_key": {"type": "string", "default": "score"},
        "scale": {
            "type": "array",
            "items": {"type": "number"},
            "minItems": 2,
            "maxItems": 2,
            "default": [0, 10],
            "description": "[lowest, highest] score the rubric gives; mapped to [0, 1]",
        },
        "temperature": {"type": "number", "minimum": 0, "default": 0.0},
        "max_tokens": {"type": "integer", "minimum": 1, "default": 1024},
        "concurrency": {
            "type": "integer",
            "minimum": 1,
            "default": 8,
            "description": "requests in flight at once",
        },
        "timeout": {
            "type": "number",
            "exclusiveMinimum": 0,
            "default": 60.0,
            "description": "seconds for each network operation of a request",
        },
        "retries": {"type": "integer", "minimum": 0, "default": 4},
        "backoff": {
            "type": "number",
            "minimum": 0,
            "default": 1.0,
            "description": "seconds before the first retry, doubled each time, with jitter",
        },
        "deadline": {
            "type": ["number", "null"],
            "exclusiveMinimum": 0,
            "default": 300.0,
            "description": "seconds per step; completions not graded by then fail "
            "(keep it under reward.timeout)",
        },
        "cache": {
            "type": "integer",
            "minimum": 0,
            "default": 10_000,
            "description": "scores remembered (LRU), keyed by model and request",
        },
        "max_response_bytes": {"type": "integer", "minimum": 1, "default": 1024 * 1024},
    },
}
