"""Talking to models: the ``Backend`` protocol, its wire types and errors, and the adapters.

The adapters are loaded when first named (``backends.VLLMBackend``) or built through
``make_backend``, so importing the wire types (as ``router/`` does) stays cheap and never
imports aiohttp or litellm. ``ScriptedBackend`` (``backends.scripted``) answers from a script,
for tests of code that talks to a backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from backends.errors import (
    BackendConnectError,
    BackendError,
    BackendNotConfigured,
    BackendProtocolError,
    BackendRateLimited,
    BackendRejected,
    BackendStreamCut,
    BackendTimeout,
    BackendUnavailable,
    ContextLengthExceeded,
)
from backends.factory import BACKENDS, backend_class, import_from_string, make_backend
from backends.protocol import Backend
from backends.types import ChatChunk, ChatRequest, ChatResponse, Usage

if TYPE_CHECKING:
    from backends.litellm_backend import LiteLLMBackend
    from backends.openai_http import VLLMBackend
    from backends.scripted import ScriptedBackend

__all__ = [
    "BACKENDS",
    "Backend",
    "BackendConnectError",
    "BackendError",
    "BackendNotConfigured",
    "BackendProtocolError",
    "BackendRateLimited",
    "BackendRejected",
    "BackendStreamCut",
    "BackendTimeout",
    "BackendUnavailable",
    "ChatChunk",
    "ChatRequest",
    "ChatResponse",
    "ContextLengthExceeded",
    "LiteLLMBackend",
    "ScriptedBackend",
    "Usage",
    "VLLMBackend",
    "backend_class",
    "import_from_string",
    "make_backend",
]

_LAZY = {
    "VLLMBackend": "backends.openai_http:VLLMBackend",
    "LiteLLMBackend": "backends.litellm_backend:LiteLLMBackend",
    "ScriptedBackend": "backends.scripted:ScriptedBackend",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return import_from_string(_LAZY[name])
    raise AttributeError(f"module 'backends' has no attribute {name!r}")
