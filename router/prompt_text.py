"""What the classifier reads of a prompt, with its format taken off (model text version 4).

The same question arrives in many dresses: ten options or four, written ``A.``, ``(A)``, ``A)``
or inline, with an ``Answer:`` line, a "reply with the letter" instruction, a chat template
pasted into the message, a ``Question:`` header. None of that says how hard the question is, and
a model trained on one dress learns the dress (the version-3 model learnt MMLU-Pro's ten
options as "hard"). ``normalise`` strips it: the body the classifier reads is the question's
own text, then each option's text on its own line without its letter.

``intent_tokens`` are hand features that carry difficulty across kinds of prompt: trivial
intents (greetings, thanks, small talk, acknowledgements), transformations of given text
(translate, summarise, rewrite) whose cost is in the pasted text, not in thinking; and hard
asks (prove, derive, implement, design, optimise; concurrency, complexity), LaTeX and code
density, and the number of constraints.

Pure, and cheap: a few regex passes over the clipped message (``router.features.clip``).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

__all__ = ["Normalised", "intent_tokens", "normalise"]

_TEMPLATE_ROLE = re.compile(
    r"<\|im_start\|>\s*(system|user|assistant)\b|"
    r"<\|start_header_id\|>\s*(system|user|assistant)\s*<\|end_header_id\|>|"
    r"<start_of_turn>\s*(user|model)\b|"
    r"<\|(system|user|assistant)\|>",
)
_TEMPLATE_JUNK = re.compile(
    r"<\|[a-z_]{2,30}\|>|<end_of_turn>|<start_of_turn>|</?s>|<<SYS>>.*?<</SYS>>|\[/?INST\]",
    re.DOTALL,
)
_JUNK_MARKERS = ("<|", "<s>", "</s>", "<<SYS>>", "[INST]", "[/INST]", "_of_turn>")
_TRANSCRIPT_MARKERS = ("User:", "Human:", "USER:", "HUMAN:", "Q:")
_INST = re.compile(r"\[INST\](.*?)(?:\[/INST\]|$)", re.DOTALL)
_TRANSCRIPT = re.compile(r"(?:^|\n)(?:User|Human|USER|HUMAN|Q)\s*:\s*", re.MULTILINE)
_SECTION = re.compile(r"(?:^|\n)###\s*(?:Instruction|Input|Question)\s*:?\s*\n", re.IGNORECASE)
_RESPONSE_SECTION = re.compile(r"\n###\s*(?:Response|Answer)\s*:?.*$", re.IGNORECASE | re.DOTALL)
_TRAILING_ASSISTANT = re.compile(r"\n\s*(?:Assistant|ASSISTANT|A)\s*:\s*$")

_SCAFFOLD_LINE = re.compile(
    r"^\s*(?:"
    r"(?:the\s+|final\s+|correct\s+)?(?:answer|response|solution|output|choices?|options?)"
    r"\s*(?:is)?\s*[:\uff1a]?\s*(?:\(?[A-J]?\)?)?\s*\.?"
    r"|(?:please\s+)?(?:answer|respond|reply|choose|select|pick|output|give|write|return)\b"
    r"[^\n]{0,80}\b(?:letter|option|choice|answer)s?\b[^\n]{0,60}"
    r"|(?:let'?s\s+)?think\s+step\s+by\s+step\.?"
    r"|(?:question|problem)\s*(?:\d+)?\s*[:\uff1a]"
    r")\s*$",
    re.IGNORECASE,
)
_LEADING_LABEL = re.compile(r"^\s*(?:question|problem|q)\s*(?:\d+)?\s*[:\uff1a.]\s*", re.IGNORECASE)
_OPTION_LINE = re.compile(
    r"^[ \t]*(?:\(([A-Ja-j])\)|\[([A-Ja-j])\]|([A-J])[.):]|([a-j])\))[ \t]+(\S.*)$"
)
_INLINE_OPTION = re.compile(r"\(([A-J])\)\s*")
_LETTERS = "ABCDEFGHIJ"


@dataclass(frozen=True, slots=True)
class Normalised:
    """A message with its format taken off."""

    stem: str
    """The question or instruction, without options, headers and answer scaffolding."""
    options: tuple[str, ...]
    """The options' texts, without their letters (empty when fewer than two)."""

    @property
    def body(self) -> str:
        """What the word features read: the stem, then each option on its own line."""
        if not self.options:
            return self.stem
        return self.stem + "\n" + "\n".join(self.options)


def _last_user_turn(text: str) -> str:
    """The last user turn of a chat template or transcript pasted into one message."""
    if ("<|" in text or "<start_of_turn>" in text) and (
        roles := list(_TEMPLATE_ROLE.finditer(text))
    ):
        users = [
            m for m in roles if (m.group(1) or m.group(2) or m.group(3) or m.group(4)) == "user"
        ]
        if users:
            start = users[-1].end()
            after = [m.start() for m in roles if m.start() > start]
            text = text[start : after[0] if after else len(text)]
    if "[INST]" in text and (turns := _INST.findall(text)):
        text = turns[-1]
    if any(marker in text for marker in _JUNK_MARKERS):
        text = _TEMPLATE_JUNK.sub(" ", text)
    if "###" in text:
        text = _RESPONSE_SECTION.sub("", text)
        text = _SECTION.sub("\n", text)
    if any(marker in text for marker in _TRANSCRIPT_MARKERS):
        text = _TRAILING_ASSISTANT.sub("", text)
        turns = _TRANSCRIPT.split(text)
        if len(turns) > 2:
            text = turns[-1]
    return text


def _options(lines: list[str]) -> tuple[int, list[str]]:
    """(index of the first option line, option texts) of a run A, B, C, … of option lines."""
    run: list[str] = []
    start = -1
    for i, line in enumerate(lines):
        match = _OPTION_LINE.match(line)
        if match is None:
            if run and line.strip():
                break
            continue
        letter = next(g for g in match.groups()[:4] if g).upper()
        if letter == "A" and len(run) < 2:
            run, start = [match.group(5).strip()], i
        elif run and len(run) < 10 and letter == _LETTERS[len(run)]:
            run.append(match.group(5).strip())
    return (start, run) if len(run) >= 2 else (-1, [])


def _inline_options(text: str) -> tuple[str, list[str]]:
    """``stem (A) x (B) y …`` on one line: (stem, options)."""
    parts = _INLINE_OPTION.split(text)
    # parts: [stem, "A", text, "B", text, ...]
    letters = parts[1::2]
    if len(letters) < 2 or "".join(letters) != _LETTERS[: len(letters)]:
        return text, []
    return parts[0], [p.strip() for p in parts[2::2]]


_EDGE_LINES = 3


def _without_scaffolding(lines: list[str]) -> list[str]:
    """``lines`` without answer scaffolding among the first and last ``_EDGE_LINES`` lines."""
    if len(lines) <= 2 * _EDGE_LINES:
        return [line for line in lines if not _SCAFFOLD_LINE.match(line)]
    head = [line for line in lines[:_EDGE_LINES] if not _SCAFFOLD_LINE.match(line)]
    tail = [line for line in lines[-_EDGE_LINES:] if not _SCAFFOLD_LINE.match(line)]
    return head + lines[_EDGE_LINES:-_EDGE_LINES] + tail


def normalise(text: str) -> Normalised:
    """``text`` without its format: template, headers, option letters, answer scaffolding."""
    text = _last_user_turn(text)
    lines = text.strip().split("\n")
    start, options = _options(lines)
    stem_lines = lines[:start] if options else lines
    stem = "\n".join(_without_scaffolding(stem_lines)).strip()
    if not options and "(A)" in stem and "(B)" in stem:
        stem, found = _inline_options(stem)
        options = found
        stem = stem.strip()
    stem = _LEADING_LABEL.sub("", stem, count=1)
    return Normalised(stem, tuple(options))


_GREETING = re.compile(
    r"^(?:hi+|hello+|hey+|hiya|howdy|yo|sup|greetings|good\s+(?:morning|afternoon|evening|night)"
    r"|thanks?(?:\s+you)?(?:\s+(?:so|very)\s+much)?|thx|ty|cheers|ok(?:ay)?|k|cool|nice|great"
    r"|awesome|perfect|got\s+it|sounds\s+good|yes|yeah|yep|no|nope|sure|bye|goodbye|see\s+you"
    r"|lol|haha+|wow|how\s+are\s+you(?:\s+doing)?(?:\s+today)?|what'?s\s+up|who\s+are\s+you"
    r"|what\s+is\s+your\s+name|what'?s\s+your\s+name|good\s+job|well\s+done|test(?:ing)?)"
    r"(?:[\s,!.?]+(?:there|again|man|mate|friend|buddy|bot|so\s+much|a\s+lot|!|\.)*)*[\s!.?:)]*$",
    re.IGNORECASE,
)
_TRIVIAL = re.compile(
    r"\b(?:what\s+(?:time|day)\s+is\s+it|how\s+many\s+\w+\s+(?:are\s+)?in\s+an?\s+\w+"
    r"|convert\s+[\d.,]+|[\d.,]+\s*(?:°?[cf]|celsius|fahrenheit|km|miles?|kg|lbs?|pounds?|"
    r"feet|foot|ft|meters?|inches?|cm|ounces?|oz|liters?|gallons?|usd|eur|dollars?|euros?)\s+"
    r"(?:to|in|into)\b|capital\s+of|what\s+colou?r\s+is|spell\s+|synonym|antonym"
    r"|tell\s+me\s+a\s+joke|what\s+does\s+\w+\s+mean|define\s+\w+$)",
    re.IGNORECASE,
)
_TRIVIAL_CHARS = 240
"""Trivial asks are short: the pattern is tried on stems up to this long only."""
_WORD = re.compile(r"[a-z]+")
_TRANSFORM_WORDS = frozenset(
    [
        "translate",
        "translation",
        "summarize",
        "summarise",
        "summary",
        "summarization",
        "tldr",
        "paraphrase",
        "rephrase",
        "rewrite",
        "reword",
        "proofread",
        "shorten",
        "condense",
    ]
)
_TRANSFORM_PAIRS = frozenset(
    {
        ("fix", "grammar"),
        ("fix", "spelling"),
        ("fix", "typos"),
        ("correct", "grammar"),
        ("more", "formal"),
        ("more", "polite"),
        ("bullet", "points"),
        ("key", "points"),
        ("title", "for"),
    }
)
_HARD_PREFIXES = tuple(
    [
        "prove",
        "proof",
        "derive",
        "derivation",
        "lemma",
        "theorem",
        "rigorous",
        "formally",
        "implement",
        "lockfree",
        "concurren",
        "threadsafe",
        "deadlock",
        "mutex",
        "atomic",
        "distributed",
        "consensus",
        "scalab",
        "faulttoleran",
        "architect",
        "optimi",
        "complexity",
        "asymptotic",
        "algorithm",
        "compiler",
        "parser",
        "kernel",
        "cryptograph",
        "invariant",
        "induction",
        "eigen",
        "manifold",
        "homomorph",
        "isomorph",
        "topolog",
        "integral",
        "differential",
        "stochastic",
        "bayesian",
        "regression",
        "gradient",
        "tradeoff",
        "debug",
        "refactor",
        "vulnerab",
        "benchmark",
        "latency",
        "throughput",
    ]
)
_SUFFIXES = (
    "", "s", "e", "es", "ed", "d", "ing", "ion", "ions", "ation", "ations", "al", "ally", "ly",
    "er", "ers", "cy", "t", "ts", "ze", "zes", "zed", "zing", "zation", "se", "ses", "sed",
    "sing", "sation", "ity", "ities", "ic", "ics", "ical", "ure", "ures", "ism", "ent", "ence",
    "ility", "le", "ive", "ous", "ties", "y",
)  # fmt: skip
_HARD_WORDS = frozenset(prefix + suffix for prefix in _HARD_PREFIXES for suffix in _SUFFIXES)
"""The hard asks' word forms: each prefix with common endings, looked up whole (a set lookup
per word; a prefix test per word cost five times as much)."""
_HARD_PAIRS = frozenset(
    {
        ("show", "that"),
        ("lock", "free"),
        ("thread", "safe"),
        ("race", "condition"),
        ("memory", "ordering"),
        ("system", "design"),
        ("design", "a"),
        ("dynamic", "programming"),
        ("step", "by"),
        ("trade", "offs"),
        ("edge", "cases"),
        ("fault", "tolerant"),
        ("big", "o"),
    }
)
_CONSTRAINT_WORDS = frozenset(
    [
        "must",
        "should",
        "without",
        "ensure",
        "exactly",
        "only",
        "constraint",
        "constraints",
        "requirement",
        "requirements",
        "handle",
        "support",
    ]
)
_CONSTRAINT_PAIRS = frozenset(
    {
        ("at", "most"),
        ("at", "least"),
        ("no", "more"),
        ("given", "that"),
        ("such", "that"),
        ("for", "all"),
        ("there", "exists"),
        ("if", "and"),
    }
)
_BULLETS = ("\n- ", "\n* ", "\n1.", "\n2.")
_LATEX = re.compile(r"\\[A-Za-z]+|\$")
_CODE_MARKS = ("{", ";", "==", "->", "def ", "return ")


def _bucket(count: int, edges: tuple[int, ...]) -> int:
    for i, edge in enumerate(edges):
        if count < edge:
            return i
    return len(edges)


def intent_tokens(stem: str, prefix: str) -> list[str]:
    """Hand features of a (normalised) stem as structural tokens: a greeting or acknowledgement,
    a trivial ask, a transformation of given text, and buckets of hard asks, constraints,
    LaTeX and code marks. Word lookups in sets, not regex alternations: a few tens of µs."""
    p = prefix
    stripped = stem.strip()
    tokens: list[str] = []
    if len(stripped) <= 80 and _GREETING.match(stripped):
        tokens.append(f"{p}greet")
    if len(stripped) <= _TRIVIAL_CHARS and _TRIVIAL.search(stripped):
        tokens.append(f"{p}trivial")
    words = _WORD.findall(stripped.lower().replace("-", ""))
    pairs = set(itertools.pairwise(words))
    ends = words[:60] + words[-40:]
    if not _TRANSFORM_WORDS.isdisjoint(ends) or not _TRANSFORM_PAIRS.isdisjoint(pairs):
        tokens.append(f"{p}xform")
    hard = sum(map(_HARD_WORDS.__contains__, words)) + len(pairs & _HARD_PAIRS)
    tokens.append(f"{p}hard{_bucket(hard, (1, 2, 4))}")
    constraints = sum(map(_CONSTRAINT_WORDS.__contains__, words)) + len(pairs & _CONSTRAINT_PAIRS)
    constraints += sum(stripped.count(b) for b in _BULLETS)
    tokens.append(f"{p}cons{_bucket(constraints, (1, 3, 6))}")
    latex = len(_LATEX.findall(stripped)) if ("\\" in stripped or "$" in stripped) else 0
    tokens.append(f"{p}tex{_bucket(latex, (1, 3, 8, 20))}")
    code = sum(stripped.count(mark) for mark in _CODE_MARKS)
    tokens.append(f"{p}cc{_bucket(code, (1, 4, 12, 30))}")
    return tokens
