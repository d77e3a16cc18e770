"""Paths and loaders shared by the deployment tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
SCHEMAS = DEPLOY / "schemas"


def load_schema(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((SCHEMAS / name).read_text(encoding="utf-8"))
    return data


def load_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def closed(schema: Any) -> Any:
    """A CRD schema as the API server applies it: fields it does not list are pruned, so for a
    manifest they are errors (``additionalProperties: false`` where properties are listed)."""
    if isinstance(schema, dict):
        out = {k: closed(v) for k, v in schema.items()}
        if (
            out.get("type") == "object"
            and "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [closed(v) for v in schema]
    return schema


def crd_errors(schema: str, doc: dict[str, Any]) -> list[str]:
    """What the closed CRD schema ``schema`` (a file in deploy/schemas) finds wrong in ``doc``."""
    validator = jsonschema.Draft7Validator(closed(load_schema(schema)))
    return [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(doc)]
