"""Routing rules in the service: SQL versions, hot reload, conversation stickiness, and the
edge's inputs to and outputs from the planner (the language itself is ``router.rules``)."""

from gateway.rules.edge import RuleInputs, RulesRuntime, capped_body, hold_conversation, rule_inputs
from gateway.rules.registry import RuleRegistry
from gateway.rules.sticky import StickyConversations, conversation_key
from gateway.rules.store import GLOBAL, RuleVersion, SqlRuleStore

__all__ = [
    "GLOBAL",
    "RuleInputs",
    "RuleRegistry",
    "RuleVersion",
    "RulesRuntime",
    "SqlRuleStore",
    "StickyConversations",
    "capped_body",
    "conversation_key",
    "hold_conversation",
    "rule_inputs",
]
