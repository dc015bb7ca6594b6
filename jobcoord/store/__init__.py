"""Where the coordinator's state lives: the seam (`base`), one store per database (`sqlite`,
`postgresql`, each with its helper modules) and the statements they run (`statements`)."""

from .base import (
    CORE_REVISIONS,
    OPTIONAL_REVISIONS,
    SYNCHRONOUS_LEVELS,
    Database,
    Stats,
    Taken,
    Target,
    classify,
    resolve_target,
)

__all__ = ["CORE_REVISIONS", "OPTIONAL_REVISIONS", "SYNCHRONOUS_LEVELS", "Database", "Stats",
           "Taken", "Target", "classify", "resolve_target"]
