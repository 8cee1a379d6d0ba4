"""Reading a completion that marks no answer, sentence by sentence (issue #50).

The answer is what the last stating sentence states: the tail is cut into sentences;
sentences that only comment on an answer (an estimate, a check, a restated given, a
back-reference) are skipped; in the sentence left, the value after its last stating verb,
with conditions ("after 3 steps"), denials ("not 0") and reasons ("since ...") set aside,
and several values resolved by the text's last computation or refused. When the text
cannot tell which value is the answer, the reading gives None (the reward scores 0).
Linear in the text, which is bounded to its last ``MAX_TAIL`` characters.
"""

from __future__ import annotations

import re
from fractions import Fraction

from grpo_core_plugins.rewards.math.expressions import (
    DIGITS,
    GLUED,
    MAX_TAIL,
    depth_zero_words,
    expression_at,
    is_prose,
    last_digit,
)
from grpo_core_plugins.rewards.math.normalise import separators
from grpo_core_plugins.rewards.math.numbers import plain_number
from grpo_core_plugins.rewards.math.units import unit_word

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


def commentary(sentence: str) -> bool:
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
    if any(c in DIGITS for c in sentence):
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
    j = last_digit(tail, end)
    while j >= start:
        found = expression_at(tail, j)
        if found is None:
            if not out:
                return None
            k = j
        else:
            out.append((found[0], found[1]))
            k = min(found[0], j)
        while k > 0 and (tail[k - 1] in DIGITS or tail[k - 1] in ".,"):
            k -= 1  # the rest of this number (15 of "15 or 16"), not a candidate of its own
        j = last_digit(tail, k)
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
    if GLUED.search(segment) or any(is_prose(m.group(0)) for m in depth_zero_words(segment)):
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


def fallback(text: str) -> str | None:
    """The answer of a completion without a marker: the value stated by its last sentence
    that states one, skipping sentences that only comment on it (a check, an estimate, a
    restated given); None when that sentence states several values, or when it neither
    concludes nor computes and the sentence before it states a different value ("So she
    has 15 left. She started with 20.", "She is 12 years old. Her brother is 15.")."""
    tail = separators(text[-MAX_TAIL:])
    sentences = _sentences(tail)
    stated = [s for s in sentences if not commentary(tail[s[0] : s[1]])]
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
