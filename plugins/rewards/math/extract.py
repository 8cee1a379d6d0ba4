"""Finding the final answer in a completion (or in a worked gold solution).

Patterns, most explicit first: the last ``\\boxed{}``/``\\fbox{}`` (nested braces; boxes
written side by side, as in ``$\\boxed{-2}$ and $\\boxed{3}$``, are one list; a box left
unclosed at the end is read to the end of its math), the last ``<answer>...</answer>``,
GSM8K's ``#### N``, "Final Answer" (also as a bold heading with the value on the next
line), "the answer is ...", "the solutions are ...", ``A: N``, a completion ending in a math
span ("..., which is $\\frac{1}{6}$."), the last markdown bold, a completion that is only
math, and (unless strict) the value stated by the last sentence that states one, skipping
checks, estimates and restated givens after it (:func:`_fallback`), each number taken with
the whole expression it belongs to or not at all (``Therefore 7/2`` is ``7/2``;
``abc12def`` gives nothing). A box followed by a stated final answer was an intermediate
result.

This runs in the trainer process, outside the workers' time budget, so every step is linear
in the text and the text is bounded: only the last ``MAX_SCAN`` characters are searched, and
only the first ``MAX_TAIL`` characters after a marker are read.
"""

from __future__ import annotations

import re
from fractions import Fraction
from itertools import islice

from grpo_core_plugins.rewards.math.normalise import _VULGAR, separators
from grpo_core_plugins.rewards.math.numbers import plain_number
from grpo_core_plugins.rewards.math.units import unit_name, unit_word

MAX_SCAN = 20_000  # characters of the completion's tail that are searched
MAX_TAIL = 1_000  # characters read after an answer marker
MAX_BOXES = 2_000  # boxes looked at (the last ones)

_DIGITS = frozenset("0123456789") | frozenset(_VULGAR)
#: characters a plain-text expression is written with (the last-number fallback's reach)
_EXPR_CHARS = _DIGITS | frozenset(" \t+-−*/^().%=√π·×÷")
_PROSE_WORD = re.compile(r"(?<![\\A-Za-z0-9])[A-Za-z]{2,}")  # not 12abc
_MATH_WORDS = frozenset(
    {
        "and",
        "or",
        "sqrt",
        "pi",
        "infty",
        "infinity",
        "inf",
        "sin",
        "cos",
        "tan",
        "cot",
        "sec",
        "csc",
        "log",
        "ln",
        "exp",
        "arcsin",
        "arccos",
        "arctan",
        "pm",
        "mp",
        "cdot",
        "times",
        "frac",
        "dfrac",
        "tfrac",
    }
)
_HASH_RE = re.compile(r"####[ \t]*([-−+$\\\d.(][^\n]*)")  # a value, not a "#### Step 1" heading
#: "the answer is X"; X stops at a later "answer is" on its line ("The answer is 8. Wait, ...
#: so the answer is 9.": the last one wins)
_ANSWER_IS_RE = re.compile(
    r"answer\s+is\b[ \t]*[:：]?[ \t]*((?:(?!answer\s+is\b)[^\n])*)", re.IGNORECASE
)
_SOLUTIONS_RE = re.compile(
    r"\b(?:solutions?|roots?|zeros?|answers?)"
    r"(?:\s+(?:of|to)\s+[^\n]{1,60}?)?\s+(?:are|is)\b[ \t]*[:：]?[ \t]*"
    r"([^\n]*)",
    re.IGNORECASE,
)
_A_COLON_RE = re.compile(r"(?:^|\n)[ \t]*A[ \t]*[:：][ \t]*([^\n]+)")
_BOLD_RE = re.compile(r"\*\*([^*\n]{1,200})\*\*")
_SPAN_RE = re.compile(r"\s*(\$\$|\$|\\\(|\\\[)")
_CLOSERS = {"$$": "$$", "$": "$", "\\(": "\\)", "\\[": "\\]"}
_JOIN_RE = re.compile(r"\s*(?:[,;]\s*(?:and|or)\b|[,;]|and\b|or\b)\s*", re.IGNORECASE)
_STRICT_LEAD = re.compile(r"(?:\bis|\bare|\bbe|\bequals|=|:)\s*$", re.IGNORECASE)
#: what may stand between boxes that make one answer: math delimiters, spacing, commas,
#: "and"/"or" (also as ``\\quad\\text{and}\\quad``), and a name before the next box (``b =``)
_BOX_GAP = re.compile(
    r"(?:[\s$,;&]|\\[()\[\],;: ]|\\q?quad\b|\\text\s*\{\s*(?:and|or|,)?\s*\}|"
    r"\b(?:and|or)\b)*(?:[A-Za-z](?:_\{?\w{1,3}\}?)?\s*=[\s$]*)?",
    re.IGNORECASE,
)
_MARKS = ("\\boxed", "\\fbox")
#: a single-letter name right before a box: "y = "
_LABEL = re.compile(r"(?<![A-Za-z\\])([A-Za-z](?:_\{?\w{1,3}\}?)?)\s*=\s*\$?\s*$")
_DOLLARS = re.compile(r"(?<!\\)\$+")  # math delimiters, not an escaped \$


def _brace_map(text: str) -> dict[int, int]:
    """Position of each '{' -> its matching '}', in one pass (unmatched ones are absent)."""
    match, stack = {}, []
    for j, c in enumerate(text):
        if c == "{":
            stack.append(j)
        elif c == "}" and stack:
            match[stack.pop()] = j
    return match


def _box_at(text: str, start: int, match: dict[int, int] | None = None) -> tuple[str, int] | None:
    """(content, end) of the box whose command starts at ``start``; None if unreadable.

    An unclosed box is read to the end of its math (``$``, ``\\]`` or a blank line) with its
    open braces closed, when what it holds looks like math.
    """
    i = start + (6 if text.startswith("\\boxed", start) else 5)
    while i < len(text) and text[i] == " ":
        i += 1
    if i < len(text) and text[i] != "{":  # \boxed 5
        m = re.match(r"[^\s$]{1,100}", text[i : i + 100])
        return (m.group(0), i + len(m.group(0))) if m else None
    if match is None:
        match = _brace_map(text[i:])
        end = match.get(0)
        end = None if end is None else end + i
    else:
        end = match.get(i)
    if end is not None:
        return text[i + 1 : end], end + 1
    rest = text[i + 1 : i + 1 + MAX_TAIL]
    for stop in ("$", "\\]", "\\)", "\n\n"):
        k = rest.find(stop)
        if k >= 0:
            rest = rest[:k]
    rest = rest.strip()
    if not rest or not (re.search(r"\d", rest) or "\\" in rest or len(rest) == 1):
        return None
    return rest + "}" * max(0, rest.count("{") - rest.count("}")), len(text)


def _boxes(text: str) -> list[tuple[int, int, str]]:
    """The last boxes in the text as (start, end, content), in order."""
    starts = []
    pos = len(text)
    while len(starts) < MAX_BOXES:
        k = max(text.rfind(m, 0, pos) for m in _MARKS)
        if k < 0:
            break
        starts.append(k)
        pos = k
    if not starts:
        return []
    match = _brace_map(text)
    out = []
    for k in reversed(starts):
        found = _box_at(text, k, match)
        if found is not None:
            out.append((k, found[1], found[0]))
    return out


def _joins(gap: str) -> bool:
    """Do two boxes with ``gap`` between them make one answer? Connectors only, or a few
    words ending in "and"/"or" in one sentence ("\\boxed{(3, 3)} for part (a) and
    \\boxed{(1, 1)}"; not "\\boxed{5} and then we find \\boxed{7}")."""
    if len(gap) > 60 or re.search(r"[.!?](?:\s|$)|\n\s*\n", gap):
        return False
    if _BOX_GAP.fullmatch(gap):
        return True
    joiners = list(re.finditer(r"\b(?:and|or)\b", gap))
    # only delimiters may follow the last one ("... and then we find" may not)
    return (
        bool(joiners)
        and len(re.findall(r"[A-Za-z]+", gap)) <= 8
        and bool(_BOX_GAP.fullmatch(gap[joiners[-1].end() :].replace("}", "")))
    )


def _box_group(text: str) -> tuple[str, int] | None:
    """(answer, end) of the last box, joined with the boxes written right before it."""
    boxes = _boxes(text)
    if not boxes:
        return None
    group = [boxes[-1]]
    for prev in reversed(boxes[:-1]):
        if not _joins(text[prev[1] : group[0][0]]):
            break
        group.insert(0, prev)
    contents = [c.strip() for _, _, c in group]
    if len(contents) == 1:
        return contents[0], group[-1][1]
    labels = [_LABEL.search(text, max(0, start - 20), start) for start, _, _ in group]
    if all(labels):  # x = \boxed{3}, y = \boxed{5}: the point x = 3, y = 5
        contents = [f"{m.group(1)} = {c}" for m, c in zip(labels, contents)]
    return ", ".join(contents), group[-1][1]


def boxed_answer(text: str) -> str | None:
    """The last box, joined with the boxes written right before it (``$\\boxed{a}$ and ...``,
    ``\\boxed{2} \\quad\\text{and}\\quad \\boxed{3}``, ``a = \\boxed{2}, b = \\boxed{5}``)."""
    group = _box_group(text)
    return None if group is None else group[0]


def _spans_end(s: str, pos: int = 0) -> tuple[list[str], int]:
    """Math spans from ``pos`` joined by commas/and/or (``$-2$ and $3$``), and where they end."""
    out, end = [], pos
    while len(out) < 50:
        m = _SPAN_RE.match(s, pos)
        if not m:
            break
        close = _CLOSERS[m.group(1)]
        stop = s.find(close, m.end(), m.end() + MAX_TAIL)
        if stop < 0:
            break
        out.append(s[m.end() : stop].strip())
        pos = end = stop + len(close)
        j = _JOIN_RE.match(s, pos)
        if not j or not _SPAN_RE.match(s, j.end()):
            break
        pos = j.end()
    return [x for x in out if x], end


def _spans(s: str) -> list[str]:
    return _spans_end(s)[0]


def _depth_zero_words(s: str):
    """Prose words (two letters or more, not a command) outside braces, as matches; one pass."""
    depth, last = 0, 0
    for m in _PROSE_WORD.finditer(s):
        depth += s.count("{", last, m.start()) - s.count("}", last, m.start())
        last = m.start()
        if depth == 0:
            yield m


def _prose(word: str) -> bool:
    return word.lower() not in _MATH_WORDS and not unit_word(word)


_HEDGE = re.compile(
    r"\b(?:not|no|never|approximately|about|around|roughly|nearly|almost|"
    r"least|most|than|between|either|maybe|perhaps|probably)\b",
    re.IGNORECASE,
)
_LAST_VERB = re.compile(r".*(?:\b(?:is|are|was|were|equals|be)\b|=)", re.IGNORECASE | re.DOTALL)


def _after_verb(s: str) -> str | None:
    """What a prose sentence states: the text after its last "is"/"are"/"=" ("The number of
    apples is 12"), else after its first ":" ("Total: 12"), else the value the sentence
    states as the fallback reads it ("Jane started 3 hours ago"); None when it states no
    single value."""
    if _HEDGE.search(s):
        return None  # "is not 5", "is at least 5", "is approximately 5": no stated value
    verb = _LAST_VERB.match(s)
    if verb:
        return s[verb.end() :].strip()
    colon = s.find(":")
    if colon >= 0:
        return s[colon + 1 :].strip()
    return _fallback(s)  # "After 3 days at 5 pages a day, she has read 15 pages": 15


def _cut_prose(s: str, sentence: bool = False) -> str:
    """``\\frac{1}{2} because ...`` -> ``\\frac{1}{2}``: math up to the first prose word.

    A word answer ("Monday") is left whole. With ``sentence`` (what follows "Final Answer:"),
    a text that starts with prose is read by :func:`_after_verb`."""
    for _ in range(4):
        for m in _depth_zero_words(s):
            if _prose(m.group(0)):
                break
        else:
            return s
        head = s[: m.start()]
        if any(c in _DIGITS or c == "\\" for c in head):
            return head.rstrip(" ,;:(")
        stated = None if head.strip() or not sentence else _after_verb(s)
        if not stated:
            return s
        s = stated
    return s


_QUOTED = re.compile(r'(?:\\?"|“)([^"“”\n]{1,200}?)\\?(?:"|”)')  # "...", \"...\", “...”


def _clean_tail(s: str, sentence: bool = False) -> str:
    """The answer at the start of ``s``: math spans, or the math at the start of its sentence
    (``sentence``: ``s`` may be a whole sentence that states the answer, see _cut_prose)."""
    s = s.strip()[:MAX_TAIL]
    quoted = _QUOTED.match(s)
    if quoted:  # The final answer is "$12$ and $13$".
        s = quoted.group(1)
    spans = _spans(s)
    if spans:
        s = ", ".join(boxed_answer(x) or x for x in spans)
    else:
        s = _cut_prose(re.split(r"\.(?:\s|$)", s, maxsplit=1)[0], sentence)
    s = re.sub(r"^\$+|\$+$", "", s).strip()
    s = re.sub(r"^\\\(|\\\)$|^\\\[|\\\]$", "", s).strip()
    inner = boxed_answer(s)
    if inner is not None:
        return inner.strip()
    bold = _BOLD_RE.search(s)
    if bold:
        s = bold.group(1)
    return s.rstrip(" .。,").strip().strip("$").strip()


def _final_answer(text: str) -> str | None:
    """What follows the last "Final Answer", on its line or (for a heading) the next one."""
    k = text.lower().rfind("final answer")
    if k < 0:
        return None
    rest = text[k + len("final answer") : k + len("final answer") + MAX_TAIL]
    rest = re.sub(r"^\s*(?:is\b)?[\s*#_:：]*", "", rest, count=1)
    rest = re.sub(
        r"^(?:the\s+)?(?:final\s+)?answer\s+is\b[\s:：]*", "", rest, count=1, flags=re.IGNORECASE
    )
    if rest.startswith(("$$", "\\[")):
        spans = _spans(rest)
        return spans[0] if spans else None
    if rest[:1] in (",", ".", "?", ";", "!"):
        return None  # "final answer" used in prose, not as a marker
    line = rest.split("\n", 1)[0].strip()
    return _clean_tail(line, sentence=True) if line else None


_TRAIL_CLOSERS = (("$$", "$$"), ("\\)", "\\("), ("\\]", "\\["), ("$", "$"))


def _trailing_math(text: str, strict: bool) -> tuple[str, int] | None:
    """(answer, position) when the completion ends in math: "..., which is $\\frac{1}{6}$."
    or "so $x = 2$ or $x = 5$."; the spans of the last sentence that run to the end."""
    tail = text[-MAX_TAIL:].rstrip(" \t\n.。!")
    for close, open_ in _TRAIL_CLOSERS:
        if tail.endswith(close) and len(tail) > len(close):
            k = tail.rfind(open_, 0, len(tail) - len(close))
            if k >= 0:
                break
    else:
        return None
    inner = tail[k + len(open_) : len(tail) - len(close)]
    if open_ in ("$", "\\(") and "\n" in inner:
        return None  # inline math does not run over a line break
    inner = inner.strip()
    if not inner or len(inner) > 400:
        return None
    found, start = [inner], k
    cut = max(tail.rfind(". ", 0, k), tail.rfind("\n", 0, k))
    for j in range(cut + 1, k):  # the earliest span whose and/or list reaches the end
        if tail[j] in "$\\" and _SPAN_RE.match(tail, j):
            spans, end = _spans_end(tail, j)
            if len(spans) > 1 and end >= len(tail):
                found, start = spans, j
                break
    if strict and not _STRICT_LEAD.search(tail[:start]):
        return None
    if _commentary(tail[max(tail.rfind(". ", 0, start), tail.rfind("\n", 0, start)) + 1 :]):
        return None  # "Thus $x = 7$. We can verify: $2(7) + 3 = 17$.": the fallback reads it
    return ", ".join(boxed_answer(x) or x for x in found), len(text) - len(tail) + start


def _bold_answer(bold: str) -> bool:
    """A bold span that can be an answer: math, or a few words; not a step's heading
    ("**Milk remaining after the third mile:**", "**Step 3: Add the lengths**")."""
    value = bold.strip().rsplit(":", 1)[-1]  # "Answer: 12"; "Step 3: Add them" is a heading
    return (
        any(c in _DIGITS or c == "\\" for c in value)
        or 0 < len(value.split()) <= 3
        and ":" not in bold
    )


def _marked_value(text: str, m: re.Match) -> str:
    """What follows a marker: the rest of its line, or (for "the answer is:" ending its line)
    the display math on the next lines."""
    if m.group(1).strip(" \t:："):
        return m.group(1)
    return text[m.end() : m.end() + MAX_TAIL]


def _stated_after(rest: str) -> str | None:
    """A final answer stated after the last box ("... so the final answer is 7"): an earlier
    box was an intermediate result."""
    found = _final_answer(rest)
    if found is None:
        matches = list(_ANSWER_IS_RE.finditer(rest))
        found = _clean_tail(_marked_value(rest, matches[-1])) if matches else None
    return found if found and any(c in _DIGITS or c == "\\" for c in found) else None


_GLUED = re.compile(r"(?<![\\A-Za-z])[A-Za-z]+\d")  # a1b2: letters glued to digits, not x^2


def _bare_math(text: str) -> str | None:
    """A completion that is only math: ``7/2``, ``\\frac{7}{2}``, ``3 1/2``, ``1 + \\sqrt{2}``."""
    whole = _DOLLARS.sub(" ", text).strip().rstrip(".").strip()
    if (
        len(whole) > 100
        or "\n" in whole
        or whole.count("{") != whole.count("}")
        or not any(c in _DIGITS or c == "\\" for c in whole)
    ):
        return None
    if _GLUED.search(whole) or any(_prose(m.group(0)) for m in _depth_zero_words(whole)):
        return None
    return whole


def _expression_start(tail: str, end: int) -> int:
    """Where the plain-text expression that ends at ``tail[end]`` starts."""
    start = end
    while start > 0 and (
        tail[start - 1] in _EXPR_CHARS
        or tail[start - 1] == ","
        and tail[start - 2 : start - 1].isdigit()
        and tail[start].isdigit()
    ):
        start -= 1
    return start


def _enclosing_span(tail: str, k: int) -> str | None:
    """The content of the ``$...$`` or ``\\(...\\)`` span around position ``k`` (``""`` for
    an unclosed ``\\(``), or None when ``k`` is in prose (a lone ``$`` is a currency sign):
    ``$x \\geq 5$`` is read whole."""
    dollars = [j for j in range(k) if tail[j] == "$" and tail[j - 1 : j] != "\\"]
    if len(dollars) % 2:
        close = tail.find("$", k)
        inner = tail[dollars[-1] + 1 : close].strip("$ \n") if close >= 0 else ""
        if inner and not any(_prose(m.group(0)) for m in _depth_zero_words(inner)):
            # not "$5, so 350$": dollar signs around prose are currency; inline math does
            # not run over a line break ("$ \n 9 \n $" is no answer)
            return "" if "\n" in tail[dollars[-1] : close] else inner
    opened = max(tail.rfind("\\(", 0, k), tail.rfind("\\[", 0, k))
    if opened >= 0 and opened > max(tail.rfind("\\)", 0, k), tail.rfind("\\]", 0, k)):
        close = re.compile(r"\\[)\]]").search(tail, k)
        inner = tail[opened + 2 : close.start()] if close else ""
        return "" if tail[opened + 1] == "(" and "\n" in inner else inner.strip()
    return None


#: a number, then "or"/"and" right before the last expression: "5 or 6", "x = 2 or x = 5"
_HEDGED = re.compile(r"\d[?)]?\s*,?\s*(?:\b(or)\b[^.\n\d]{0,12}|\band[ \t]*)$", re.IGNORECASE)
_CLOCK = re.compile(r"(\d{1,2})[ \t]*:[ \t]*$")  # the 4: of 4:30, the 3: of 3:4
_MERIDIEM = re.compile(r"[ \t]*([ap])\.?[ \t]?m\b\.?", re.IGNORECASE)  # after a clock time
_SCALE = re.compile(r"[ \t]*(?:hundred|thousand|million|billion|trillion)s?\b", re.I)
_UNIT_AFTER = re.compile(r"[ \t]*([A-Za-z]+\.?)([²³]|\^\{?[23]\}?)?")


def _ordinal(tail: str, stop: int) -> bool:
    """Is the number ending at ``stop`` an ordinal with its right suffix (1st, 12th, 23rd)?"""
    suffix = re.match(r"(st|nd|rd|th)(?![A-Za-z])", tail[stop : stop + 3])
    if not suffix or not tail[stop - 1 : stop].isdigit():
        return False
    tens = tail[stop - 2 : stop - 1]
    last = tail[stop - 1]
    right = "th" if tens == "1" else {"1": "st", "2": "nd", "3": "rd"}.get(last, "th")
    return suffix.group(1) == right


def _expression_end(tail: str, end: int) -> tuple[int, str] | None:
    """(where the expression ending at digit ``tail[end]`` stops, the unit written after it);
    None when letters are glued to the number (``12abc``, ``5th``) or an operator follows it
    (``3 +``): then the number is not a whole expression."""
    stop = end + 1
    meridiem = _MERIDIEM.match(tail, stop)
    if meridiem and re.search(r"\d:\d\d$", tail[max(0, stop - 5) : stop]):
        return stop, " " + meridiem.group(1).replace(".", "").lower() + "m"  # 3:45 a.m.
    while tail[stop : stop + 1] in ("%", "π", "∞", "²", "³"):
        stop += 1
    if _SCALE.match(tail, stop):
        return None  # 3,5 million: not the number 3,5
    unit = _UNIT_AFTER.match(tail, stop)
    if unit and unit_word(unit.group(1)) and unit_name(unit.group(1)) is not None:
        power = {"²": "^2", "³": "^3"}.get(unit.group(2), unit.group(2) or "")
        return stop, " " + unit.group(1) + power
    per = re.match(r"/([A-Za-z]+)\b", tail[stop : stop + 30])
    if per and unit_word(per.group(1)) or _ordinal(tail, stop):
        return stop, ""  # $57500/year, 6th place
    if re.match(r"[A-Za-z0-9]", tail[stop : stop + 1]):
        return None
    if tail[stop:].lstrip(" \t")[:1] in ("+", "-", "−", "*", "/", "^", "=", "×", "÷", "·"):
        return None
    return stop, ""


def _whole_from(tail: str, start: int, end: int) -> int | None:
    """Where the answer in ``tail[start:end]`` starts: after its last "=" (``3 + 4 = 7``,
    ``x=5``), at a clock time's hour (``4:30``); None when the expression is glued to what
    comes before it (``x2``, ``\\frac{7}{2}`` in prose) or ends a list (``3, 4``)."""
    equals = tail.rfind("=", start, end)
    if equals >= 0:
        return equals + 1
    start += len(re.match(r"(?:[ \t)]|\*\*)*", tail[start:end]).group(0))
    clock = _CLOCK.search(tail, max(0, start - 6), start)
    if clock:
        start = clock.start()
    prev = tail[start - 1 : start]
    if prev and (prev.isalnum() or prev in "_^\\{}|!:"):
        return None
    if re.search(r"\d\s*,\s*$", tail[max(0, start - 8) : start]):
        return None  # (3, 4), "sizes 3, 4, 5": one item of a list
    return start


def _last_expression(text: str, first: bool = True) -> str | None:
    """The whole plain-text expression around the last number, or None when that number is
    part of something else: ``Therefore 7/2`` -> ``7/2``, ``so x=5`` -> ``5``, ``3 + 4 = 7``
    -> ``7``, ``at 4:30 PM`` -> ``4:30 PM``, ``3/8 or 0.375`` and ``5 or 6`` whole (a list,
    which matches one gold only when every item does); ``abc12def``, ``x^2``, ``n - 2`` and
    ``3 +`` give None (junk, or a part)."""
    tail = separators(text[-MAX_TAIL:]) if first else text
    end = _last_digit(tail, len(tail))
    if end < 0:
        return None
    found = _expression_at(tail, end, first)
    return found[1] if found else None


def _last_digit(tail: str, before: int) -> int:
    """Position of the last digit (or ``∞``) in ``tail[:before]``; -1 when there is none."""
    return next((j for j in range(before - 1, -1, -1) if tail[j] in _DIGITS or tail[j] == "∞"), -1)


def _expression_at(tail: str, end: int, first: bool = True) -> tuple[int, str] | None:
    """(start, text) of the whole expression whose last digit is ``tail[end]``, or None when
    that number is part of something else (see :func:`_last_expression`)."""
    span = _enclosing_span(tail, end)
    if span is not None:
        return (_span_start(tail, end), span) if span else None
    found = _expression_end(tail, end)
    if found is None:
        return None
    stop, unit = found
    start = _expression_start(tail, end)
    hedge = _HEDGED.search(tail, max(0, start - 40), start)
    start = _whole_from(tail, start, end)
    if start is None:
        return None
    while tail[stop : stop + 1] == ")" and tail.count("(", start, stop) > tail.count(
        ")", start, stop
    ):
        stop += 1  # (5)
    run = tail[start:stop].strip()
    if (
        run[:1] in ("*", "/", "^", "×", "÷", "·")
        or run[:1] in "+-−"
        and run[1:2] in " \t"
        or tail[stop:].lstrip(" \t")[:1] == ")"
    ):
        return None  # n - 2, a/2: the rest of an expression; (3, 4): inside a bracket
    while run.startswith("(") and run.count("(") > run.count(")"):
        run = run[1:].strip()
    if run.count("(") != run.count(")"):
        return None
    if hedge is None:
        return start, run + unit
    before = _last_expression(tail[: hedge.start() + 1], first=False) if first else None
    if not before:
        return None
    return hedge.start(), f"{before} {'or' if hedge.group(1) else 'and'} {run}{unit}"


def _span_start(tail: str, k: int) -> int:
    """Where the math span around position ``k`` opens (see :func:`_enclosing_span`)."""
    return max(tail.rfind("$", 0, k), tail.rfind("\\(", 0, k), tail.rfind("\\[", 0, k), 0)


#: ends of sentences: ". " (not the point of 3.5), "!", "?", a line break
_SENTENCE_END = re.compile(r"[.!?](?=\s|$)|\n")
#: words of a sentence that estimates instead of stating: never the answer
_ESTIMATE = re.compile(
    r"(?<!\\)\b(?:estimat\w*|approx\w*|roughly|about|around|nearly|almost|close\s+to|"
    r"more\s+or\s+less|give\s+or\s+take|ballpark)\b",  # words; not \approx in math
    re.IGNORECASE,
)
#: words of a sentence that comments on an answer already stated: a check; a restated given
#: or a comparison, unless the sentence computes ("As a check, she started with 20.", "Note
#: that the problem gave us 20.", not "2 fewer than Aaron's 25: 25 - 2 = 23")
_CHECK = re.compile(
    r"\b(?:check\w*|verif\w*|confirm\w*|sanity|indeed|consistent|makes\s+sense|reasonable|"
    r"matches)\b",
    re.IGNORECASE,
)
_RESTATED = re.compile(
    r"\b(?:originally|initially|at\s+first|to\s+begin\s+with|started\s+with|recall|"
    r"we\s+know|than|note|problem|question|statement|mentioned|in\s+other\s+words|"
    r"equivalently)\b",
    re.IGNORECASE,
)
#: a sentence that refers back to what was said ("That's 48 a month", "This is 100 more")
_BACK_REFERENCE = re.compile(
    r"^\W*(?:this|that|that's|which|these|those|or)\b", re.IGNORECASE
)  # "Or 0.4 if rounded down": an alternative, not the answer
#: a sentence that concludes: it may state the answer
_CONCLUSION = re.compile(
    r"\b(?:so|thus|therefore|hence|total|answer|altogether|together|in\s+all|overall|finally|"
    r"result|gives?|giving|means|now|left|remain\w*|in\s+the\s+end|ends?\s+up)\b|=",
    re.IGNORECASE,
)
#: a sentence that states the final answer in so many words ("So she has 15 left.")
_FINAL = re.compile(
    r"^\W*(?:so|thus|therefore|hence|in\s+total|in\s+all|altogether|overall|finally|"
    r"in\s+conclusion)\b|\b(?:answer|in\s+total|altogether)\b",
    re.IGNORECASE,
)
_STATING = re.compile(
    r"\b(?:is|are|was|were|equals|be|becomes|"
    r"(?:simplif\w*|reduces?|comes?|equal|evaluates?|amounts?)\s+to)\b|=",
    re.IGNORECASE,
)
_NUMERIC = re.compile(r"[\d²³⁴⁵⁶⁷⁸⁹⁰¹√π∞½⅓⅔¼¾]")  # a number, a power, a root, a constant
_INFINITY_WORD = re.compile(
    r"\b(?:(negative|minus)\s+)?(?:positive\s+|plus\s+)?infini(?:ty|te)\b", re.IGNORECASE
)
_NO_LIMIT = re.compile(r"\b(?:does\s*n[o']t\s+exist|DNE)\b", re.IGNORECASE)


def _sentences(tail: str) -> list[tuple[int, int]]:
    """(start, end) of each sentence of ``tail`` that holds a number, in order."""
    out, start = [], 0
    for m in [*_SENTENCE_END.finditer(tail), None]:
        end = m.end() if m else len(tail)
        if _NUMERIC.search(tail, start, end) or _word_value(tail[start:end]):
            out.append((start, end))
        start = end
    return out


def _commentary(sentence: str) -> bool:
    """Does the sentence comment on an answer (a check, an estimate, a restated given) rather
    than state one? A sentence that states the final answer in so many words ("So the
    answer to the problem is 12") or a back-reference that concludes ("That gives 20 in
    total") states one; an estimate never does."""
    if _ESTIMATE.search(sentence):
        return True
    if _CHECK.search(sentence) or _RESTATED.search(sentence) and "=" not in sentence:
        return not _FINAL.search(sentence)
    return bool(_BACK_REFERENCE.search(sentence)) and not _CONCLUSION.search(sentence)


def _word_value(sentence: str) -> str | None:
    """A limit stated in words with no number: "the limit is infinity" -> ``\\infty``,
    "diverges to negative infinity" -> ``-\\infty``, "does not exist" -> ``\\text{DNE}``."""
    if any(c in _DIGITS for c in sentence):
        return None
    found = list(_INFINITY_WORD.finditer(sentence))
    limit = _NO_LIMIT.search(sentence)
    if limit and not found:
        return "\\text{DNE}"
    if len(found) == 1 and not limit and not re.search(r"\bnot\b", sentence, re.IGNORECASE):
        return "-\\infty" if found[0].group(1) else "\\infty"
    return None


def _value_key(expr: str):
    """What an expression's value is compared by when a sentence holds several: the exact
    number (``15``, ``15.0`` and ``15 apples`` alike), else its text without spaces."""
    head = re.sub(r"\s+[A-Za-z][A-Za-z.^{}0-9]*$", "", expr.strip())
    mixed = re.fullmatch(r"(\d+)\s+(\d+)/(\d+)", head)
    if mixed and 0 < int(mixed.group(2)) < int(mixed.group(3)):  # 2 1/3 is 7/3
        return int(mixed.group(1)) + Fraction(int(mixed.group(2)), int(mixed.group(3)))
    number = plain_number(head.replace("%", ""))
    return number if number is not None else re.sub(r"\s+", "", expr)


#: a number that restates a condition: "after 3 steps", "at $2 each", "by selling 9 eggs",
#: "if 3 workers"; up to two words between, none of them saying it is the result
_CONDITION = re.compile(
    r"\b(?:after|in|at|for|by|per|if|when|since|given|than|from|out\s+of)"
    r"(?:\s+(?!(?:total|sum|answer|result|left|remaining|altogether|all)\b)[A-Za-z'’]+){0,2}"
    r"\s+\$?$",
    re.IGNORECASE,
)


#: a value the sentence denies: "not 0", "rather than 9", "instead of 8"
_NEGATED = re.compile(r"\b(?:not|never|rather\s+than|instead\s+of)[ \t]+\$?$", re.IGNORECASE)


def _candidates(tail: str, start: int, end: int) -> list[tuple[int, str]] | None:
    """(start, text) of the whole expressions in ``tail[start:end]``, last first; None when
    its last number is part of something else (``x^2``, ``abc12``), as the last-number
    fallback refuses it."""
    out: list[tuple[int, str]] = []
    j = _last_digit(tail, end)
    while j >= start:
        found = _expression_at(tail, j)
        if found is None:
            if not out:
                return None
            k = j
        else:
            out.append((found[0], found[1]))
            k = min(found[0], j)
        while k > 0 and (tail[k - 1] in _DIGITS or tail[k - 1] in ".,"):
            k -= 1  # the rest of this number (15 of "15 or 16"), not a candidate of its own
        j = _last_digit(tail, k)
    return out


def _sentence_value(tail: str, start: int, end: int) -> str | None:
    """The one value a sentence states: after its last "is"/"are"/"=" when a number follows
    it, else the sentence's only value; several different values are resolved by the text's
    last computation (``9 * 2 = 18 ... makes $18 by selling 9 eggs at $2 each``), or refused."""
    words = _word_value(tail[start:end])
    if words:
        return words
    reason = _REASON.search(tail, start, end)
    if reason and _NUMERIC.search(tail, start, reason.start()):
        end = reason.start()  # "x = 3 is the solution since 2(3) + 1 = 7": the reason is not it
    verbs = [m for m in _STATING.finditer(tail, start, end) if _NUMERIC.search(tail, m.end(), end)]
    stated = _plain_math(tail[verbs[-1].end() : end]) if verbs else None
    if stated:
        return stated
    lo, hi = (verbs[-1].end() if verbs else start), end
    fraction = _prose_fraction(tail[lo:hi])
    if fraction:
        return fraction
    if verbs and re.match(r"\s*(?:what|how)\b", tail[lo:hi], re.IGNORECASE):
        lo, hi = start, verbs[-1].start()  # "So 36 is what we get from 2 and 3."
    if "=" not in tail[start:end] and _two_statements(tail, start, end):
        return None  # "The area is 36 and the perimeter is 24.": which one was asked?
    found = _candidates(tail, lo, hi)
    if found and lo > start and all(_condition(tail, start, k) for k, _ in found):
        found = _candidates(tail, start, hi)  # "20 apples are left from the 30 she bought"
    if not found:
        return None
    found = [(k, x) for k, x in found if not _NEGATED.search(tail, max(start, k - 20), k)]
    if not found:
        return None  # "the limit is infinity, not 0"
    values = {_value_key(x): x for _, x in reversed(found)}
    if len(values) == 1:
        return found[0][1]
    results = {  # "after 3 steps we have 17 left": 3 restates a condition
        _value_key(x): x for k, x in found if not _condition(tail, start, k)
    }
    if len(results) == 1:
        return next(iter(results.values()))
    return _computed(tail[:start], values)


#: plain-text math with a variable, a power or a root: ``x² + 2x + 1``, ``5x``, ``2√3``
_PLAIN_MATH = re.compile(r"[\sA-Za-z\d²³⁴⁵⁶⁷⁸⁹⁰¹⁻⁺+\-−*/^().√π·×÷±]{1,200}")
_NUMBER_UNIT = re.compile(r"[-−]?[\d.,/ ]+[ \t]*([A-Za-z]+\.?)(?:[²³]|\^\{?[23]\}?)?")
_SYMBOLIC = re.compile(r"(?<![A-Za-z])[a-z](?![A-Za-z])|[²³⁴⁵⁶⁷⁸⁹⁰¹√π^±]")


def _plain_math(segment: str) -> str | None:
    """What follows a sentence's stating verb when it is all plain-text math with a variable,
    power or root ("the derivative is 3x² − 4x."); None for prose or a plain number (those
    are read number by number)."""
    segment = segment.strip().rstrip(".!?;,").strip()
    if not _PLAIN_MATH.fullmatch(segment) or not _SYMBOLIC.search(segment):
        return None
    unit = _NUMBER_UNIT.fullmatch(segment)
    if unit and unit_word(unit.group(1)):
        return None  # 50 m²: a number and its unit, read number by number
    if _GLUED.search(segment) or any(_prose(m.group(0)) for m in _depth_zero_words(segment)):
        return None
    return segment


#: a LaTeX fraction or mixed number written in prose without math delimiters
_PROSE_FRACTION = re.compile(
    r"(?<![\w\\{}^_])(?:-?\d+\s*)?\\[dt]?frac\s*\{\s*\d+\s*\}\s*\{\s*\d+\s*\}(?![\w{^_])"
)


def _prose_fraction(segment: str) -> str | None:
    """The one LaTeX fraction of a prose segment with no other number ("the recipe needs 12
    \\frac{1}{2} cups"); None otherwise."""
    found = _PROSE_FRACTION.findall(segment)
    if len(found) != 1 or re.search(r"\d", _PROSE_FRACTION.sub(" ", segment)):
        return None
    return found[0].strip()


def _condition(tail: str, start: int, k: int) -> bool:
    """Does the expression at ``k`` restate a condition ("after 3 steps", "at $2 each")?"""
    return bool(_CONDITION.search(tail, max(start, k - 40), k - 1 if tail[k - 1 : k] == "$" else k))


_REASON = re.compile(r"\b(?:since|because)\b", re.IGNORECASE)
_WORD_VERB = re.compile(r"\b(?:is|are|was|were|equals|becomes)\b", re.IGNORECASE)


def _two_statements(tail: str, start: int, end: int) -> bool:
    """Does the sentence state two different values with two verbs ("the area is 36 and
    the perimeter is 24")? The last value before each following verb is compared."""
    verbs = list(_WORD_VERB.finditer(tail, start, end))
    stated = set()
    for verb, after in zip(verbs, [*verbs[1:], None]):
        found = _candidates(tail, verb.end(), after.start() if after else end) or []
        found = [x for k, x in found if not _NEGATED.search(tail, max(start, k - 20), k)]
        if found:  # "is not 10, which is 1,000.99": one statement
            stated.add(_value_key(found[0]))
    return len(stated) > 1


def _computed(body: str, values: dict) -> str | None:
    """The one of ``values`` that the text before the sentence computed last (the right side
    of its last "="), when no other of them is mentioned after that computation."""
    computed = list(re.finditer(r"=\s*\$?\s*(-?\d[\d,]*(?:\.\d+)?)", body))
    if not computed:
        return None
    last = computed[-1]
    key = _value_key(last.group(1))
    if key not in values:
        return None
    later = re.findall(r"\d+(?:\.\d+)?", body[last.end() :])
    if any(_value_key(x) in values and _value_key(x) != key for x in later):
        return None
    return values[key]


def _fallback(text: str) -> str | None:
    """The answer of a completion without a marker: the value stated by its last sentence
    that states one, skipping sentences that only comment on it (a check, an estimate, a
    restated given); None when that sentence states several values, or when it neither
    concludes nor computes and the sentence before it states a different value ("So she
    has 15 left. She started with 20.", "She is 12 years old. Her brother is 15.")."""
    tail = separators(text[-MAX_TAIL:])
    sentences = _sentences(tail)
    stated = [s for s in sentences if not _commentary(tail[s[0] : s[1]])]
    if not stated:
        return None
    start, end = stated[-1]
    value = _sentence_value(tail, start, end)
    if value is None or _CONCLUSION.search(tail[start:end]):
        return value
    earlier = stated[:-1]  # "She is 12 years old. Her brother is 15.": about whom?
    if earlier:
        before = _sentence_value(tail, *earlier[-1])
        if before is None or _value_key(before) != _value_key(value):
            return None  # "So she has 15 left. She started with 20.": which one?
    return value


#: a command written with its backslash doubled, as in a string escaped twice
_DOUBLED = re.compile(
    r"\\\\(?=(?:left|right|[dt]?frac|sqrt|boxed|pi|infty|text|cdot|le|ge|leq|geq|cup|"
    r"mathbb)(?![A-Za-z]))"
)


def extract_answer(text: str, strict: bool = False) -> str | None:
    """The final answer as a string, or None when nothing answer-like is found."""
    if not isinstance(text, str) or not text:
        return None
    text = _DOUBLED.sub(r"\\", _SPECIAL_TOKENS.sub("", text[-MAX_SCAN:]))
    return _find(text, strict)


_SPECIAL_TOKENS = re.compile(r"(?:\s*<\|[a-z_]{1,30}\|>[a-z]{0,12})+\s*$")  # <|im_start|>user


def _find(text: str, strict: bool) -> str | None:
    """The patterns of :func:`extract_answer`, most explicit first."""
    group = _box_group(text)
    if group is not None and group[0].strip():
        return _stated_after(text[group[1] :]) or group[0].strip()
    close = text.rfind("</answer>")
    open_ = text.rfind("<answer>", 0, close) if close >= 0 else -1
    tagged = text[open_ + len("<answer>") : close].strip() if open_ >= 0 else ""
    if tagged:  # <answer>...</answer> (R1-style format)
        return extract_answer(tagged, strict=False) if len(tagged) > 40 else _clean_tail(tagged)
    hashed = _HASH_RE.findall(text)
    if hashed and _clean_tail(hashed[-1]):
        return _clean_tail(hashed[-1])
    final = _final_answer(text)
    if final:
        return final
    trailing = _trailing_math(text, strict)
    last_paragraph = text.rstrip().rfind("\n\n")
    for pattern in (_ANSWER_IS_RE, _SOLUTIONS_RE, _A_COLON_RE):
        matches = list(pattern.finditer(text))
        if not matches:
            continue
        if trailing and matches[-1].start() < max(last_paragraph, 0):
            continue  # an earlier "the answer is" loses to the math the completion ends on
        found = _clean_tail(_marked_value(text, matches[-1]))
        if found:
            return found
    if trailing:
        return trailing[0]
    bold = [b for b in _BOLD_RE.findall(text) if _bold_answer(b)]
    if bold:  # **42**, **Answer: 42**
        return _clean_tail(bold[-1].rsplit(":", 1)[-1])
    whole = _bare_math(text)  # only math: unambiguous, also in strict mode
    if whole or strict:
        return whole
    return _fallback(text)


def gold_answer(gold) -> str:
    """Reduce a gold answer the way a completion is reduced: its math delimiters (``$...$``,
    ``$$...$$``) dropped, its boxes (several joined), a GSM8K ``#### N``, or a worked solution's
    final answer; units, degrees and ``\\text{}`` are left for the comparison."""
    text = _DOUBLED.sub(r"\\", str(gold)[-MAX_SCAN:].strip())
    boxed = boxed_answer(text)
    if boxed is not None and boxed.strip():
        return boxed.strip()
    m = _HASH_RE.findall(text)
    if m:
        return _clean_tail(m[-1])
    if "\n" in text or len(text) > 100 and len(list(islice(_depth_zero_words(text), 6))) > 5:
        found = extract_answer(text)  # a worked solution, on one line or several
        return found if found is not None else text
    text = _DOLLARS.sub(" ", text).strip()
    return re.sub(r"^\\\(|\\\)$|^\\\[|\\\]$", "", text).strip()
