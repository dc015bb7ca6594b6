"""Artifact storage: large results kept outside the database.

`objects` is the content-addressed object store on disk (no database), with `names` (names
and digests) and `files` (its file-system steps, sources and reader). The database side is
built on top of it: `settings` (per-kind rules, where the store is), `rules` (artifact rows:
staging, fenced linking, reading), `retention` (gc, removing the feature) and `backup`.
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
