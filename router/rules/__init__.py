"""Routing rules: a declarative language (YAML/JSON), validated with line numbers, evaluated
purely — first match wins. See docs/rules.md."""

from router.rules.compiled import (
    DEFAULT_LARGE_WAIT_TARGET_S,
    DEFAULT_SPILL_ON_DEADLINE,
    DEFAULT_SPILL_TO,
    CompiledRule,
    RuleSet,
)
from router.rules.context import RequestContext
from router.rules.errors import RulesInvalid
from router.rules.evaluate import Facts, Match, first_match
from router.rules.source import MAX_RULE_BYTES, parse_rules

__all__ = [
    "DEFAULT_LARGE_WAIT_TARGET_S",
    "DEFAULT_SPILL_ON_DEADLINE",
    "DEFAULT_SPILL_TO",
    "MAX_RULE_BYTES",
    "CompiledRule",
    "Facts",
    "Match",
    "RequestContext",
    "RuleSet",
    "RulesInvalid",
    "first_match",
    "parse_rules",
]
