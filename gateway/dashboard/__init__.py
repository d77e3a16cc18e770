"""The finance dashboard at ``/dashboard`` (server-rendered page, vanilla JS + SVG charts)."""

from gateway.dashboard.routes import router

__all__ = ["router"]
