"""Text that data cannot forge: every character that could start a line, move the cursor or
reorder the display is written as a visible escape. Used by every text rendering (the CLI's
output, the worker's log); JSON output carries the data unchanged."""

from __future__ import annotations

import re
from typing import Any

#: Characters that data must not bring to a terminal: C0 controls (line breaks, escape
#: sequences), DEL, C1 controls (U+0085 is a line break, U+009B a CSI), the Unicode line and
#: paragraph separators, and the bidi marks, embeddings, overrides and isolates that reorder
#: what is shown.
_REORDERING_CHARS = "\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_UNSAFE = re.compile(f"[\x00-\x1f\x7f-\x9f{_REORDERING_CHARS}]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(found: re.Match[str]) -> str:
    ch = found.group()
    if ch in _NAMED:
        return _NAMED[ch]
    return f"\\x{ord(ch):02x}" if ord(ch) <= 0xFF else f"\\u{ord(ch):04x}"


def safe_text(value: Any) -> str:
    """`value` as text that cannot start a line, move the cursor or reorder the display:
    every unsafe character is written as a visible escape (\\n, \\x1b, \\u2028). Applied to
    every piece of data in text output; JSON output carries the data unchanged."""
    return _UNSAFE.sub(_escape, str(value))


#: What reorders a line's display (bidi marks, embeddings, overrides, isolates) and the
#: Unicode line and paragraph separators: written as escapes in HTML too, where line breaks
#: and tabs of shown JSON are the page's own layout.
_REORDERING = re.compile(f"[{_REORDERING_CHARS}]")


def visible_reordering(value: str) -> str:
    """`value` with every character that would reorder its display written as an escape."""
    return _REORDERING.sub(_escape, value)


def is_header_text(value: str) -> bool:
    """Whether an HTTP header can carry `value` as it is: printable ASCII. (Other bytes are
    read back as Latin-1 by the server's framework: `ключ` would arrive as another key.)"""
    return value.isascii() and value.isprintable()
