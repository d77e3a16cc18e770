"""Model aliases: names applications send (``gpt-4o-mini``) mapped to what tiergate serves.

An alias maps a name, or a pattern with ``*`` wildcards (``gpt-4o*``), to ``auto``, a tier or a
deployment id. Aliases come in scopes, tried in order, and within a scope an exact name wins over
the patterns, and a longer pattern over a shorter one (then the order written). The planner tries
the aliases of the rules in force for the tenant (its rules file, then the global rules file),
then the tenant's config aliases, then the config's global ``aliases``. A name that is already
``auto``, a tier or a deployment id is never looked up, so a pattern cannot shadow a real model.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["Alias", "ModelAliases", "alias_problem"]

_NAME = re.compile(r"^[A-Za-z0-9*][A-Za-z0-9._:/@*+-]{0,127}$")


class Alias(NamedTuple):
    """An alias that matched: the name or pattern as written, and its target."""

    pattern: str
    target: str


@dataclass(frozen=True, slots=True)
class _Scope:
    exact: Mapping[str, str]
    patterns: tuple[tuple[str, re.Pattern[str], str], ...]

    def resolve(self, name: str) -> Alias | None:
        target = self.exact.get(name)
        if target is not None:
            return Alias(name, target)
        for pattern, regex, target in self.patterns:
            if regex.fullmatch(name):
                return Alias(pattern, target)
        return None


def _scope(mapping: Mapping[str, str]) -> _Scope:
    exact = {k: v for k, v in mapping.items() if "*" not in k}
    ordered = sorted(
        ((k, v) for k, v in mapping.items() if "*" in k), key=lambda kv: -len(kv[0])
    )  # sorted() is stable: equal lengths keep the order written
    patterns = tuple(
        (k, re.compile(".*".join(re.escape(part) for part in k.split("*"))), v) for k, v in ordered
    )
    return _Scope(exact, patterns)


@dataclass(frozen=True, slots=True)
class ModelAliases:
    """Alias scopes, the first tried first."""

    scopes: tuple[_Scope, ...] = ()

    @classmethod
    def of(cls, mapping: Mapping[str, str]) -> ModelAliases:
        """One scope from ``{name or pattern: target}``."""
        return cls((_scope(mapping),)) if mapping else cls()

    def then(self, other: ModelAliases) -> ModelAliases:
        """These scopes, then ``other``'s."""
        return ModelAliases(self.scopes + other.scopes)

    def resolve(self, name: str) -> Alias | None:
        for scope in self.scopes:
            found = scope.resolve(name)
            if found is not None:
                return found
        return None

    def exact_names(self) -> Iterator[Alias]:
        """Every exact (wildcard-free) alias, the first scope's first; a name once."""
        seen: set[str] = set()
        for scope in self.scopes:
            for name, target in scope.exact.items():
                if name not in seen:
                    seen.add(name)
                    yield Alias(name, target)

    def __bool__(self) -> bool:
        return bool(self.scopes)


def alias_problem(name: str, target: str, *, reserved: set[str], targets: set[str]) -> str | None:
    """Why ``name -> target`` cannot be an alias (``None``: it can). ``reserved``: names that
    are already models (``auto``, the tiers, the deployment ids); ``targets``: what an alias may
    point at (the same set)."""
    if not _NAME.match(name) or "**" in name:
        return f"alias {name!r}: letters, digits, . _ : / @ + - and * only, at most 128"
    if name in reserved:
        return f"alias {name!r} is already a model id ('auto', a tier or a deployment)"
    if target not in targets:
        return f"alias {name!r} points at {target!r}: not 'auto', a tier or a deployment id"
    return None
