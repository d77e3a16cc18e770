"""The ``tiergate`` command."""

from gateway.cli.main import app, main

__all__ = ["app", "main"]
