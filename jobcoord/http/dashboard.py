"""The web dashboard (server-rendered Jinja2 + vendored htmx) and `/metrics`, mounted on the
`jobcoord serve` application."""

from __future__ import annotations

from typing import Any


def mount(app: Any) -> None:
    """Add /metrics and the dashboard (/ui) to the API application."""
    from .metrics_route import router as metrics_router

    app.include_router(metrics_router())
