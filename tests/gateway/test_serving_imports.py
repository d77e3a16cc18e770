"""A serving process imports neither scikit-learn, SciPy, skops, numpy nor Alembic.

Each case runs in a fresh interpreter: import the serving path (server, services, app, router),
build the classifier through the start-up loader and connect the ledger to a database already
at the head revision, then report which of those libraries are in ``sys.modules``. The
controls show the check sees them when they are loaded: without a serving export the loader
falls back to scikit-learn, and a fresh database is migrated with Alembic.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from gateway.accounting import SqlLedger
from router.model_file import DEFAULT_MODEL_PATH
from router.serving_export import serving_export_path

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("sklearn", "scipy", "skops", "numpy", "alembic")
SCRIPT = """
import asyncio, json, sys
from pathlib import Path

import gateway.app, gateway.server, gateway.services, router
from gateway.accounting import SqlLedger
from router.features import PromptFeatures
from router.loader import load_serving_classifier

classifier = load_serving_classifier(Path(sys.argv[1]))
score = classifier.score(PromptFeatures.from_text("Prove that 17 is prime."))

async def connect(url):
    ledger = await SqlLedger.connect(url)
    await ledger.aclose()

asyncio.run(connect(sys.argv[2]))
print(json.dumps({
    "classifier": type(classifier).__name__,
    "score": score,
    "loaded": sorted(m for m in sys.argv[3].split(",") if m in sys.modules),
}))
"""


def _run(model: Path, database: Path) -> dict[str, object]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            SCRIPT,
            str(model),
            f"sqlite+aiosqlite:///{database}",
            ",".join(HEAVY),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _database_at_head(path: Path) -> Path:
    async def migrate() -> None:
        ledger = await SqlLedger.connect(f"sqlite+aiosqlite:///{path}")
        await ledger.aclose()

    asyncio.run(migrate())
    return path


def test_serving_imports_none_of_the_heavy_libraries(tmp_path: Path) -> None:
    result = _run(DEFAULT_MODEL_PATH, _database_at_head(tmp_path / "ledger.db"))
    assert result["classifier"] == "HashedLinearClassifier"
    assert result["loaded"] == []


def test_controls_the_fallbacks_do_import_them(tmp_path: Path) -> None:
    model = tmp_path / "no-export" / DEFAULT_MODEL_PATH.name
    model.parent.mkdir()
    shutil.copyfile(DEFAULT_MODEL_PATH, model)
    assert not serving_export_path(model).exists()
    result = _run(model, tmp_path / "fresh.db")
    assert result["classifier"] == "SklearnClassifier"
    assert set(HEAVY) <= set(result["loaded"])  # type: ignore[arg-type]
