"""The web dashboard (server-rendered Jinja2 + vendored htmx, under /ui) and `/metrics`,
mounted on the `jobcoord serve` application.

- session.py: log in with a `viewer` or `operator` token in a form (POST body, never a URL);
  sessions in memory behind an HttpOnly, SameSite=Strict cookie; the token checked again on
  every request, so a revoked token ends its sessions.
- routes.py: the pages and actions. Every action form carries the session's CSRF token; an
  action is refused (403) unless the token matches and the session's role is operator,
  whatever the page showed.
- reads.py: what the pages read, one read transaction per page part, cheap at any size.
- views.py: templates and how things are shown.
- Live parts (overview, job page) poll with htmx every few seconds and swap one fragment.
"""

from __future__ import annotations

import os
from typing import Any

from .routes import Dashboard
from .views import HERE

__all__ = ["Dashboard", "mount"]


def mount(app: Any) -> None:
    """Add /metrics and the dashboard (/ui, /ui/static) to the API application."""
    from fastapi.staticfiles import StaticFiles

    from ..metrics_route import router as metrics_router

    app.include_router(metrics_router())
    app.include_router(Dashboard().router(), include_in_schema=False)
    app.mount("/ui/static", StaticFiles(directory=os.path.join(HERE, "static")),
              name="ui-static")
