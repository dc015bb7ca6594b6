"""jobcoord: a durable job coordinator for AI work on the machines people own."""

from __future__ import annotations

# No import at run time: the command's entry point (jobcoord/start.py) is loaded through this
# package, and a Ctrl-C is held back only once it runs (typing alone took 7 ms).
TYPE_CHECKING = False
__version__ = "0.1.0"

__all__ = ["Coordinator", "__version__"]

if TYPE_CHECKING:
    from typing import Any

    from .coordinator import Coordinator


def __getattr__(name: str) -> Any:
    # Lazy, so `import jobcoord` (and the CLI's startup) does not pay for SQLAlchemy.
    if name == "Coordinator":
        from .coordinator import Coordinator

        return Coordinator
    raise AttributeError(name)
