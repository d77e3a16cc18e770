"""Routing decisions: prompt features, classifier scoring and the pure planner.

``router.training`` (training and evaluation) is deliberately not imported here: the request
path never needs it. Nor is scikit-learn, SciPy, skops or numpy: serving scores with the
serving export (``load_serving_classifier``); they are imported only when a skops file is
loaded or written.
"""

from router.capabilities import Capability, needed_capabilities
from router.catalog import Catalog, DeploymentSpec, Signals, TenantPolicy, Tier
from router.classifier import Classifier, HashedLinearClassifier, model_text
from router.errors import (
    MissingCapability,
    ModelNotAllowed,
    NoDeploymentFits,
    RoutingError,
    UnknownModel,
)
from router.features import PromptFeatures, estimate_tokens, extract_text, message_text
from router.loader import load_serving_classifier
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
from router.serving_export import ServingExportError, serving_export_path
from router.sklearn_classifier import SklearnClassifier

__all__ = [
    "AUTO",
    "DEFAULT_MODEL_PATH",
    "FALLBACK_ORDER",
    "Capability",
    "Catalog",
    "Classifier",
    "DeploymentSpec",
    "HashedLinearClassifier",
    "MissingCapability",
    "ModelFileError",
    "ModelNotAllowed",
    "ModelVersionError",
    "NoDeploymentFits",
    "PromptFeatures",
    "RoutePlan",
    "RoutingError",
    "ServingExportError",
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
    "load_serving_classifier",
    "message_text",
    "model_text",
    "needed_capabilities",
    "save_classifier",
    "serving_export_path",
]
