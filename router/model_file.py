"""Reading and writing classifier model files (skops, never pickle). Start-up only.

The skops file is the model's source of truth. A serving process normally reads the serving
export written beside it instead (``router.serving_export``; chosen by ``router.loader``), so
scikit-learn and skops are imported here only inside the functions that need them: the
training and evaluation code, and the start-up fallback when there is no usable export.

A model file is a skops archive of one dict::

    {"format": "tiergate.complexity", "format_version": 2, "model_text_version": 3,
     "sklearn_version": "1.9.1", "threshold": 0.42, ...,
     "experts": {"multiple_choice": {"pipeline": <Pipeline>, "scale": 2.0, "offset": -1.0},
                 "open": {"pipeline": <Pipeline>, "scale": 1.0, "offset": 0.0}}}

(format 1, before the experts, held one ``"pipeline"``; it is refused: retrain.)

It is loaded with an explicit list of trusted types (``TRUSTED_TYPES``): a file that holds any
other type is refused before anything in it is constructed. The scikit-learn version recorded
at training time must match the installed one in major.minor; estimators are not guaranteed to
survive other upgrades, so a mismatch is an error that says to retrain (``tiergate train``).

    ModelFileError          unreadable, untrusted or malformed file
    └── ModelVersionError   trained with another scikit-learn (major.minor) or model-text version
"""

from __future__ import annotations

import warnings
import zipfile
from pathlib import Path
from typing import Any

from router.classifier import MODEL_TEXT_VERSION
from router.experts import EXPERTS, Output
from router.sklearn_classifier import SklearnClassifier, SklearnExpert

__all__ = [
    "DEFAULT_MODEL_PATH",
    "FORMAT",
    "FORMAT_VERSION",
    "TRUSTED_TYPES",
    "ModelFileError",
    "ModelVersionError",
    "card_path",
    "load_classifier",
    "save_classifier",
]

FORMAT = "tiergate.complexity"
FORMAT_VERSION = 2
DEFAULT_MODEL_PATH = Path(__file__).resolve().parent / "models" / "complexity.skops"
"""The model shipped in the package (``router/models/``; declared as package data)."""

TRUSTED_TYPES = (
    "builtins.dict",
    "builtins.float",
    "builtins.list",
    "builtins.str",
    "builtins.tuple",
    "numpy.float64",
    "numpy.ndarray",
    "sklearn.feature_extraction.text.HashingVectorizer",
    "sklearn.linear_model._logistic.LogisticRegression",
    "sklearn.pipeline.FeatureUnion",
    "sklearn.pipeline.Pipeline",
)
"""Every type the experts' pipelines (``router.training.pipeline``) and the file are made of."""


class ModelFileError(Exception):
    """The model file cannot be used."""


class ModelVersionError(ModelFileError):
    """The model file was made for another scikit-learn or model-text version."""


def card_path(model_path: Path) -> Path:
    """The JSON card that sits beside a model file (``complexity.skops`` → ``complexity.json``)."""
    return model_path.with_suffix(".json")


def _major_minor(version: str) -> tuple[str, ...]:
    return tuple(version.split(".")[:2])


def save_classifier(classifier: SklearnClassifier, path: Path) -> None:
    """Write ``classifier`` (experts and metadata) to ``path``, recording library versions."""
    import sklearn
    import skops.io

    data: dict[str, Any] = {
        **classifier.metadata,
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "model_text_version": MODEL_TEXT_VERSION,
        "sklearn_version": sklearn.__version__,
        "experts": {
            name: {
                "pipeline": expert.pipeline,
                "scale": expert.output.scale,
                "offset": expert.output.offset,
            }
            for name, expert in classifier.experts.items()
        },
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    skops.io.dump(data, path, compression=zipfile.ZIP_DEFLATED, compresslevel=9)


def _read(path: Path) -> Any:
    import skops.io
    from sklearn.exceptions import InconsistentVersionWarning
    from skops.io.exceptions import UntrustedTypesFoundException

    try:
        with warnings.catch_warnings():
            # Patch-level differences are accepted; major.minor is checked below, clearly.
            warnings.simplefilter("ignore", InconsistentVersionWarning)
            return skops.io.load(path, trusted=list(TRUSTED_TYPES))
    except UntrustedTypesFoundException as exc:
        raise ModelFileError(f"{path}: refusing untrusted types in model file: {exc}") from exc
    except FileNotFoundError as exc:
        raise ModelFileError(f"{path}: model file not found") from exc
    except (OSError, ValueError, KeyError, TypeError, AttributeError, zipfile.BadZipFile) as exc:
        raise ModelFileError(f"{path}: cannot read model file: {exc}") from exc


def _check(path: Path, data: Any) -> None:
    import sklearn

    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ModelFileError(f"{path}: not a tiergate complexity model file")
    if data.get("format_version") != FORMAT_VERSION:
        raise ModelVersionError(
            f"{path}: model file format {data.get('format_version')!r}, "
            f"this tiergate reads {FORMAT_VERSION}; retrain with `tiergate train`"
        )
    if data.get("model_text_version") != MODEL_TEXT_VERSION:
        raise ModelVersionError(
            f"{path}: model trained on model-text version {data.get('model_text_version')!r}, "
            f"this tiergate builds version {MODEL_TEXT_VERSION}; retrain with `tiergate train`"
        )
    trained = str(data.get("sklearn_version", "unknown"))
    if _major_minor(trained) != _major_minor(sklearn.__version__):
        raise ModelVersionError(
            f"{path}: model trained with scikit-learn {trained}, installed is "
            f"{sklearn.__version__} (major.minor must match); retrain with `tiergate train` "
            f"or install scikit-learn {'.'.join(_major_minor(trained))}.x"
        )


def load_classifier(path: Path | None = None) -> SklearnClassifier:
    """Load a model file (``None``: the shipped one), checking types and versions.

    Imports scikit-learn, SciPy and skops (about 120 MB resident): a serving process uses
    ``router.loader.load_serving_classifier``, which reads the serving export when it can.
    """
    path = DEFAULT_MODEL_PATH if path is None else path
    data = _read(path)
    _check(path, data)
    metadata = {key: value for key, value in data.items() if key != "experts"}
    try:
        stored = data["experts"]
        experts = {
            name: SklearnExpert(
                stored[name]["pipeline"],
                Output(scale=float(stored[name]["scale"]), offset=float(stored[name]["offset"])),
            )
            for name in EXPERTS
        }
        return SklearnClassifier(experts, metadata=metadata)
    except (KeyError, ValueError, TypeError) as exc:
        raise ModelFileError(f"{path}: malformed model file: {exc!r}") from exc
