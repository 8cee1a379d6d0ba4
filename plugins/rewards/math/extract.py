"""Finding the final answer in a completion (or in a worked gold solution).

Patterns, most explicit first: the last ``\\boxed{}``/``\\fbox{}`` (nested braces; boxes
written side by side, as in ``$\\boxed{-2}$ and $\\boxed{3}$``, are one list; a box left
unclosed at the end is read to the end of its math), the last ``<answer>...</answer>``,
GSM8K's ``#### N``, "Final Answer" (also as a bold heading with the value on the next
line), "the answer is ...", "the solutions are ...", ``A: N``, a completion ending in a math
span ("..., which is $\\frac{1}{6}$."), the last markdown bold, a completion that is only
math, and (unless strict) the value stated by the last sentence that states one, skipping
checks, estimates and restated givens after it (:mod:`.sentences`), each number taken with
the whole expression it belongs to or not at all (``Therefore 7/2`` is ``7/2``;
``abc12def`` gives nothing). A box followed by a stated final answer was an intermediate
result.

This runs in the trainer process, outside the workers' time budget, so every step is linear
in the text and the text is bounded: only the last ``MAX_SCAN`` characters are searched, and
only the first ``MAX_TAIL`` characters after a marker are read.
"""

from __future__ import annotations

import re
from itertools import islice

from grpo_core_plugins.rewards.math.expressions import (
    DIGITS,
    GLUED,
    MAX_TAIL,
    depth_zero_words,
    is_prose,
)
from grpo_core_plugins.rewards.math.sentences import commentary, fallback

MAX_SCAN = 20_000  # characters of the completion's tail that are searched
MAX_BOXES = 2_000  # boxes looked at (the last ones)

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
    return fallback(s)  # "After 3 days at 5 pages a day, she has read 15 pages": 15


def _cut_prose(s: str, sentence: bool = False) -> str:
    """``\\frac{1}{2} because ...`` -> ``\\frac{1}{2}``: math up to the first prose word.

    A word answer ("Monday") is left whole. With ``sentence`` (what follows "Final Answer:"),
    a text that starts with prose is read by :func:`_after_verb`."""
    for _ in range(4):
        for m in depth_zero_words(s):
            if is_prose(m.group(0)):
                break
        else:
            return s
        head = s[: m.start()]
        if any(c in DIGITS or c == "\\" for c in head):
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
    if commentary(tail[max(tail.rfind(". ", 0, start), tail.rfind("\n", 0, start)) + 1 :]):
        return None  # "Thus $x = 7$. We can verify: $2(7) + 3 = 17$.": the fallback reads it
    return ", ".join(boxed_answer(x) or x for x in found), len(text) - len(tail) + start


def _bold_answer(bold: str) -> bool:
    """A bold span that can be an answer: math, or a few words; not a step's heading
    ("**Milk remaining after the third mile:**", "**Step 3: Add the lengths**")."""
    value = bold.strip().rsplit(":", 1)[-1]  # "Answer: 12"; "Step 3: Add them" is a heading
    return (
        any(c in DIGITS or c == "\\" for c in value)
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
    return found if found and any(c in DIGITS or c == "\\" for c in found) else None


def _bare_math(text: str) -> str | None:
    """A completion that is only math: ``7/2``, ``\\frac{7}{2}``, ``3 1/2``, ``1 + \\sqrt{2}``."""
    whole = _DOLLARS.sub(" ", text).strip().rstrip(".").strip()
    if (
        len(whole) > 100
        or "\n" in whole
        or whole.count("{") != whole.count("}")
        or not any(c in DIGITS or c == "\\" for c in whole)
    ):
        return None
    if GLUED.search(whole) or any(is_prose(m.group(0)) for m in depth_zero_words(whole)):
        return None
    return whole


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
    return fallback(text)


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
    if "\n" in text or len(text) > 100 and len(list(islice(depth_zero_words(text), 6))) > 5:
        found = extract_answer(text)  # a worked solution, on one line or several
        return found if found is not None else text
    text = _DOLLARS.sub(" ", text).strip()
    return re.sub(r"^\\\(|\\\)$|^\\\[|\\\]$", "", text).strip()
