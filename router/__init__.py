"""Routing decisions: prompt features, classifier scoring and the pure planner.

``router.training`` (training and evaluation) is deliberately not imported here: the request
path never needs it.
"""

from router.catalog import Catalog, DeploymentSpec, Signals, TenantPolicy, Tier
from router.classifier import Classifier, SklearnClassifier, model_text
from router.errors import ModelNotAllowed, NoDeploymentFits, RoutingError, UnknownModel
from router.features import PromptFeatures, estimate_tokens, extract_text, message_text
from router.model_file import (
    DEFAULT_MODEL_PATH,
    ModelFileError,
    ModelVersionError,
    card_path,
    load_classifier,
    save_classifier,
)
from router.plan import RoutePlan
from router.planner import AUTO, FALLBACK_ORDER, decide

__all__ = [
    "AUTO",
    "DEFAULT_MODEL_PATH",
    "FALLBACK_ORDER",
    "Catalog",
    "Classifier",
    "DeploymentSpec",
    "ModelFileError",
    "ModelNotAllowed",
    "ModelVersionError",
    "NoDeploymentFits",
    "PromptFeatures",
    "RoutePlan",
    "RoutingError",
    "Signals",
    "SklearnClassifier",
    "TenantPolicy",
    "Tier",
    "UnknownModel",
    "card_path",
    "decide",
    "estimate_tokens",
    "extract_text",
    "load_classifier",
    "message_text",
    "model_text",
    "save_classifier",
]
