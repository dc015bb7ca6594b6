"""Artifact names, media types and digests: what a valid name is, the media type an artifact
is stored with, and the `sha256:<hex>` spelling of a content address."""

from __future__ import annotations

import mimetypes
import re
import unicodedata
from typing import Any

from jobcoord.errors import InvalidInput

ALGORITHM = "sha256"
MAX_NAME_BYTES = 255

#: The 64 lowercase hex digits of a SHA-256.
HEX_DIGITS = re.compile(r"[0-9a-f]{64}")

DEFAULT_MEDIA_TYPE = "application/octet-stream"
#: A media type as an artifact row and a kind's rule spell it: type/subtype.
MEDIA_TYPE = re.compile(
    r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,99}/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,99}")


def media_type_of(media_type: Any, name: str) -> str:
    """The media type an artifact named `name` is stored with: the one declared, else the one
    guessed from the name, else application/octet-stream. Every way of staging (the CLI, a
    local worker, a remote worker's upload) decides it here."""
    if media_type is None:
        return mimetypes.guess_type(name, strict=False)[0] or DEFAULT_MEDIA_TYPE
    if not isinstance(media_type, str) or not MEDIA_TYPE.fullmatch(media_type):
        raise InvalidInput("invalid_media_type", f"not a media type: {ascii(media_type)[:80]} "
                           "(expected type/subtype, e.g. application/pdf)")
    # Case-insensitive (RFC 9110): one spelling, so a kind's list compares as it should.
    return media_type.lower()


def parse_digest(digest: object) -> str:
    """The 64 lowercase hex digits of a `sha256:<hex>` digest; InvalidInput otherwise."""
    if isinstance(digest, str):
        algorithm, sep, hexdigest = digest.partition(":")
        if sep and algorithm == ALGORITHM and HEX_DIGITS.fullmatch(hexdigest):
            return hexdigest
    raise InvalidInput("invalid_digest",
                       f"not a digest: {ascii(digest)[:100]} (expected sha256:<64 lowercase hex>)",
                       digest=ascii(digest)[:100])


def format_digest(hexdigest: str) -> str:
    return f"{ALGORITHM}:{hexdigest}"


def validate_name(name: object) -> str:
    """An artifact name, unchanged, or InvalidInput `invalid_artifact_name`.

    A name is one path component on every platform the artifact may be written to: not empty,
    not "." or "..", no "/" or "\\", no NUL or other control character, valid UTF-8 (no lone
    surrogates) of at most 255 bytes (the usual file-name limit)."""

    def refuse(why: str) -> InvalidInput:
        shown = ascii(name)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        return InvalidInput("invalid_artifact_name", f"invalid artifact name {shown}: {why}",
                            name=shown)

    if not isinstance(name, str):
        raise refuse("a name is a string")
    if name == "":
        raise refuse("it is empty")
    if name in (".", ".."):
        raise refuse("'.' and '..' name directories")
    if "/" in name or "\\" in name:
        raise refuse("it contains a path separator ('/' or '\\')")
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:
        raise refuse("it contains a lone surrogate (not valid UTF-8)") from None
    for ch in name:
        if unicodedata.category(ch) == "Cc":  # C0 and C1 controls, NUL and DEL included
            raise refuse(f"it contains the control character U+{ord(ch):04X}")
    if len(encoded) > MAX_NAME_BYTES:
        raise refuse(f"it is {len(encoded)} bytes in UTF-8, over {MAX_NAME_BYTES}")
    return name
