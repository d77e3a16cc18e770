"""Estimated usage: what an attempt is booked when its backend reported none for a call its
provider bills anyway.

The ledger books every attempt from the backend's own ``usage``. Some calls end without one:

- a hosted API (litellm deployments) reports usage only at the end of a stream, so its stream
  cut, stalled or abandoned by the client after it started has none (vLLM reports usage in every
  chunk: its broken streams keep their exact counts, never estimates);
- a call to a hosted API that timed out, or was cancelled (the client left), after it was sent
  never gets its answer, usage included, yet the provider bills the prompt it read and what it
  generated; the gateway cannot tell a provider still thinking from a connect that never
  completed, so it books both the same way;
- a stream, or an answer, that arrived without usage (a usage chunk lost after the
  ``finish_reason``, a provider that omits it);
- a hosted API's answer that arrived (a 2xx) but could not be read (``unreadable``: a body that
  is not JSON, or not a chat completion): the provider answered, and bills what it generated.

Such an attempt is booked from estimates and flagged (``Attempt.estimated``, and the row's
``estimated_micro_usd``):

- **prompt tokens**: ``router.features.estimate_request_tokens`` of the body sent (its messages,
  images, tool calls and results, tool definitions and output schema), the very number the
  edge used for rate limits and budget reservations (``PromptFeatures.estimated_prompt_tokens``);
- **completion tokens**: of what arrived, the larger of the content chunks (each carries at least
  one token) and the estimate of its text (a hosted API's chunk may carry several tokens, and
  tool-call arguments count too); of an answer that never arrived, or could not be read, 0
  (unknown: the flag says the row needs the provider's figure).

A call the provider refused (an HTTP error), that never connected, or that was never sent is
booked nothing, as before: no provider bills it. Nor is a call to vLLM that timed out or was
cancelled before its first chunk: no invoice comes from our own GPUs, whose hours the daily
true-up charges in full anyway (docs/costs.md).

A call still in flight when its worker died is booked by the run that takes the job over, from
what the dead run's note says about it (``gateway.queue.ownership.notes``; ``interrupted``): the
same rules, with what the note knows in place of what the dead worker knew.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from backends.errors import BackendError, BackendProtocolError
from backends.types import Usage
from router.features import estimate_request_tokens, estimate_tokens, message_text

__all__ = [
    "INTERRUPTED",
    "STOPPED_WAITING",
    "billed_without_usage",
    "estimate",
    "interrupted",
    "output_text",
    "unreadable",
]

STOPPED_WAITING = frozenset({"timeout", "cancelled"})
"""Outcomes where the gateway stopped waiting rather than the provider answering: a call sent to
a hosted API may then be in its hands, and on its invoice."""


def billed_without_usage(
    outcome: str, *, external: bool, sent: bool, answered: bool, unreadable: bool = False
) -> bool:
    """Whether an attempt that ends without usage is billed anyway: its backend ``answered``
    (a chunk or an answer arrived), or it was ``sent`` to a hosted (``external``) API and the
    gateway stopped waiting for it (``STOPPED_WAITING``) or could not read its answer
    (``unreadable``). vLLM's unreadable answers are booked nothing, as its other failures:
    no invoice comes from our own GPUs."""
    return answered or (sent and external and (unreadable or outcome in STOPPED_WAITING))


def unreadable(exc: BackendError) -> bool:
    """Whether ``exc`` says an answer arrived (a 2xx) that could not be read: a body that is not
    JSON, or not a chat completion (``BackendProtocolError`` with the 2xx status)."""
    return (
        isinstance(exc, BackendProtocolError) and exc.status is not None and exc.status // 100 == 2
    )


INTERRUPTED = "worker_lost"
"""The outcome of a call that was in flight when its worker died: how it ended is unknown."""


def interrupted(
    body: Mapping[str, Any], *, external: bool, usage: Usage | None, pieces: int
) -> tuple[Usage | None, bool]:
    """What a call in flight when its worker died is booked, and whether it is an estimate.
    ``usage``: the last usage the backend reported that the dead run's note kept (a vLLM
    stream's first chunk); ``pieces``: the content chunks it had relayed by then.

    - **A hosted API's call** was sent (a note names it only once it is about to be) and the
      provider bills it whatever became of the worker: the prompt estimate (or the prompt it
      reported) and, for completion, the larger of what it reported and the chunks known to
      have been relayed (0 for a call with no chunk: unknown, the provider may have generated
      the whole answer); flagged, as for a hosted call the gateway stopped waiting for.
    - **A vLLM call**: vLLM aborts a request when its connection closes, and the dead worker's
      connections closed with its process, so generation stopped there. What it computed is
      GPU time, which no provider invoices and the daily true-up charges to the pool in full;
      so it is booked as any vLLM call cut without usage is: the usage vLLM reported that the
      note kept (its own count, up to the stream's first chunk: the prompt exactly), else
      nothing. Not flagged: the flag tells finance to reconcile a row with an invoice, and there
      is none. An estimate here would move true-up shares between tenants on a guess (a prompt
      the prefix cache served, a request still waiting in vLLM's queue cost the pool next to
      nothing), and feed the pool's rolling rate with tokens nobody measured.
    """
    if external:
        prompt = usage.prompt_tokens if usage is not None else estimate(body).prompt_tokens
        completion = max(usage.completion_tokens if usage is not None else 0, pieces)
        return Usage(prompt, completion), True
    return usage, False


def estimate(body: Mapping[str, Any], texts: Iterable[str] = (), pieces: int = 0) -> Usage:
    """Estimated usage of a call with ``body``: its prompt, and the completion whose text
    (``texts``) arrived in ``pieces`` content chunks (none: 0)."""
    return Usage(estimate_request_tokens(body), max(pieces, estimate_tokens("".join(texts))))


def output_text(data: Mapping[str, Any]) -> list[str]:
    """The text of an answer or a chunk (``choices[].message`` or ``.delta``): content and tool
    calls, as ``router.features.message_text`` reads a message."""
    texts: list[str] = []
    for choice in data.get("choices") or ():
        if not isinstance(choice, Mapping):
            continue
        message = choice.get("message") or choice.get("delta")
        if isinstance(message, Mapping):
            text = message_text(message)
            if text:
                texts.append(text)
    return texts
