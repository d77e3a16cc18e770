"""What a deployment can do, what a request needs, and the deployments that can serve it.

A request *needs* a capability when its body uses the feature (``needed_capabilities``):

=============== ==========================================================================
capability      the request has
=============== ==========================================================================
``vision``      an ``image_url`` content part in any message
``tools``       ``tools`` or the deprecated ``functions`` (non-empty), or a ``tool_choice``
                / ``function_call`` other than ``"none"``
``json_schema`` ``response_format: {"type": "json_schema", ...}``
``reasoning``   ``reasoning_effort``, a ``reasoning`` object or ``thinking`` (Anthropic's,
                through litellm), unless it asks for no reasoning (``"none"``, ``{"effort":
                "none"}``, ``{"type": "disabled"}``: ``no_reasoning_fields``, hints for every
                request)
=============== ==========================================================================

**Hints.** Applications written for OpenAI's reasoning models send reasoning parameters
(``reasoning_effort``, ``reasoning``, ``thinking``) and ``verbosity`` on every request (the
OpenAI Agents SDK's defaults for gpt-5 names do). When the client named its model through an
alias (``router.aliases``), those fields are *hints* (``hint_fields``): they do not restrict
the plan, and each deployment of it is sent them only where it can take them (``unsent``): the
reasoning parameters where it has ``reasoning``, ``verbosity`` where it also is a litellm
deployment (vLLM has no such parameter). A model named directly (``auto``, a tier, a
deployment id) keeps them as needs.

A deployment *has* the capabilities its config gives it (``deployments[].capabilities``);
unset, ``tools`` and ``json_schema`` (what vLLM serves for Llama 3.1 with its tool parser and
guided decoding, and hosted APIs serve) and neither ``vision`` nor ``reasoning``
(``DEFAULT_CAPABILITIES``). ``screen`` keeps the deployments that have every capability the
request needs, and says which capability ruled out each of the others: the planner plans over
what it keeps (``router.planner``), explain shows what it ruled out, and a request nothing
allowed can serve is refused naming what is missing (``MissingCapability``).
Pure: no I/O; a body is read, never changed (images and tools pass through to the backend as
sent).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from router.errors import MissingCapability

if TYPE_CHECKING:
    from router.catalog import Catalog, DeploymentSpec
    from router.plan import RoutePlan

__all__ = [
    "DEFAULT_CAPABILITIES",
    "HINTED",
    "Capability",
    "RuledOut",
    "Screen",
    "hint_fields",
    "needed_capabilities",
    "no_reasoning_fields",
    "screen",
    "unsent",
]


class Capability(StrEnum):
    VISION = "vision"
    TOOLS = "tools"
    JSON_SCHEMA = "json_schema"
    REASONING = "reasoning"

    @property
    def feature(self) -> str:
        """What in a request needs it, in words."""
        return _FEATURES[self][0]

    @property
    def param(self) -> str:
        """The request field that needs it (an error's ``param``)."""
        return _FEATURES[self][1]


_FEATURES: Mapping[Capability, tuple[str, str]] = {
    Capability.VISION: ("image parts in messages", "messages"),
    Capability.TOOLS: ("tools / tool_choice", "tools"),
    Capability.JSON_SCHEMA: ("response_format json_schema", "response_format"),
    Capability.REASONING: ("reasoning parameters", "reasoning_effort"),
}
_ORDER = tuple(Capability)
"""The order capabilities are listed in (explain, errors)."""
DEFAULT_CAPABILITIES = frozenset({Capability.TOOLS, Capability.JSON_SCHEMA})
"""A deployment whose config says nothing: tools and JSON schemas, no images, no reasoning."""
_REASONING_FIELDS = ("reasoning_effort", "reasoning", "thinking")
_VERBOSITY = "verbosity"
HINTED = frozenset({Capability.REASONING})
"""The capabilities whose fields are hints, not needs, for a model named through an alias."""


def _ordered(capabilities: Iterable[Capability]) -> tuple[Capability, ...]:
    """``capabilities`` in ``_ORDER``, each once."""
    given = frozenset(capabilities)
    return tuple(c for c in _ORDER if c in given)


def _has_image(messages: Any) -> bool:
    if not isinstance(messages, Sequence) or isinstance(messages, str):
        return False
    for message in messages:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, str) or not isinstance(content, Sequence):
            continue
        if any(isinstance(p, Mapping) and p.get("type") == "image_url" for p in content):
            return True
    return False


def _uses_tools(body: Mapping[str, Any]) -> bool:
    if body.get("tools") or body.get("functions"):
        return True
    return any(body.get(key) not in (None, "none") for key in ("tool_choice", "function_call"))


def needed_capabilities(body: Mapping[str, Any]) -> frozenset[Capability]:
    """The capabilities a chat request body needs (see the module docstring). A few lookups for
    a plain request; its messages' content parts are scanned only when they are lists."""
    needs: set[Capability] = set()
    if _has_image(body.get("messages")):
        needs.add(Capability.VISION)
    if _uses_tools(body):
        needs.add(Capability.TOOLS)
    response_format = body.get("response_format")
    if isinstance(response_format, Mapping) and response_format.get("type") == "json_schema":
        needs.add(Capability.JSON_SCHEMA)
    if any(_present(body, key) and not _asks_none(body, key) for key in _REASONING_FIELDS):
        needs.add(Capability.REASONING)
    return frozenset(needs)


def _present(body: Mapping[str, Any], key: str) -> bool:
    return body.get(key) not in (None, False)


def _asks_none(body: Mapping[str, Any], key: str) -> bool:
    """Whether reasoning field ``key`` asks for no reasoning: ``reasoning_effort: "none"``,
    ``reasoning: {"effort": "none"}``, ``thinking: {"type": "disabled"}``."""
    value = body.get(key)
    if key == "reasoning_effort":
        return value == "none"
    if not isinstance(value, Mapping):
        return False
    if key == "reasoning":
        return value.get("effort") == "none"
    return value.get("type") == "disabled"


def no_reasoning_fields(body: Mapping[str, Any]) -> tuple[str, ...]:
    """The reasoning fields of ``body`` that ask for no reasoning (``reasoning_effort:
    "none"``…). They need nothing, whatever the model is named, and are hints for every
    request: a deployment without ``reasoning`` is not sent them (it does not reason anyway,
    and may refuse the field)."""
    return tuple(k for k in _REASONING_FIELDS if _asks_none(body, k))


def hint_fields(body: Mapping[str, Any]) -> tuple[str, ...]:
    """The fields of ``body`` that are hints for a model named through an alias: its reasoning
    parameters and ``verbosity``, in that order, those it sets."""
    return tuple(k for k in (*_REASONING_FIELDS, _VERBOSITY) if _present(body, k))


def unsent(hints: Sequence[str], spec: DeploymentSpec) -> tuple[str, ...]:
    """Of ``hints`` (``hint_fields``), those ``spec`` is not sent: the reasoning parameters
    when it lacks ``reasoning``; ``verbosity`` unless it has ``reasoning`` and is a litellm
    deployment (litellm passes it to the providers that take it; vLLM has none)."""
    reasons = Capability.REASONING in spec.capabilities
    takes_verbosity = reasons and spec.provider == "litellm"
    return tuple(k for k in hints if not (takes_verbosity if k == _VERBOSITY else reasons))


@dataclass(frozen=True, slots=True)
class RuledOut:
    """A deployment the request cannot go to, and the capabilities it lacks."""

    deployment: str
    missing: tuple[Capability, ...]

    def describe(self) -> str:
        return f"{self.deployment} (no {', '.join(self.missing)})"


@dataclass(frozen=True, slots=True)
class Screen:
    """The catalog cut down to the deployments that can serve a request."""

    needs: tuple[Capability, ...]
    catalog: Catalog
    """Every deployment that has all of ``needs`` (the whole catalog when nothing is needed)."""
    ruled_out: tuple[RuledOut, ...] = ()

    def lacking(self, deployment: str) -> RuledOut | None:
        return next((r for r in self.ruled_out if r.deployment == deployment), None)

    def annotate(self, plan: RoutePlan) -> RoutePlan:
        """``plan`` with what the request needs, what that ruled out (``needs``,
        ``ruled_out``), and the latter at the end of its reason."""
        if not self.needs:
            return plan
        ruled_out = tuple((r.deployment, tuple(c.value for c in r.missing)) for r in self.ruled_out)
        reason = plan.reason
        if self.ruled_out:
            ruled = "; ".join(r.describe() for r in self.ruled_out)
            reason = f"{reason}; needs {', '.join(self.needs)}: not {ruled}"
        needs = tuple(c.value for c in self.needs)
        return replace(plan, needs=needs, ruled_out=ruled_out, reason=reason)

    def require_any(self, allowed: Sequence[DeploymentSpec]) -> None:
        """Refuse (``refusal``) a request that none of ``allowed`` can serve (with none
        allowed at all, the planner's own refusal says so)."""
        if self.ruled_out and allowed and all(self.lacking(d.model) for d in allowed):
            raise self.refusal(allowed)

    def refusal(self, candidates: Sequence[DeploymentSpec]) -> MissingCapability:
        """The refusal of a request none of ``candidates`` (the deployments the tenant may
        use) can serve: it names the capabilities they lack."""
        names = {d.model for d in candidates}
        missing = _ordered(c for r in self.ruled_out if r.deployment in names for c in r.missing)
        missing = missing or self.needs
        what = " and ".join(f"{c} ({c.feature})" for c in missing)
        allowed = ", ".join(sorted(names)) or "none"
        return MissingCapability(
            f"no deployment this request may use supports {what} (allowed: {allowed}); "
            "send the request without it, or configure a deployment with "
            f"capabilities.{missing[0]}: true",
            capability=missing[0].value,
            param=missing[0].param,
        )

    def pinned_refusal(self, spec: DeploymentSpec) -> MissingCapability | None:
        """The refusal of a request pinned to ``spec`` when ``spec`` lacks what it needs."""
        lacking = self.lacking(spec.model)
        if lacking is None:
            return None
        first = lacking.missing[0]
        what = " and ".join(f"{c} ({c.feature})" for c in lacking.missing)
        return MissingCapability(
            f"model {spec.model!r} does not support {what}; ask for 'auto' or a tier to be "
            "routed to a deployment that does",
            capability=first.value,
            param=first.param,
        )


def screen(catalog: Catalog, needs: frozenset[Capability]) -> Screen:
    """The deployments of ``catalog`` that have every capability in ``needs``."""
    if not needs:
        return Screen((), catalog)
    kept: list[DeploymentSpec] = []
    ruled: list[RuledOut] = []
    for spec in catalog.deployments:
        missing = _ordered(needs - spec.capabilities)
        if missing:
            ruled.append(RuledOut(spec.model, missing))
        else:
            kept.append(spec)
    if not ruled:
        return Screen(_ordered(needs), catalog)
    return Screen(_ordered(needs), replace(catalog, deployments=tuple(kept)), tuple(ruled))
