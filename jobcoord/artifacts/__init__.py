"""Artifact storage: large results kept outside the database.

`objects` is the content-addressed object store on disk (no database). The database side
(artifact rows, states, fenced linking) is built on top of it.
"""

from __future__ import annotations

from jobcoord.artifacts.objects import (
    CHUNK_SIZE,
    ObjectReader,
    ObjectStore,
    StoredObject,
    format_digest,
    parse_digest,
    validate_name,
)

__all__ = [
    "CHUNK_SIZE",
    "ObjectReader",
    "ObjectStore",
    "StoredObject",
    "format_digest",
    "parse_digest",
    "validate_name",
]
