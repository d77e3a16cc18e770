"""Rules ready to evaluate: validated models with their regexes and time zones resolved once."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import tzinfo
from zoneinfo import ZoneInfo

from router.aliases import ModelAliases
from router.catalog import Tier
from router.rules.schema import Action, Condition, RuleFileModel, RuleModel

__all__ = [
    "DEFAULT_LARGE_WAIT_TARGET_S",
    "DEFAULT_SPILL_ON_DEADLINE",
    "DEFAULT_SPILL_TO",
    "CompiledRule",
    "RuleSet",
    "compile_rules",
]

DEFAULT_LARGE_WAIT_TARGET_S = 30.0
DEFAULT_SPILL_TO = (Tier.EXTERNAL, Tier.SMALL)
DEFAULT_SPILL_ON_DEADLINE = True


@dataclass(frozen=True, slots=True)
class CompiledRule:
    id: str
    description: str
    when: Condition
    then: Action
    text: re.Pattern[str] | None = None
    """``last_message.regex``, compiled once."""
    keywords: tuple[str, ...] = ()
    """``last_message.keywords`` (lower-cased unless case-sensitive): a substring test first,
    which is ~10x cheaper than a regex scan; ``keyword_text`` then checks word boundaries."""
    keyword_text: re.Pattern[str] | None = None
    case_sensitive: bool = False
    zone: tzinfo | None = None
    line: int | None = None
    scope: str = "tenant"
    """``tenant`` or ``global`` (from the global defaults)."""

    @property
    def uses_score(self) -> bool:
        return self.when.score is not None


def _text_parts(
    rule: RuleModel,
) -> tuple[re.Pattern[str] | None, tuple[str, ...], re.Pattern[str] | None, bool]:
    match = rule.when.last_message
    if match is None:
        return None, (), None, False
    flags = 0 if match.case_sensitive else re.IGNORECASE
    regex = None if match.regex is None else re.compile(match.regex, flags)
    if not match.keywords:
        return regex, (), None, match.case_sensitive
    words = "|".join(re.escape(k) for k in match.keywords)
    bounded = re.compile(rf"(?<!\w)(?:{words})(?!\w)", flags)
    keys = match.keywords if match.case_sensitive else tuple(k.lower() for k in match.keywords)
    return regex, keys, bounded, match.case_sensitive


@dataclass(frozen=True, slots=True)
class RuleSet:
    """Ordered rules (first match wins) and the defaults that apply when none decides."""

    rules: tuple[CompiledRule, ...] = ()
    large_wait_target_s: float | None = None
    spill_to: tuple[Tier, ...] | None = None
    lines: Mapping[str, int | None] = field(default_factory=dict)
    spill_on_deadline: bool | None = None
    aliases: ModelAliases = field(default_factory=ModelAliases)
    """The rules file's model aliases (a tenant's, then the global file's)."""

    @property
    def uses_score(self) -> bool:
        return any(rule.uses_score for rule in self.rules)

    @property
    def uses_lowered_text(self) -> bool:
        return any(rule.keywords and not rule.case_sensitive for rule in self.rules)

    @property
    def wait_target_s(self) -> float:
        target = self.large_wait_target_s
        return DEFAULT_LARGE_WAIT_TARGET_S if target is None else target

    @property
    def spill_order(self) -> tuple[Tier, ...]:
        return DEFAULT_SPILL_TO if self.spill_to is None else self.spill_to

    @property
    def deadline_spill(self) -> bool:
        """Whether traffic that cannot start on the large tier before its deadline spills."""
        return (
            DEFAULT_SPILL_ON_DEADLINE if self.spill_on_deadline is None else self.spill_on_deadline
        )

    def then(self, fallback: RuleSet) -> RuleSet:
        """These rules, then ``fallback``'s (global defaults); these defaults win where set."""
        return RuleSet(
            rules=self.rules + fallback.rules,
            large_wait_target_s=(
                self.large_wait_target_s
                if self.large_wait_target_s is not None
                else fallback.large_wait_target_s
            ),
            spill_to=self.spill_to if self.spill_to is not None else fallback.spill_to,
            spill_on_deadline=(
                self.spill_on_deadline
                if self.spill_on_deadline is not None
                else fallback.spill_on_deadline
            ),
            aliases=self.aliases.then(fallback.aliases),
        )

    def scoped(self, scope: str) -> RuleSet:
        rules = tuple(replace(r, scope=scope) for r in self.rules)
        return replace(self, rules=rules)


def compile_rules(model: RuleFileModel, *, lines: Mapping[str, int | None]) -> RuleSet:
    rules = []
    for rule in model.rules:
        regex, keywords, keyword_text, case_sensitive = _text_parts(rule)
        rules.append(
            CompiledRule(
                id=rule.id,
                description=rule.description,
                when=rule.when,
                then=rule.then,
                text=regex,
                keywords=keywords,
                keyword_text=keyword_text,
                case_sensitive=case_sensitive,
                zone=ZoneInfo(rule.when.time.tz) if rule.when.time is not None else None,
                line=lines.get(rule.id),
            )
        )
    return RuleSet(
        rules=tuple(rules),
        large_wait_target_s=model.defaults.large_wait_target_s,
        spill_to=model.defaults.spill_to,
        lines=dict(lines),
        spill_on_deadline=model.defaults.spill_on_deadline,
        aliases=ModelAliases.of(model.aliases),
    )
