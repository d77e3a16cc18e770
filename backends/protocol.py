"""The one interface the gateway uses to talk to a model."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol, runtime_checkable

from backends.types import ChatChunk, ChatRequest, ChatResponse

__all__ = ["Backend"]


@runtime_checkable
class Backend(Protocol):
    """A model endpoint (one replica of a deployment, or a hosted API).

    ``stream`` is declared with plain ``def``: implementations are ``async def ... yield``
    generators. Every failure is raised as a ``backends.errors.BackendError``.
    """

    @property
    def name(self) -> str: ...

    @property
    def address(self) -> str | None:
        """``host:port`` of the server it calls (for traces); ``None``: a provider's default."""
        ...

    async def chat(self, request: ChatRequest) -> ChatResponse: ...

    def stream(self, request: ChatRequest) -> AsyncIterator[ChatChunk]: ...

    async def aclose(self) -> None: ...
