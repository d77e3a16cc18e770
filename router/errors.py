"""Why the router could not make a plan.

RoutingError
├── UnknownModel        the requested model is neither ``auto``, a tier nor a deployment
├── ModelNotAllowed     the tenant may not use the requested model or tier
├── NoDeploymentFits    no allowed deployment's ``max_model_len`` holds the request
└── MissingCapability   no allowed deployment can serve the request's images, tools, JSON
                        schema or reasoning parameters (``router.capabilities``)
"""

from __future__ import annotations

__all__ = [
    "MissingCapability",
    "ModelNotAllowed",
    "NoDeploymentFits",
    "RoutingError",
    "UnknownModel",
]


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


class MissingCapability(RoutingError):
    def __init__(self, message: str, *, capability: str, param: str) -> None:
        super().__init__(message)
        self.capability = capability
        """The first capability missing (``router.capabilities.Capability`` value)."""
        self.param = param
        """The request field that needs it."""
