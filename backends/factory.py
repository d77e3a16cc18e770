"""Backends by provider name: a ``"provider" -> "module:Class"`` table, imported on first use.

Like uvicorn's ``HTTP_PROTOCOLS``: naming a provider costs nothing until one is built, so a
process without external deployments never imports litellm (seconds), and one without vLLM
deployments never imports the aiohttp adapter.

    backend = make_backend("vllm", name="small-0", base_url="http://10.0.0.5:8000", session=s)
    backend = make_backend("litellm", name="ext", litellm_model="openai/gpt-4o-mini", api_key=k)
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from backends.errors import BackendNotConfigured
from backends.protocol import Backend

__all__ = ["BACKENDS", "backend_class", "import_from_string", "make_backend"]

BACKENDS: Mapping[str, str] = MappingProxyType(
    {
        "vllm": "backends.openai_http:VLLMBackend",
        "litellm": "backends.litellm_backend:LiteLLMBackend",
    }
)


def import_from_string(path: str) -> Any:
    """The object a ``"package.module:attribute"`` string names."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ValueError(f"expected 'module:attribute', got {path!r}")
    return getattr(importlib.import_module(module_name), attr)


def backend_class(provider: str) -> type[Backend]:
    """The class serving ``provider``; ``BackendNotConfigured`` for an unknown one."""
    try:
        path = BACKENDS[provider]
    except KeyError:
        known = ", ".join(sorted(BACKENDS))
        raise BackendNotConfigured(f"unknown provider {provider!r} (known: {known})") from None
    cls: type[Backend] = import_from_string(path)
    return cls


def make_backend(provider: str, **kwargs: Any) -> Backend:
    """Build the backend for ``provider`` with its constructor's keyword arguments."""
    return backend_class(provider)(**kwargs)
