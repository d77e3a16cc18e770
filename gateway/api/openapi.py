"""The chat route's request schema for OpenAPI.

``POST /v1/chat/completions`` reads its raw body (size limit first, then JSON, then the schema),
so FastAPI cannot infer a request body from the handler. This publishes the same
``ChatCompletionRequest`` schema, with its definitions inlined, as the operation's request body,
so clients and the fuzzer see what the route accepts.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from gateway.api.schemas import ChatCompletionRequest

__all__ = ["chat_request_openapi", "request_openapi"]

_EXAMPLE = {
    "model": "auto",
    "messages": [{"role": "user", "content": "What is the capital of France?"}],
    "max_tokens": 64,
}


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            return _inline(defs[ref.removeprefix("#/$defs/")], defs)
        return {k: _inline(v, defs) for k, v in node.items() if k != "$defs"}
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    return node


def request_openapi(model: type[BaseModel], example: dict[str, Any]) -> dict[str, Any]:
    """``openapi_extra`` for a route that reads its raw body as ``model``."""
    schema = model.model_json_schema()
    inlined = _inline(schema, schema.get("$defs", {}))
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": inlined, "example": example}},
        }
    }


def chat_request_openapi() -> dict[str, Any]:
    """``openapi_extra`` for the chat route."""
    return request_openapi(ChatCompletionRequest, _EXAMPLE)
