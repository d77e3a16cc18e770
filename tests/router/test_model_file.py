from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import pytest
import sklearn
import skops.io

from router.classifier import MODEL_TEXT_VERSION
from router.experts import MULTIPLE_CHOICE
from router.features import PromptFeatures
from router.model_file import (
    DEFAULT_MODEL_PATH,
    FORMAT,
    FORMAT_VERSION,
    ModelFileError,
    ModelVersionError,
    card_path,
    load_classifier,
    save_classifier,
)
from router.sklearn_classifier import SklearnClassifier

PROMPTS = [
    "What is the capital of France?",
    "Prove Fermat's little theorem.",
    "",
    "How many legs does a spider have?\nA. 6\nB. 8\nC. 10",
]


def _dump(path: Path, classifier: SklearnClassifier, **overrides: Any) -> Path:
    data: dict[str, Any] = {
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
    data.update(overrides)
    skops.io.dump(data, path)
    return path


def _bump(version: str, *, minor: int = 0, patch: int = 0) -> str:
    major, mid, *rest = version.split(".")
    last = rest[0] if rest else "0"
    digits = "".join(ch for ch in last if ch.isdigit()) or "0"
    return f"{major}.{int(mid) + minor}.{int(digits) + patch}"


def test_round_trip_keeps_scores_and_metadata(
    tmp_path: Path, tiny_classifier: SklearnClassifier
) -> None:
    path = tmp_path / "m.skops"
    save_classifier(tiny_classifier, path)
    loaded = load_classifier(path)
    assert loaded.threshold == 0.5
    assert loaded.metadata["seed"] == 7
    assert loaded.metadata["sklearn_version"] == sklearn.__version__
    assert loaded.fast
    assert loaded.experts[MULTIPLE_CHOICE].output == tiny_classifier.experts[MULTIPLE_CHOICE].output
    for prompt in PROMPTS:
        features = PromptFeatures.from_text(prompt)
        assert loaded.score(features) == pytest.approx(tiny_classifier.score(features), abs=1e-12)


def test_file_is_a_skops_zip_not_a_pickle(
    tmp_path: Path, tiny_classifier: SklearnClassifier
) -> None:
    path = tmp_path / "m.skops"
    save_classifier(tiny_classifier, path)
    with zipfile.ZipFile(path) as archive:
        assert "schema.json" in archive.namelist()


@pytest.mark.parametrize(
    "trained", [pytest.param("0.24.2", id="old"), pytest.param(None, id="next-minor")]
)
def test_sklearn_major_minor_mismatch_is_refused(
    tmp_path: Path, tiny_classifier: SklearnClassifier, trained: str | None
) -> None:
    version = trained or _bump(sklearn.__version__, minor=1)
    path = _dump(tmp_path / "m.skops", tiny_classifier, sklearn_version=version)
    with pytest.raises(ModelVersionError) as info:
        load_classifier(path)
    message = str(info.value)
    assert version in message
    assert sklearn.__version__ in message
    assert "retrain" in message


def test_sklearn_patch_difference_is_accepted(
    tmp_path: Path, tiny_classifier: SklearnClassifier
) -> None:
    version = _bump(sklearn.__version__, patch=1)
    path = _dump(tmp_path / "m.skops", tiny_classifier, sklearn_version=version)
    assert load_classifier(path).metadata["sklearn_version"] == version


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        ({"model_text_version": MODEL_TEXT_VERSION + 1}, ModelVersionError),
        ({"format_version": FORMAT_VERSION + 1}, ModelVersionError),
        ({"format": "something.else"}, ModelFileError),
    ],
)
def test_other_versions_and_formats_are_refused(
    tmp_path: Path,
    tiny_classifier: SklearnClassifier,
    overrides: dict[str, Any],
    error: type[Exception],
) -> None:
    path = _dump(tmp_path / "m.skops", tiny_classifier, **overrides)
    with pytest.raises(error):
        load_classifier(path)


class Sneaky:
    """Not on the trusted list."""

    def __init__(self) -> None:
        self.payload = "x"


def test_a_file_without_an_expert_is_refused(
    tmp_path: Path, tiny_classifier: SklearnClassifier
) -> None:
    experts = {
        name: {"pipeline": e.pipeline, "scale": e.output.scale, "offset": e.output.offset}
        for name, e in tiny_classifier.experts.items()
        if name != MULTIPLE_CHOICE
    }
    path = _dump(tmp_path / "m.skops", tiny_classifier, experts=experts)
    with pytest.raises(ModelFileError, match="malformed"):
        load_classifier(path)


def test_a_format_1_file_of_one_pipeline_is_refused_with_retrain(
    tmp_path: Path, tiny_classifier: SklearnClassifier
) -> None:
    open_pipeline = next(iter(tiny_classifier.experts.values())).pipeline
    path = _dump(
        tmp_path / "m.skops",
        tiny_classifier,
        format_version=1,
        model_text_version=2,
        pipeline=open_pipeline,
        experts=None,
    )
    with pytest.raises(ModelVersionError, match="retrain"):
        load_classifier(path)


def test_untrusted_types_are_refused(tmp_path: Path, tiny_classifier: SklearnClassifier) -> None:
    path = _dump(tmp_path / "m.skops", tiny_classifier, extra=Sneaky())
    with pytest.raises(ModelFileError, match="untrusted"):
        load_classifier(path)


def test_missing_and_garbage_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="not found"):
        load_classifier(tmp_path / "absent.skops")
    garbage = tmp_path / "garbage.skops"
    garbage.write_bytes(b"\x80\x04not a zip at all")
    with pytest.raises(ModelFileError):
        load_classifier(garbage)


def test_card_path() -> None:
    assert card_path(Path("/x/complexity.skops")) == Path("/x/complexity.json")


def test_default_path_is_inside_the_package() -> None:
    assert DEFAULT_MODEL_PATH.parent.name == "models"
    assert DEFAULT_MODEL_PATH.parent.parent.name == "router"
    assert DEFAULT_MODEL_PATH.is_file()
