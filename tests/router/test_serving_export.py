"""The serving export: exact against the pipeline, refused when stale or damaged, and the
start-up loader's fallback to the skops file."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import random
import shutil
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sklearn.feature_extraction.text import HashingVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline
from typer.testing import CliRunner

from gateway.cli.main import app
from router.classifier import HashedLinearClassifier
from router.experts import EXPERTS, MULTIPLE_CHOICE, OPEN, PROBABILITY, expert_for
from router.features import PromptFeatures
from router.loader import load_serving_classifier
from router.model_file import DEFAULT_MODEL_PATH, load_classifier, save_classifier
from router.serving_export import (
    EXPORT_FORMAT_VERSION,
    ServingExportError,
    read_serving_export,
    serving_export_path,
)
from router.sklearn_classifier import SklearnClassifier, SklearnExpert
from router.training.data import load_rows
from router.training.export import export_model_file, probe_texts
from tests.router.conftest import DATA_DIR, EASY, HARD

SHIPPED_EXPORT = serving_export_path(DEFAULT_MODEL_PATH)


def _junk(n: int, seed: int) -> str:
    rng = random.Random(seed)
    return bytes(rng.randrange(256) for _ in range(n)).decode("latin-1")


EDGE_CASES = {
    "empty": "",
    "whitespace": " \n\t " * 40,
    "200k characters": "Explain this log line. " * 9_000,
    "200k one word": "x" * 200_000,
    "chinese": "请证明:对于所有正整数 n, n^3 - n 能被 6 整除。",
    "japanese": "次の文章を英語に翻訳してください。東京は日本の首都です。",
    "korean": "서울은 한국의 수도입니다. 이 문장을 설명하세요.",
    "russian": "Объясните, как работает сборщик мусора в Java.",
    "arabic": "ما هي عاصمة فرنسا؟",
    "greek maths": "Αποδείξτε ότι √2 είναι άρρητος. ∀x∈\u211d: x² ≥ 0",
    "emoji": "🙂🔥💯 " * 100,
    "binary junk": _junk(20_000, 5),
    "short junk": _junk(700, 9),
    "nul bytes": "\x00" * 5_000,
    "meta prefix repeated": "tgmlen9 tgmcode " * 50 + "\nTGMmath tgmopts4 tgmlatin",
    "meta prefix in the tail": "word " * 600 + "tgmcjk tgmup3",
    "meta prefix glued": "tgm tgmx xtgm tgm_ tgm1 _tgm2",
    "options": "Which is prime?\nA. 21\nB. 23\nC. 25\nD. 27",
    "code": "```python\ndef f(a, b):\n    return a == b\n```\nWhy does this fail?",
}


@pytest.fixture(scope="module")
def pipeline_classifier() -> SklearnClassifier:
    return load_classifier()


@pytest.fixture(scope="module")
def exported() -> HashedLinearClassifier:
    return read_serving_export(SHIPPED_EXPORT, model_path=DEFAULT_MODEL_PATH)


def _varied_features() -> list[PromptFeatures]:
    rows = load_rows(DATA_DIR)
    by_source: dict[str, list[str]] = {}
    for row in rows:
        by_source.setdefault(row.source, []).append(row.prompt)
    prompts: list[str] = []
    for source in sorted(by_source):
        pool = by_source[source]
        prompts.extend(pool[:: max(1, len(pool) // 45)][:45])
    prompts += [*EASY, *HARD, *EDGE_CASES.values()]
    features = [PromptFeatures.from_text(p) for p in prompts]
    features.append(
        PromptFeatures.from_messages(
            [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "What is 2 + 2?"},
                {"role": "assistant", "content": "4"},
                {"role": "user", "content": "Now prove it in Peano arithmetic."},
            ]
        )
    )
    return features


def test_shipped_export_equals_the_pipeline_on_hundreds_of_texts(
    exported: HashedLinearClassifier, pipeline_classifier: SklearnClassifier
) -> None:
    features = _varied_features()
    assert len(features) >= 300
    assert {expert_for(f) for f in features} == set(EXPERTS)
    reference = pipeline_classifier.score_features(features)  # each pipeline's predict_proba
    scores = [exported.score(f) for f in features]
    worst = max(abs(s - r) for s, r in zip(scores, reference, strict=True))
    assert worst <= 1e-9
    assert len({round(s, 6) for s in scores}) > 250  # varied texts, varied scores


def test_shipped_export_is_of_the_shipped_skops_file(
    exported: HashedLinearClassifier, pipeline_classifier: SklearnClassifier
) -> None:
    data = json.loads(SHIPPED_EXPORT.read_text("utf-8"))
    sha = hashlib.sha256(DEFAULT_MODEL_PATH.read_bytes()).hexdigest()
    assert data["source"] == {
        "file": DEFAULT_MODEL_PATH.name,
        "sha256": sha,
        "sklearn_version": data["source"]["sklearn_version"],
    }
    assert exported.metadata == pipeline_classifier.metadata
    assert exported.threshold == pipeline_classifier.threshold
    for share in (0.0, 0.1, 0.37, 0.5, 1.0):
        assert exported.threshold_for_share(share) == pipeline_classifier.threshold_for_share(share)
    for name in EXPERTS:
        assert [p["text"] for p in data["probes"] if p["expert"] == name] == probe_texts()
        assert exported.experts[name].output == pipeline_classifier.experts[name].output


def test_the_start_up_loader_takes_the_shipped_export(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="router.loader"):
        classifier = load_serving_classifier()
    assert isinstance(classifier, HashedLinearClassifier)
    assert "serving export" in caplog.text


@pytest.fixture
def model_copy(tmp_path: Path) -> Path:
    """The shipped skops file and its export, copied where a test may damage them."""
    model = tmp_path / DEFAULT_MODEL_PATH.name
    shutil.copyfile(DEFAULT_MODEL_PATH, model)
    shutil.copyfile(SHIPPED_EXPORT, serving_export_path(model))
    return model


def _edit(model: Path, change: Callable[[dict[str, Any]], None]) -> None:
    path = serving_export_path(model)
    data = json.loads(path.read_text("utf-8"))
    change(data)
    path.write_text(json.dumps(data), "utf-8")


def _words(data: dict[str, Any]) -> dict[str, Any]:
    branch: dict[str, Any] = data["experts"][OPEN]["branches"][0]
    return branch


def _weights(data: dict[str, Any]) -> bytearray:
    return bytearray(base64.b64decode(_words(data)["weights"]["base64"]))


def _set_weights(data: dict[str, Any], raw: bytes, *, update_sha: bool) -> None:
    weights = _words(data)["weights"]
    weights["base64"] = base64.b64encode(raw).decode("ascii")
    if update_sha:
        weights["sha256"] = hashlib.sha256(raw).hexdigest()


def _flip_one_byte(data: dict[str, Any]) -> None:
    raw = _weights(data)
    raw[8 * 12345 + 3] ^= 0x40
    _set_weights(data, bytes(raw), update_sha=False)


def _scale_weights_keeping_sha_consistent(data: dict[str, Any]) -> None:
    weights = array("d")
    weights.frombytes(bytes(_weights(data)))
    _set_weights(data, array("d", (w * 1.001 for w in weights)).tobytes(), update_sha=True)


def _truncate_weights(data: dict[str, Any]) -> None:
    _set_weights(data, bytes(_weights(data)[:-8]), update_sha=True)


def _nudge_a_probe(data: dict[str, Any]) -> None:
    data["probes"][7]["score"] += 2e-9


def _other_intercept(data: dict[str, Any]) -> None:
    data["experts"][OPEN]["intercept"] += 1e-6


def _other_output_map(data: dict[str, Any]) -> None:
    data["experts"][MULTIPLE_CHOICE]["scale"] = 2.5


def _no_multiple_choice_expert(data: dict[str, Any]) -> None:
    del data["experts"][MULTIPLE_CHOICE]


def _no_probes_of_one_expert(data: dict[str, Any]) -> None:
    data["probes"] = [p for p in data["probes"] if p["expert"] != MULTIPLE_CHOICE]


def _other_source(data: dict[str, Any]) -> None:
    data["source"]["sha256"] = "0" * 64


def _other_format_version(data: dict[str, Any]) -> None:
    data["format_version"] = EXPORT_FORMAT_VERSION + 1


def _no_probes(data: dict[str, Any]) -> None:
    data["probes"] = []


def _meta_only_words(data: dict[str, Any]) -> None:
    _words(data)["meta_only"] = True


def _char_analyzer(data: dict[str, Any]) -> None:
    _words(data)["analyzer"] = "char"


TAMPERING = {
    "weights changed, sha not updated": (_flip_one_byte, "sha256"),
    "weights changed, sha updated": (_scale_weights_keeping_sha_consistent, "probe"),
    "weights truncated": (_truncate_weights, "features"),
    "probe score off by 2e-9": (_nudge_a_probe, "probe 7"),
    "intercept changed": (_other_intercept, "probe"),
    "output map changed": (_other_output_map, "score"),
    "an expert missing": (_no_multiple_choice_expert, "no expert multiple_choice"),
    "no probes of one expert": (_no_probes_of_one_expert, "no probe texts for multiple_choice"),
    "made from another skops file": (_other_source, "sha256 differs"),
    "another format version": (_other_format_version, "export format"),
    "no probes": (_no_probes, "no probe"),
    "meta-only with the word pattern": (_meta_only_words, "meta-only"),
    "char analyzer": (_char_analyzer, "analyzer"),
}


@pytest.mark.parametrize("name", list(TAMPERING))
def test_a_damaged_or_stale_export_is_refused_and_skops_is_loaded(
    model_copy: Path, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    change, reason = TAMPERING[name]
    assert isinstance(load_serving_classifier(model_copy), HashedLinearClassifier)
    _edit(model_copy, change)
    with pytest.raises(ServingExportError, match=reason):
        read_serving_export(serving_export_path(model_copy), model_path=model_copy)
    with caplog.at_level(logging.WARNING, logger="router.loader"):
        fallback = load_serving_classifier(model_copy)
    assert isinstance(fallback, SklearnClassifier)
    assert fallback.fast
    assert "serving export refused" in caplog.text


def test_a_retrained_skops_file_makes_the_export_stale(model_copy: Path) -> None:
    with model_copy.open("ab") as handle:  # any change of the skops file's bytes
        handle.write(b"\0")
    with pytest.raises(ServingExportError, match="sha256 differs"):
        read_serving_export(serving_export_path(model_copy), model_path=model_copy)


@pytest.mark.parametrize("content", ["", "{", "[]", '{"format": "tiergate.complexity.serving"}'])
def test_malformed_exports_are_refused(model_copy: Path, content: str) -> None:
    serving_export_path(model_copy).write_text(content, "utf-8")
    with pytest.raises(ServingExportError):
        read_serving_export(serving_export_path(model_copy), model_path=model_copy)
    assert isinstance(load_serving_classifier(model_copy), SklearnClassifier)


def test_without_an_export_the_skops_file_is_loaded(
    model_copy: Path, caplog: pytest.LogCaptureFixture
) -> None:
    serving_export_path(model_copy).unlink()
    with caplog.at_level(logging.WARNING, logger="router.loader"):
        classifier = load_serving_classifier(model_copy)
    assert isinstance(classifier, SklearnClassifier)
    assert "no serving export" in caplog.text


def test_export_of_a_freshly_saved_model_round_trips(
    tmp_path: Path, tiny_classifier: SklearnClassifier
) -> None:
    model = tmp_path / "tiny.skops"
    save_classifier(tiny_classifier, model)
    written = export_model_file(model)
    assert written == serving_export_path(model)
    loaded = load_serving_classifier(model)
    assert isinstance(loaded, HashedLinearClassifier)
    assert loaded.threshold == 0.5
    features = [PromptFeatures.from_text(t) for t in [*EASY, *HARD, *EDGE_CASES.values()]]
    assert {expert_for(f) for f in features} == set(EXPERTS)
    reference = tiny_classifier.score_features(features)
    assert [loaded.score(f) for f in features] == pytest.approx(reference, abs=1e-9)


def test_a_pipeline_the_scorer_cannot_reproduce_is_not_exported(tmp_path: Path) -> None:
    pipeline = Pipeline(
        [("vec", HashingVectorizer(n_features=2**8)), ("model", LogisticRegression())]
    )
    pipeline.fit(["easy one", "hard two", "easy three", "hard four"], [0, 1, 0, 1])
    model = tmp_path / "odd.skops"
    odd = SklearnExpert(pipeline, PROBABILITY)
    save_classifier(SklearnClassifier({OPEN: odd, MULTIPLE_CHOICE: odd}), model)
    with pytest.raises(ServingExportError, match="does not reproduce"):
        export_model_file(model)
    assert not serving_export_path(model).exists()
    assert isinstance(load_serving_classifier(model), SklearnClassifier)


def test_train_export_only_writes_the_export_of_an_existing_model(model_copy: Path) -> None:
    export = serving_export_path(model_copy)
    export.unlink()
    result = CliRunner().invoke(app, ["train", "--export-only", "--out", str(model_copy)])
    assert result.exit_code == 0, result.output
    assert export.is_file()
    assert json.loads(export.read_text("utf-8")) == json.loads(SHIPPED_EXPORT.read_text("utf-8"))


def test_train_export_only_fails_cleanly_without_a_model(tmp_path: Path) -> None:
    missing = tmp_path / "absent.skops"
    result = CliRunner().invoke(app, ["train", "--export-only", "--out", str(missing)])
    assert result.exit_code == 2
    assert "not found" in result.output
    assert not serving_export_path(missing).exists()
