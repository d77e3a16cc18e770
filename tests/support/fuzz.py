"""How long the slow generated-input tests run."""

from __future__ import annotations

import os

__all__ = ["fuzz_examples"]


def fuzz_examples(full: int) -> int:
    """How many generated examples a slow fuzz or property test runs: ``full`` times
    ``TIERGATE_FUZZ_SCALE`` (default 1; lower it for a shorter pass), at least 1."""
    return max(1, round(full * float(os.environ.get("TIERGATE_FUZZ_SCALE", "1"))))
