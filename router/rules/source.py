"""Rule files from text (YAML, or JSON — a YAML subset) to a compiled ``RuleSet``.

The text is composed into YAML nodes first, so every value keeps its line: a schema error names
the line of the offending value (``line 7: rules[1].when.prompt_tokens.gt: …``).
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import ValidationError

from router.catalog import Catalog
from router.rules.compiled import RuleSet, compile_rules
from router.rules.errors import RulesInvalid
from router.rules.schema import RuleFileModel

__all__ = ["MAX_RULE_BYTES", "parse_rules"]

MAX_RULE_BYTES = 256 * 1024
Path = tuple[str | int, ...]


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
    return compile_rules(
        model, lines={rid: _line_of(("rules", i), lines) for rid, i in seen.items()}
    )
