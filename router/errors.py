"""Why the router could not make a plan.

RoutingError
├── UnknownModel        the requested model is neither ``auto``, a tier nor a deployment
├── ModelNotAllowed     the tenant may not use the requested model or tier
└── NoDeploymentFits    no allowed deployment's ``max_model_len`` holds the request
"""

from __future__ import annotations

__all__ = ["ModelNotAllowed", "NoDeploymentFits", "RoutingError", "UnknownModel"]


class RoutingError(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UnknownModel(RoutingError):
    pass


class ModelNotAllowed(RoutingError):
    pass


class NoDeploymentFits(RoutingError):
    pass
