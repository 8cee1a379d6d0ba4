"""Finding the final answer in a completion (or in a worked gold solution).

Patterns, most explicit first: the last ``\\boxed{}``/``\\fbox{}`` (nested braces), the last
``<answer>...</answer>``, GSM8K's
``#### N``, "Final Answer: ...", "the answer is ...", ``A: N``, the last markdown bold, and
(unless strict) the last number in the text.
"""

from __future__ import annotations

import re

MAX_SCAN = 20_000  # characters of the completion's tail that are searched

_NUMBER = r"[-−+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?%?|[-−+]?\.\d+"
_NUMBER_RE = re.compile(_NUMBER)
_HASH_RE = re.compile(r"####\s*([^\n]+)")
_FINAL_RE = re.compile(r"final\s+answer\s*(?:is)?\s*[:：]?\s*([^\n]+)", re.IGNORECASE)
_ANSWER_IS_RE = re.compile(r"(?:the\s+)?answer\s+is\s*[:：]?\s*([^\n]+)", re.IGNORECASE)
_A_COLON_RE = re.compile(r"(?:^|\n)\s*A\s*[:：]\s*([^\n]+)")
_BOLD_RE = re.compile(r"\*\*([^*\n]{1,200})\*\*")
_TAG_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}``, ``\\boxed ...`` or ``\\fbox{...}``; braces nest."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = start + (6 if text.startswith("\\boxed", start) else 5)
    while i < len(text) and text[i] == " ":
        i += 1
    if i < len(text) and text[i] != "{":  # \boxed 5
        m = re.match(r"[^\s$]+", text[i:])
        return m.group(0) if m else None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:j]
    return None


def _clean_tail(s: str) -> str:
    """The answer at the start of ``s``: a $...$ span, or the text up to the sentence's end."""
    s = s.strip()
    math = re.match(r"^\$+([^$]+)\$+", s)
    s = math.group(1) if math else re.split(r"\.(?:\s|$)", s, maxsplit=1)[0]
    lead = re.match(r"^([-−+]?\d[\d,]*(?:\.\d+)?(?:/\d+)?)(?=[\s,;]+[A-Za-z])", s)
    if lead:  # "12, as computed above" -> "12"
        return lead.group(1).rstrip(",")
    s = re.sub(r"^\$+|\$+$", "", s).strip()
    s = re.sub(r"^\\\(|\\\)$|^\\\[|\\\]$", "", s).strip()
    inner = last_boxed(s)
    if inner is not None:
        return inner.strip()
    bold = _BOLD_RE.search(s)
    if bold:
        s = bold.group(1)
    return s.rstrip(" .。").strip().strip("$").strip()


def extract_answer(text: str, strict: bool = False) -> str | None:
    """The final answer as a string, or None when nothing answer-like is found."""
    if not isinstance(text, str) or not text:
        return None
    text = text[-MAX_SCAN:]
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    tagged = _TAG_RE.findall(text)
    if tagged and tagged[-1].strip():  # <answer>...</answer> (R1-style format)
        return extract_answer(tagged[-1].strip(), strict=False) if len(tagged[-1]) > 40 \
            else _clean_tail(tagged[-1])
    for pattern in (_HASH_RE, _FINAL_RE, _ANSWER_IS_RE, _A_COLON_RE):
        matches = pattern.findall(text)
        if matches:
            found = _clean_tail(matches[-1])
            if found:
                return found
    bold = _BOLD_RE.findall(text)
    if bold:
        return _clean_tail(bold[-1])
    whole = text.strip().rstrip(".")
    if _NUMBER_RE.fullmatch(whole):  # the completion is just a number: unambiguous
        return whole
    if strict:
        return None
    numbers = _NUMBER_RE.findall(text)
    return numbers[-1] if numbers else None


def gold_answer(gold) -> str:
    """Reduce a gold answer (plain, ``\\boxed{}`` or a GSM8K worked solution) to the answer."""
    text = str(gold)
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    m = _HASH_RE.findall(text)
    if m:
        return _clean_tail(m[-1])
    if "\n" in text.strip():
        found = extract_answer(text)
        return found if found is not None else text.strip()
    return text.strip()
