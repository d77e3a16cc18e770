"""The rule language's schema: what a rule file may say, validated by pydantic.

A file is ``{defaults?, rules: [...]}``; each rule is ``{id, description?, when?, then}``. Every
condition of ``when`` must hold (an absent one always holds); the first rule that matches wins.
See docs/rules.md for the reference.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from router.catalog import Tier

__all__ = [
    "Action",
    "Condition",
    "Defaults",
    "Range",
    "RuleFileModel",
    "RuleModel",
    "TextMatch",
    "TimeWindow",
]

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""Matched whole (``fullmatch``: ``$`` would let a trailing newline through, into ledger rows
and the ``x-tiergate-rule`` header)."""
_CONTROL = re.compile("[\x00-\x1f\x7f]")
_CLOCK = re.compile(r"^([01]\d|2[0-3]):[0-5]\d$")
MAX_REGEX_CHARS = 512
_NESTED_QUANTIFIER = re.compile(r"[+*}]\)[+*{]")
"""A quantified group whose last element is quantified, e.g. ``(a+)+`` or ``(\\w*)*``: the
classic catastrophic-backtracking shape, refused because regexes run on every request."""
Day = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
Priority = Literal["interactive", "standard", "batch"]


def _listify(value: object) -> object:
    return [value] if isinstance(value, str) else value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Range(_Strict):
    """A number's bounds; every bound given must hold."""

    gt: float | None = None
    gte: float | None = None
    lt: float | None = None
    lte: float | None = None

    @model_validator(mode="after")
    def _some_bound(self) -> Range:
        if self.gt is None and self.gte is None and self.lt is None and self.lte is None:
            raise ValueError("give at least one of gt, gte, lt, lte")
        return self


class TextMatch(_Strict):
    """On the last user message: a regular expression, or any of some keywords (whole words)."""

    regex: str | None = None
    keywords: tuple[str, ...] = ()
    case_sensitive: bool = False

    @field_validator("regex")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if len(value) > MAX_REGEX_CHARS:
            raise ValueError(f"regular expression longer than {MAX_REGEX_CHARS} characters")
        if _NESTED_QUANTIFIER.search(value):
            raise ValueError(
                "nested quantifier such as (a+)+: it can take exponential time on some messages"
            )
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"invalid regular expression: {exc}") from None
        return value

    @model_validator(mode="after")
    def _something(self) -> TextMatch:
        if self.regex is None and not self.keywords:
            raise ValueError("give regex or keywords")
        return self


class TimeWindow(_Strict):
    """Time of day ``[after, before)`` in ``tz`` (wraps past midnight when after > before),
    optionally only on some days."""

    after: str = "00:00"
    before: str = "24:00"
    days: tuple[Day, ...] = ()
    tz: str = "UTC"

    @field_validator("after", "before")
    @classmethod
    def _clock(cls, value: str) -> str:
        if value != "24:00" and not _CLOCK.match(value):
            raise ValueError(f"{value!r} is not a time of day HH:MM")
        return value

    @field_validator("tz")
    @classmethod
    def _zone(cls, value: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {value!r}") from None
        return value


def _no_control(names: tuple[str, ...]) -> tuple[str, ...]:
    """Request values never hold a control character (the edge refuses them), so a name with
    one could never match: refused, as a typo would be."""
    for name in names:
        if _CONTROL.search(name):
            raise ValueError(f"{name!r} contains a control character")
    return names


Names = Annotated[tuple[str, ...], Field(min_length=1), AfterValidator(_no_control)]


class Condition(_Strict):
    """``when``: all given conditions must hold."""

    tenant: Names | None = None
    app: Names | None = None
    tag: Names | None = None
    """Any of these tags (``x-tiergate-tags`` or ``metadata.tags``)."""
    user: Names | None = None
    """The OpenAI ``user`` field."""
    model: Names | None = None
    """The model the client asked for (``auto``, a tier, a deployment id; for a model alias,
    either the alias or its target)."""
    prompt_tokens: Range | None = None
    turns: Range | None = None
    """Conversation length: user messages in the request."""
    messages: Range | None = None
    last_message: TextMatch | None = None
    score: Range | None = None
    """The classifier's score (no score, e.g. a failing classifier: the condition fails)."""
    time: TimeWindow | None = None
    queue_wait_s: dict[Tier, Range] | None = None
    """Expected queue wait per tier, from the live snapshot."""
    circuit_open: Names | None = None
    """Any of these tiers (all its deployments unavailable) or deployments is unavailable."""

    _lists = field_validator(
        "tenant", "app", "tag", "user", "model", "circuit_open", mode="before"
    )(_listify)


class Action(_Strict):
    """``then``: what a matching rule changes; everything not given stays as it would be."""

    tier: Tier | None = None
    deployment: str | None = None
    threshold: float | None = Field(default=None, ge=0.0, le=1.0)
    target_large_share: float | None = Field(default=None, ge=0.0, le=1.0)
    forbid_tiers: tuple[Tier, ...] = ()
    forbid_external: bool = False
    """No external API: neither the external tier nor any litellm deployment."""
    max_tokens: int | None = Field(default=None, ge=1)
    max_cost_usd: Decimal | None = Field(default=None, gt=0)
    """Worst case per request (estimated prompt + max_tokens at list price)."""
    priority: Priority | None = None
    fallback: tuple[Tier, ...] | None = None
    """Tiers to fall back to after the first, in order (``[]``: none)."""
    continuation: bool | None = None
    """Allow (true) or forbid (false) continuing a broken stream on another deployment."""
    sticky: bool = True
    """False: a conversation that went large may drop to small under this rule."""

    _lists = field_validator("forbid_tiers", "fallback", mode="before")(_listify)

    @model_validator(mode="after")
    def _exclusive(self) -> Action:
        if self.tier is not None and self.deployment is not None:
            raise ValueError("give tier or deployment, not both")
        if self.threshold is not None and self.target_large_share is not None:
            raise ValueError("give threshold or target_large_share, not both")
        if self.tier is not None and self.tier in self.forbid_tiers:
            raise ValueError(f"tier {self.tier.value} is both chosen and forbidden")
        return self


class RuleModel(_Strict):
    id: str
    description: str = ""
    when: Condition = Condition()
    then: Action

    @field_validator("description")
    @classmethod
    def _text(cls, value: str) -> str:
        if "\x00" in value:
            raise ValueError("contains NUL (U+0000)")
        return value

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not _ID.fullmatch(value):
            raise ValueError("ids are 1-64 letters, digits, '.', '_' or '-'")
        return value


class Defaults(_Strict):
    """Behaviour when no rule decides."""

    large_wait_target_s: float | None = Field(default=None, gt=0)
    """Large tier's expected wait above which ``auto`` traffic spills (``None``: inherit;
    the built-in default is 30 s)."""
    spill_to: tuple[Tier, ...] | None = None
    """Where spilled traffic goes, first allowed wins (built-in: external, then small); ``[]``:
    no spill-over at all."""
    spill_on_deadline: bool | None = None
    """Whether ``auto`` traffic bound for the large tier also spills when it cannot start there
    before its deadline, whatever the target (``None``: inherit; built-in: true)."""

    _lists = field_validator("spill_to", mode="before")(_listify)


class RuleFileModel(_Strict):
    version: Literal[1] = 1
    defaults: Defaults = Defaults()
    aliases: dict[str, str] = Field(default_factory=dict)
    """Model aliases of the tenant (or, in the global file, of everyone): name or ``*`` pattern
    → ``auto``, a tier or a deployment id (``router.aliases``)."""
    rules: tuple[RuleModel, ...] = ()
