"""Shape rewards: tag structure and regular expressions (``format``), length (``length``).

All matching runs on RE2 (see ``regex.py``), so a completion is inspected in time linear in its
length whatever the configured patterns are; patterns RE2 cannot run are refused when the
reward is built."""

from __future__ import annotations

import itertools

import re2
from grpo_core_plugins.rewards.regex import RegexRefused, clean, compile_linear, search

from grpo_core.errors import PluginError
from grpo_core.hookspecs import Reward
from grpo_core.scores import Scores

MAX_CHARS = 100_000  # longest completion inspected; longer ones fail the format


class FormatReward(Reward):
    """Rules: each tag appears exactly once as <tag>...</tag>; tags in the given order;
    optionally nothing but whitespace outside them; each pattern matches somewhere.
    Score 1/0 (all rules), or with ``partial`` the share of rules satisfied."""

    max_value = 1.0  # every rule satisfied

    def __init__(
        self,
        tags: list[str] | None = None,
        patterns: list[str] | None = None,
        only_tags: bool = False,
        partial: bool = False,
    ):
        self.tags = list(tags or [])
        self.patterns = []
        for i, pattern in enumerate(patterns or []):
            try:
                self.patterns.append(compile_linear(pattern, dotall=True))
            except RegexRefused as exc:
                raise PluginError(f"reward format: patterns[{i}]: {exc}") from None
        # Non-greedy, dot matches newlines: the first closing tag after an opening one.
        self._tag_rx = [
            compile_linear(f"<{re2.escape(t)}>.*?</{re2.escape(t)}>", dotall=True)
            for t in self.tags
        ]
        self.only_tags, self.partial = only_tags, partial

    @classmethod
    def check_options(cls, options: dict) -> list[str]:
        problems = []
        for i, pattern in enumerate(options.get("patterns") or []):
            try:
                compile_linear(pattern, dotall=True)
            except RegexRefused as exc:
                problems.append(f"patterns[{i}]: {exc}")
        return problems

    def rules(self, text: str) -> list[bool]:
        if len(text) > MAX_CHARS:
            return [False] * self.n_rules
        text = clean(text)
        out = []
        spans = []
        for tag, rx in zip(self.tags, self._tag_rx):
            opens = text.count(f"<{tag}>")
            found = list(itertools.islice(rx.finditer(text), 2)) if opens == 1 else []
            once = len(found) == 1 and opens == 1
            out.append(once)
            spans.append(found[0].span() if once else None)
        if len(self.tags) > 1:
            starts = [s[0] for s in spans if s is not None]
            out.append(
                len(starts) == len(self.tags)
                and starts == sorted(starts)
                and all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
            )
        if self.only_tags and self.tags:
            rest, last = [], 0
            for span in sorted(s for s in spans if s is not None):
                rest.append(text[last : span[0]])
                last = span[1]
            rest.append(text[last:])
            out.append(all(s is not None for s in spans) and not "".join(rest).strip())
        out += [_matches(p, text) for p in self.patterns]
        return out

    @property
    def n_rules(self) -> int:
        return (
            len(self.tags)
            + (len(self.tags) > 1)
            + (self.only_tags and bool(self.tags))
            + len(self.patterns)
        )

    def __call__(self, prompts, completions, **columns) -> Scores:
        scores = []
        for text in completions:
            r = self.rules(text)
            if not r:
                scores.append(1.0)
            elif self.partial:
                scores.append(sum(r) / len(r))
            else:
                scores.append(float(all(r)))
        return Scores(scores)


def _matches(rx, text: str) -> bool:
    """Whether ``rx`` matches somewhere in ``text``. Python's ``$`` (which the patterns were
    written for) also matches just before a final newline; RE2's only at the very end, so a
    text ending in a newline is also tried without it."""
    if search(rx, text):
        return True
    return "$" in rx.pattern and text.endswith("\n") and bool(search(rx, text[:-1]))


class LengthReward(Reward):
    """DAPO's overlong penalty (Yu et al. 2025), in tokens (``completion_tokens``):
    0 up to ``max_length - buffer``; then linear down to -1 at ``max_length``; -1 beyond.
    With ``target`` set instead: -|len - target| / target, a pull towards a length."""

    max_value = 0.0  # no penalty

    def __init__(self, max_length: int = 512, buffer: int = 128, target: int | None = None):
        problems = self.check_options({"max_length": max_length, "buffer": buffer})
        if problems:
            raise ValueError(problems[0])
        self.max_length, self.buffer, self.target = max_length, buffer, target

    @classmethod
    def check_options(cls, options: dict) -> list[str]:
        buffer, most = options.get("buffer", 128), options.get("max_length", 512)
        return [f"buffer: {buffer} must not exceed max_length ({most})"] if buffer > most else []

    def score(self, n: int) -> float:
        if self.target:
            return -abs(n - self.target) / self.target
        soft = self.max_length - self.buffer
        if n <= soft:
            return 0.0
        if n <= self.max_length:
            return (soft - n) / self.buffer
        return -1.0

    def __call__(self, prompts, completions, completion_tokens=None, **columns) -> Scores:
        lengths = completion_tokens or [len(c.split()) for c in completions]
        return Scores([self.score(int(n)) for n in lengths])


FORMAT_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "tags": {
            "type": "array",
            "items": {"type": "string", "pattern": "^[A-Za-z_][\\w-]*$"},
            "default": ["think", "answer"],
        },
        "patterns": {
            "type": "array",
            "items": {"type": "string", "format": "regex"},
            "default": [],
        },
        "only_tags": {
            "type": "boolean",
            "default": False,
            "description": "nothing but whitespace outside the tags",
        },
        "partial": {
            "type": "boolean",
            "default": False,
            "description": "score the share of rules satisfied",
        },
    },
}

LENGTH_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "max_length": {"type": "integer", "minimum": 1, "default": 512},
        "buffer": {"type": "integer", "minimum": 1, "default": 128},
        "target": {"type": ["integer", "null"], "minimum": 1, "default": None},
    },
}
