"""Loading the classifier a serving process uses: the serving export if it is good, else skops.

``load_serving_classifier(path)`` reads the serving export beside the skops file ``path``
(``router.serving_export``): no scikit-learn, SciPy, skops or numpy is imported. When there
is no export, or it is refused (made from another skops file, damaged weights, a probe score
off by more than 1e-9, another format), it logs why and loads the skops file with
scikit-learn as ``router.model_file.load_classifier`` always has (trusted types, scikit-learn
version check); only then are those libraries imported. Errors of that fallback
(``ModelFileError``) propagate: a model that cannot be loaded at all stops start-up.
"""

from __future__ import annotations

import logging
from pathlib import Path

from router.classifier import HashedLinearClassifier
from router.model_file import DEFAULT_MODEL_PATH, load_classifier
from router.serving_export import ServingExportError, read_serving_export, serving_export_path
from router.sklearn_classifier import SklearnClassifier

__all__ = ["load_serving_classifier"]

log = logging.getLogger(__name__)


def load_serving_classifier(
    path: Path | None = None,
) -> HashedLinearClassifier | SklearnClassifier:
    """The classifier for serving the model file ``path`` (``None``: the shipped one)."""
    path = DEFAULT_MODEL_PATH if path is None else path
    export = serving_export_path(path)
    if export.is_file():
        try:
            classifier = read_serving_export(export, model_path=path)
        except ServingExportError as exc:
            log.warning("serving export refused, loading %s with scikit-learn: %s", path, exc)
        else:
            log.info("classifier loaded from the serving export %s", export)
            return classifier
    else:
        log.warning("no serving export %s; loading %s with scikit-learn", export, path)
    return load_classifier(path)
