"""Rule files from text (YAML, or JSON — a YAML subset) to a compiled ``RuleSet``.

The text is composed into YAML nodes first, so every value keeps its line: a schema error names
the line of the offending value (``line 7: rules[1].when.prompt_tokens.gt: …``).

A rule file is untrusted input (any ``rules:<tenant>`` key sends one), so it is bounded before
anything walks it: at most ``MAX_RULE_BYTES``, nested at most ``MAX_RULE_DEPTH`` deep, and at most
``MAX_RULE_NODES`` values once every alias is expanded. The bounds are checked on the parser's
event stream, which neither expands aliases nor recurses, so a 300-byte "billion laughs" file is
refused after reading its 300 bytes (``_check_bounds``), where composing and validating it would
walk every alias path (minutes of CPU and gigabytes of memory). Callers on an event loop run
``parse_rules`` in a thread as well (``gateway.rules.registry``).
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import ValidationError

from router.aliases import alias_problem
from router.catalog import Catalog, Tier
from router.rules.compiled import RuleSet, compile_rules
from router.rules.errors import RulesInvalid
from router.rules.schema import RuleFileModel

__all__ = ["MAX_RULE_BYTES", "MAX_RULE_DEPTH", "MAX_RULE_NODES", "parse_rules"]

MAX_RULE_BYTES = 256 * 1024
MAX_RULE_DEPTH = 32
"""Deepest nesting of mappings and lists (a rule file needs about 6)."""
MAX_RULE_NODES = 50_000
"""Most values (scalars, mappings, lists) once aliases are expanded: about 80 times what a
file of ``MAX_RULE_BYTES`` without aliases can hold of rules that mean anything."""
Path = tuple[str | int, ...]


def _line(event: yaml.Event) -> int | None:
    mark = event.start_mark
    return None if mark is None else mark.line + 1


def _check_bounds(text: str) -> None:
    """Refuse a document nested deeper than ``MAX_RULE_DEPTH`` or holding more than
    ``MAX_RULE_NODES`` values with its aliases expanded — from the event stream, in time linear
    in the text: each anchor's expanded size is known when its node ends."""
    sizes: dict[str, int] = {}
    open_nodes: list[tuple[str | None, int]] = []  # (anchor, expanded size so far)
    total = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        size = 0
        anchor: str | None = None
        if isinstance(event, yaml.CollectionStartEvent):
            open_nodes.append((event.anchor, 1))
            if len(open_nodes) > MAX_RULE_DEPTH:
                raise RulesInvalid(
                    f"nested more than {MAX_RULE_DEPTH} levels deep",
                    line=_line(event),
                )
            continue
        if isinstance(event, yaml.CollectionEndEvent):
            anchor, size = open_nodes.pop()
        elif isinstance(event, yaml.ScalarEvent):
            anchor, size = event.anchor, 1
        elif isinstance(event, yaml.AliasEvent):
            if any(event.anchor == a for a, _n in open_nodes):
                raise RulesInvalid(
                    f"the alias *{event.anchor} refers to a node that contains it",
                    line=_line(event),
                )
            size = sizes.get(event.anchor or "", 0)  # an unknown anchor fails in compose
        else:
            continue
        if anchor is not None:
            sizes[anchor] = size
        if open_nodes:
            parent_anchor, parent_size = open_nodes[-1]
            open_nodes[-1] = (parent_anchor, parent_size + size)
        total = max(total, size, sum(n for _a, n in open_nodes))
        if total > MAX_RULE_NODES:
            raise RulesInvalid(
                f"more than {MAX_RULE_NODES} values once its aliases are expanded",
                line=_line(event),
            )


def _line_map(node: yaml.Node, path: Path, lines: dict[Path, int]) -> None:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            name = key.value if isinstance(key, yaml.ScalarNode) else str(key)
            lines[(*path, name)] = key.start_mark.line + 1
            _line_map(value, (*path, name), lines)
            lines[(*path, name)] = value.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _line_map(item, (*path, i), lines)


def _line_of(path: Path, lines: dict[Path, int]) -> int | None:
    for end in range(len(path), -1, -1):
        if path[:end] in lines:
            return lines[path[:end]]
    return None


def _dotted(path: Path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _compose(text: str) -> tuple[Any, dict[Path, int]]:
    if len(text.encode()) > MAX_RULE_BYTES:
        raise RulesInvalid(f"rule file is over {MAX_RULE_BYTES} bytes")
    try:
        _check_bounds(text)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        raise RulesInvalid(
            f"not valid YAML/JSON: {exc.problem}", line=None if mark is None else mark.line + 1
        ) from None
    except yaml.YAMLError as exc:
        raise RulesInvalid(f"not valid YAML/JSON: {exc}") from None
    lines: dict[Path, int] = {}
    if node is not None:
        _line_map(node, (), lines)
    return data, lines


def _location(loc: tuple[Any, ...]) -> Path:
    """Pydantic's error location without its type tags (``function-after[...]`` etc.)."""
    return tuple(p for p in loc if isinstance(p, int) or "[" not in str(p))


def _check_aliases(model: RuleFileModel, catalog: Catalog | None, lines: dict[Path, int]) -> None:
    """Alias names always; their targets too with ``catalog``."""
    tiers = {"auto", *(t.value for t in Tier)}
    models = tiers | ({d.model for d in catalog.deployments} if catalog is not None else set())
    for name, target in model.aliases.items():
        targets = models if catalog is not None else {target}
        why = alias_problem(name, target, reserved=models, targets=targets)
        if why is not None:
            raise RulesInvalid(why, line=_line_of(("aliases", name), lines), path=f"aliases.{name}")


def parse_rules(text: str, *, catalog: Catalog | None = None) -> RuleSet:
    """Validate and compile a rule file. With ``catalog``, deployment names are checked too.

    Raises ``RulesInvalid`` naming the line of the first problem.
    """
    data, lines = _compose(text)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise RulesInvalid("the top level must be a mapping with a 'rules' list", line=1)
    try:
        model = RuleFileModel.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        path = _location(tuple(first.get("loc", ())))
        message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
        raise RulesInvalid(message, line=_line_of(path, lines), path=_dotted(path)) from None
    seen: dict[str, int] = {}
    for i, rule in enumerate(model.rules):
        if rule.id in seen:
            raise RulesInvalid(
                f"rule id {rule.id!r} is already used by rules[{seen[rule.id]}]",
                line=_line_of(("rules", i, "id"), lines),
                path=f"rules[{i}].id",
            )
        seen[rule.id] = i
        name = rule.then.deployment
        if catalog is not None and name is not None and catalog.get(name) is None:
            raise RulesInvalid(
                f"unknown deployment {name!r}",
                line=_line_of(("rules", i, "then", "deployment"), lines),
                path=f"rules[{i}].then.deployment",
            )
    _check_aliases(model, catalog, lines)
    return compile_rules(
        model, lines={rid: _line_of(("rules", i), lines) for rid, i in seen.items()}
    )
