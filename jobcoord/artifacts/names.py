"""Artifact names and digests: what a valid name is, and the `sha256:<hex>` spelling of a
content address."""

from __future__ import annotations

import re
import unicodedata

from jobcoord.errors import InvalidInput

ALGORITHM = "sha256"
MAX_NAME_BYTES = 255

#: The 64 lowercase hex digits of a SHA-256.
HEX_DIGITS = re.compile(r"[0-9a-f]{64}")


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
