"""jobcoord: a durable job coordinator for AI work on the machines people own."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["Coordinator", "__version__"]

if TYPE_CHECKING:
    from .coordinator import Coordinator


def __getattr__(name: str) -> Any:
    # Lazy, so `import jobcoord` (and the CLI's startup) does not pay for SQLAlchemy.
    if name == "Coordinator":
        from .coordinator import Coordinator

        return Coordinator
    raise AttributeError(name)
