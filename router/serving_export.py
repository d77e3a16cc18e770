"""The serving export: what the hashed scorer needs, in a JSON file beside the skops file.

``complexity.skops`` stays the model's source of truth (trusted types, scikit-learn version
checked on load). Training writes ``complexity.serving.json`` beside it, and
``tiergate train --export-only`` rewrites it for an existing skops file. A serving process
reads the export with the standard library alone, so it never imports scikit-learn, SciPy,
skops or numpy. The file holds::

    {"format": "tiergate.complexity.serving", "format_version": 2, "model_text_version": 3,
     "source": {"file": "complexity.skops", "sha256": "…", "sklearn_version": "1.9.1"},
     "metadata": {"threshold": 0.319, "share_thresholds": […], …},   # as the skops file has it
     "experts": {
         "open": {"scale": 1.0, "offset": 0.0, "intercept": 0.19…, "branches": [
             {"analyzer": "word", "token_pattern": "…", "lowercase": true, "ngram_range": [1, 2],
              "n_features": 65536, "binary": false, "norm": "l2", "alternate_sign": false,
              "stop_words": null, "meta_only": false,
              "weights": {"dtype": "<f8", "sha256": "…", "base64": "…"}}, …]},
         "multiple_choice": {"scale": 2.0, "offset": -1.0, …}},
     "probes": [{"expert": "open", "text": "<model text>", "probability": 0.27…,
                 "score": 0.27…}, …]}

Per expert (``router.experts``): its output map and its scorer. Weights are the linear model's
coefficients for the branch (transformer weight folded in) as little-endian float64, so they
are exactly the fitted values; JSON numbers are written with Python's shortest round-tripping
repr, so intercepts and scores are exact too. ``probes`` are model texts with an expert's
pipeline's ``predict_proba`` on them and the score the skops file's output map makes of it,
computed by scikit-learn when the export was written; every expert has its own.

``read_serving_export`` refuses the file (``ServingExportError``) unless: format and
model-text version are this tiergate's; the skops file beside it has the recorded SHA-256 (an
export never outlives a retrain); every expert is there; each branch's weights have the
recorded length and SHA-256; and each expert's scorer and output map reproduce every one of its
probes' probability and score within 1e-9.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import sys
from array import array
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from router.classifier import (
    META_PREFIX,
    META_TOKEN_PATTERN,
    MODEL_TEXT_VERSION,
    HashedExpert,
    HashedLinearClassifier,
)
from router.experts import EXPERTS, Output, missing_experts
from router.model_file import ModelFileError
from router.scorer import HashedBranch, HashedLinearScorer, HashingSpec

__all__ = [
    "EXPORT_FORMAT",
    "EXPORT_FORMAT_VERSION",
    "PROBE_TOLERANCE",
    "ServingExportError",
    "encode_serving_export",
    "file_sha256",
    "read_serving_export",
    "serving_export_path",
    "write_serving_export",
]

EXPORT_FORMAT = "tiergate.complexity.serving"
EXPORT_FORMAT_VERSION = 2
PROBE_TOLERANCE = 1e-9
"""How far a probe's score may be from the pipeline's before the export is refused."""
_WEIGHTS_DTYPE = "<f8"


class ServingExportError(ModelFileError):
    """The serving export cannot be used (the skops file may still be)."""


def serving_export_path(model_path: Path) -> Path:
    """The export beside a model file (``complexity.skops`` → ``complexity.serving.json``)."""
    return model_path.with_suffix(".serving.json")


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _encode_weights(weights: array[float]) -> dict[str, str]:
    little = array("d", weights)
    if sys.byteorder == "big":
        little.byteswap()
    raw = little.tobytes()
    return {
        "dtype": _WEIGHTS_DTYPE,
        "sha256": hashlib.sha256(raw).hexdigest(),
        "base64": base64.b64encode(raw).decode("ascii"),
    }


def _encode_branch(branch: HashedBranch) -> dict[str, Any]:
    spec = branch.spec
    return {
        "analyzer": "word",
        "token_pattern": spec.token_pattern,
        "lowercase": spec.lowercase,
        "ngram_range": list(spec.ngram_range),
        "n_features": spec.n_features,
        "binary": spec.binary,
        "norm": spec.norm,
        "alternate_sign": spec.alternate_sign,
        "stop_words": None if spec.stop_words is None else sorted(spec.stop_words),
        "meta_only": spec.head_prefix is not None,
        "weights": _encode_weights(branch.weights),
    }


def _encode_expert(expert: HashedExpert) -> dict[str, Any]:
    for branch in expert.scorer.branches:
        prefix = branch.spec.head_prefix
        if prefix is not None and (prefix, branch.spec.token_pattern) != (
            META_PREFIX,
            META_TOKEN_PATTERN,
        ):
            raise ServingExportError("only the structural-token branch can be head-only")
    return {
        "scale": expert.output.scale,
        "offset": expert.output.offset,
        "intercept": expert.scorer.intercept,
        "branches": [_encode_branch(b) for b in expert.scorer.branches],
    }


def encode_serving_export(
    experts: Mapping[str, HashedExpert],
    *,
    metadata: Mapping[str, Any],
    source: Path,
    sklearn_version: str,
    probes: Sequence[tuple[str, str, float, float]],
) -> dict[str, Any]:
    """The export's content for ``experts`` made from the skops file ``source``; ``probes``
    are (expert, model text, the pipeline's probability, the score)."""
    return {
        "format": EXPORT_FORMAT,
        "format_version": EXPORT_FORMAT_VERSION,
        "model_text_version": MODEL_TEXT_VERSION,
        "source": {
            "file": source.name,
            "sha256": file_sha256(source),
            "sklearn_version": sklearn_version,
        },
        "metadata": dict(metadata),
        "experts": {name: _encode_expert(expert) for name, expert in experts.items()},
        "probes": [
            {"expert": name, "text": text, "probability": float(p), "score": float(score)}
            for name, text, p, score in probes
        ],
    }


def write_serving_export(path: Path, content: Mapping[str, Any]) -> None:
    """Write ``content`` (from ``encode_serving_export``) to ``path``, replacing it atomically."""
    text = json.dumps(content, indent=1, allow_nan=False) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(text, "utf-8")
    partial.replace(path)


def _decode_weights(data: Mapping[str, Any], n_features: int) -> array[float]:
    if data["dtype"] != _WEIGHTS_DTYPE:
        raise ServingExportError(f"weights of dtype {data['dtype']!r}, expected {_WEIGHTS_DTYPE}")
    raw = base64.b64decode(data["base64"], validate=True)
    if hashlib.sha256(raw).hexdigest() != data["sha256"]:
        raise ServingExportError("weights do not match their recorded sha256")
    if len(raw) != 8 * n_features:
        raise ServingExportError(f"{len(raw) // 8} weights for {n_features} features")
    weights = array("d")
    weights.frombytes(raw)
    if sys.byteorder == "big":
        weights.byteswap()
    if not all(math.isfinite(w) for w in weights):
        raise ServingExportError("weights are not all finite")
    return weights


def _decode_branch(data: Mapping[str, Any]) -> HashedBranch:
    if data["analyzer"] != "word":
        raise ServingExportError(f"analyzer {data['analyzer']!r} is not supported")
    meta_only = data["meta_only"]
    if meta_only is not False and meta_only is not True:
        raise ServingExportError("meta_only is not a boolean")
    if meta_only and data["token_pattern"] != META_TOKEN_PATTERN:
        raise ServingExportError("a meta-only branch must use the structural-token pattern")
    stop_words = data["stop_words"]
    low, high = data["ngram_range"]
    spec = HashingSpec(
        token_pattern=str(data["token_pattern"]),
        lowercase=bool(data["lowercase"]),
        ngram_range=(int(low), int(high)),
        n_features=int(data["n_features"]),
        binary=bool(data["binary"]),
        norm=data["norm"],
        alternate_sign=bool(data["alternate_sign"]),
        stop_words=None if stop_words is None else frozenset(str(w) for w in stop_words),
        head_prefix=META_PREFIX if meta_only else None,
    )
    return HashedBranch(spec, _decode_weights(data["weights"], spec.n_features))


def _check_header(data: Mapping[str, Any], model_path: Path) -> None:
    if data.get("format") != EXPORT_FORMAT:
        raise ServingExportError("not a tiergate serving export")
    if data.get("format_version") != EXPORT_FORMAT_VERSION:
        raise ServingExportError(
            f"export format {data.get('format_version')!r}, this tiergate reads "
            f"{EXPORT_FORMAT_VERSION}"
        )
    if data.get("model_text_version") != MODEL_TEXT_VERSION:
        raise ServingExportError(
            f"model-text version {data.get('model_text_version')!r}, this tiergate builds "
            f"{MODEL_TEXT_VERSION}"
        )
    try:
        actual = file_sha256(model_path)
    except OSError as exc:
        raise ServingExportError(f"cannot read {model_path}: {exc}") from exc
    if data["source"]["sha256"] != actual:
        raise ServingExportError(f"written for another {model_path.name} (sha256 differs)")


def _decode_expert(data: Mapping[str, Any]) -> HashedExpert:
    branches = [_decode_branch(b) for b in data["branches"]]
    output = Output(scale=float(data["scale"]), offset=float(data["offset"]))
    return HashedExpert(HashedLinearScorer(branches, float(data["intercept"])), output)


def _check_probes(experts: Mapping[str, HashedExpert], probes: Sequence[Mapping[str, Any]]) -> None:
    probed = {str(probe["expert"]) for probe in probes}
    if not set(experts) <= probed:
        raise ServingExportError(f"no probe texts for {', '.join(sorted(set(experts) - probed))}")
    for number, probe in enumerate(probes):
        expert = experts[str(probe["expert"])]
        p = expert.scorer(str(probe["text"]))
        for what, got, expected in (
            ("probability", p, float(probe["probability"])),
            ("score", expert.output(p), float(probe["score"])),
        ):
            if not abs(got - expected) <= PROBE_TOLERANCE:
                raise ServingExportError(
                    f"probe {number}: {what} {got!r}, the pipeline gave {expected!r}"
                )


def read_serving_export(path: Path, *, model_path: Path) -> HashedLinearClassifier:
    """The classifier in the export at ``path``, made from the skops file ``model_path``.

    Raises ``ServingExportError`` for a missing, malformed, stale or inexact export (see the
    module docstring); the caller then loads ``model_path`` itself.
    """
    try:
        data = json.loads(path.read_text("utf-8"))
        if not isinstance(data, dict):
            raise ServingExportError("not a JSON object")
        _check_header(data, model_path)
        if (missing := missing_experts(data["experts"])) is not None:
            raise ServingExportError(missing)
        experts = {name: _decode_expert(data["experts"][name]) for name in EXPERTS}
        _check_probes(experts, data["probes"])
        metadata = data["metadata"]
        if not isinstance(metadata, dict):
            raise ServingExportError("metadata is not an object")
        return HashedLinearClassifier(experts, metadata=metadata)
    except ServingExportError as exc:
        raise ServingExportError(f"{path}: {exc}") from exc
    except OSError as exc:
        raise ServingExportError(f"{path}: cannot read: {exc}") from exc
    except (ValueError, KeyError, TypeError, IndexError, UnicodeError) as exc:
        raise ServingExportError(f"{path}: malformed export: {exc!r}") from exc
