"""`jobcoord serve`: the HTTP API over the same Coordinator the CLI uses, and the client a
remote worker uses in its place. No coordinator rule lives in this package: every decision is
the Coordinator's; this package only authenticates, maps and transports."""

from __future__ import annotations

__all__ = ["create_app"]


def __getattr__(name: str) -> object:
    # FastAPI is imported only when the server is actually built.
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(name)
