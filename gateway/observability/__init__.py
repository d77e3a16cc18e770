"""Operating tiergate: structured logs with request ids (metrics live in ``gateway.metrics``)."""

from gateway.observability.logging import (
    JsonFormatter,
    bind_request_id,
    configure_logging,
    log_request,
    request_id_var,
)

__all__ = ["JsonFormatter", "bind_request_id", "configure_logging", "log_request", "request_id_var"]
