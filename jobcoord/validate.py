"""Input checks, done before any write. Each failure is an InvalidInput (exit 2) naming the
field, so bad input never reaches the database and never shows a traceback."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any

from .errors import InvalidInput

# Names the coordinator matches on (kinds, roles, tenants, worker ids): printable, no spaces,
# no NUL (SQLite functions silently stop at a NUL), no wildcards that could mean "many".
_NAME = re.compile(r"[A-Za-z0-9_.:@/+-]+")
_WHOLE = re.compile(r"-?[0-9]+")
# Numbers typed by people are plain decimals: ASCII digits, at most one dot, an optional
# leading minus. Python's int() and float() also take "5_0" (50), " 5", "1e3", "inf", "nan"
# and other scripts' digits ("٣"); none of those is what a user meant by a number of seconds,
# so each is refused. Exponents are refused too: no duration needs one, and "1e9" typed for
# a delay is far more likely a mistake than a wish to wait thirty years.
_DECIMAL = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)")
#: Digits an integer in JSON may have: Python's own limit for converting text to int, which
#: otherwise surfaces as a hint about sys.set_int_max_str_digits().
MAX_INT_DIGITS = 4300
MAX_NAME = 128
MAX_WORKER_ID = 200
MAX_KEY = 200
MAX_JSON_DEPTH = 64
MAX_TEXT = 64 * 1024
TEN_YEARS_S = 10 * 365 * 24 * 3600


def shown(value: Any, limit: int = 200) -> str:
    """A value as a refusal names it: its repr, cut to `limit` characters. Never an error of
    its own: a value nested past Python's recursion limit has no repr (RecursionError, not
    the refusal), and an object's own __repr__ may raise anything."""
    try:
        text = repr(value)
    except Exception:
        return f"a {type(value).__name__} that cannot be shown"
    return text if len(text) <= limit else text[:limit] + "..."


def _bad(field: str, message: str) -> InvalidInput:
    return InvalidInput("invalid_input", f"{field}: {message}", field=field)


def _too_deep(field: str, envelope: int) -> InvalidInput:
    """The refusal of a value nested deeper than MAX_JSON_DEPTH; of a request body whose JSON
    values sit `envelope` levels down in it, nested deeper than that plus its own levels."""
    if not envelope:
        return _bad(field, f"is nested deeper than {MAX_JSON_DEPTH} levels")
    return _bad(field, f"holds a value nested deeper than {MAX_JSON_DEPTH} levels")


def exact_text(value: Any) -> Any:
    """A str made of `value`'s characters: a subclass may answer == and `in` as it likes
    (equal to "dead" while it reads "running") and pass a check it then breaks when stored.
    `str.__str__` copies a subclass into a plain str (a plain str is returned as it is); a
    value that is no str is returned as it is, for the caller's check to refuse."""
    if type(value) is str or not isinstance(value, str):
        return value
    return str.__str__(value)


def mapping_copy(value: Mapping[Any, Any], field: str) -> dict[Any, Any]:
    """A plain dict of a caller's mapping, read once: one whose keys() names keys it does not
    hold (or whose reading raises anything) is refused, not let out as a KeyError."""
    try:
        return dict(value.items())
    except Exception:
        raise _bad(field, "is a mapping that cannot be read (its keys and items "
                   "disagree)") from None


def utf8_text(value: Any, field: str, *, max_len: int = MAX_TEXT, allow_empty: bool = False
              ) -> str:
    if not isinstance(value, str):
        raise _bad(field, "must be text")
    value = exact_text(value)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _bad(field, "is not valid UTF-8 (undecodable bytes or a lone surrogate)") from None
    if "\x00" in value:
        raise _bad(field, "must not contain NUL characters")
    if not value and not allow_empty:
        raise _bad(field, "must not be empty")
    if len(value) > max_len:
        raise _bad(field, f"is {len(value)} characters long; the limit is {max_len}")
    return value


def name(value: Any, field: str, *, max_len: int = MAX_NAME) -> str:
    value = utf8_text(value, field, max_len=max_len)
    if not _NAME.fullmatch(value):
        raise _bad(
            field,
            f"{shown(value)} may use only letters, digits and _ . : @ / + - (no spaces)",
        )
    return value


def optional_name(value: Any, field: str) -> str | None:
    return None if value is None else name(value, field)


def plain_int(value: Any) -> Any:
    """An int subclass as the plain int its value is (its comparisons may lie: "within" any
    bound); anything else as it is, for the caller's check."""
    if type(value) is int or not isinstance(value, int) or isinstance(value, bool):
        return value
    return int.__int__(value)


def priority(value: Any) -> int:
    """0..3, also written P0..P3."""
    value = plain_int(value)
    if isinstance(value, bool):
        raise _bad("priority", "must be 0..3 or P0..P3")
    if isinstance(value, str):
        text = value.strip().upper()
        if text.startswith("P"):
            text = text[1:]
        # Long digit runs are refused unread: int() refuses more than 4300 digits.
        if not text.isdigit() or not text.isascii() or len(text) > 40:
            raise _bad("priority", f"{shown(value)} is not 0..3 or P0..P3")
        value = int(text)
    if isinstance(value, int) and not 0 <= value <= 3:
        # Printed only when short: Python refuses to print an int of more than 4300 digits.
        printed = f"{value} " if value.bit_length() <= 64 else ""
        raise _bad("priority", f"{printed}is not 0..3 or P0..P3")
    if not isinstance(value, int):
        raise _bad("priority", f"{shown(value)} is not 0..3 or P0..P3")
    return value


def integer(value: Any, field: str, lo: int, hi: int) -> int:
    value = plain_int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        # ASCII digits only: str.isdigit() and int() also accept other scripts' digits and
        # superscripts ("٣", "²"), and "--5" passes an lstrip test but breaks int().
        if isinstance(value, str) and _WHOLE.fullmatch(value):
            if len(value) > 40:
                # Far outside any bound here, and int() refuses more than 4300 digits.
                raise _bad(field, f"{value[:20]}... is outside {lo}..{hi}")
            value = int(value)
        else:
            raise _bad(field, f"{shown(value)} is not a whole number")
    if not lo <= value <= hi:
        raise _bad(field, f"{value} is outside {lo}..{hi}")
    return value


def seconds(value: Any, field: str, lo: float, hi: float, *, lo_inclusive: bool = True
            ) -> float:
    if isinstance(value, bool):
        raise _bad(field, "must be a number of seconds")
    if isinstance(value, str):
        if not _DECIMAL.fullmatch(value):
            raise _bad(field, f"{shown(value)} is not a number of seconds (plain decimal digits, "
                       "e.g. 30 or 2.5)")
        value = float(value)
    if not isinstance(value, int | float):
        raise _bad(field, "must be a number of seconds")
    value = float(value)
    if not math.isfinite(value):
        raise _bad(field, "must be a finite number")
    if value < lo or (not lo_inclusive and value == lo) or value > hi:
        # 15 digits read well (30, not 30.0), but may round a value onto the bound it
        # passed (43200.00000000001 shown as 43200): then every digit it has.
        text = f"{value:.15g}"
        raise _bad(field, f"{text if float(text) == value else repr(value)} is outside "
                   f"{_seconds_range(lo, hi, lo_inclusive)}")
    return value


def _seconds_range(lo: float, hi: float, lo_inclusive: bool = True) -> str:
    """The range a number of seconds is checked against, as every refusal names it."""
    return f"{'[' if lo_inclusive else '('}{lo:g}, {hi:g}] seconds"


_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhdwSMHDW]?)")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def duration(value: Any, field: str, lo: float, hi: float) -> float:
    """Seconds, or an age for people: 90, 90s, 15m, 12h, 7d, 2w (one unit, ASCII digits, no
    spaces, no exponent; the units' capitals too, but M, which could mean months)."""
    if isinstance(value, str):
        found = _DURATION.fullmatch(value)
        if found is None:
            raise _bad(field, f"{shown(value)} is not a duration (seconds, or a number followed "
                       "by s, m, h, d or w: 90, 15m, 12h, 7d)")
        if found.group(2) == "M":
            # Months to some, minutes to others: read either way, someone's prune or
            # schedule does what they did not mean.
            raise _bad(field, f"{shown(value)}: M could mean months or minutes; write "
                       f"{found.group(1)}m for minutes (months are no unit: use days or "
                       "weeks, or a cron for a monthly slot)")
        value = float(found.group(1)) * _UNIT_S[found.group(2).lower()]
    return seconds(value, field, lo, hi)


def _no_constants(token: str) -> Any:
    raise ValueError(f"{token} is not valid JSON")


class _TooManyDigits(ValueError):
    pass


def _bounded_int(token: str) -> int:
    digits = len(token.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise _TooManyDigits(f"holds a number with {digits} digits; at most {MAX_INT_DIGITS} "
                             "are accepted")
    return int(token)


def _huge_int(value: Any) -> bool:
    """Whether a value (already parsed, e.g. from the Python API) holds an integer too long
    to write as text."""
    stack = [value]
    # A container that holds itself (which the encoder refuses as a circular reference)
    # must not be walked forever: each container is looked into once.
    seen: set[int] = set()
    while stack:
        item = stack.pop()
        if isinstance(item, int) and not isinstance(item, bool):
            if abs(item) >= 10**MAX_INT_DIGITS:  # only on the error path: exact, not fast
                return True
        elif isinstance(item, dict | list | tuple):
            if id(item) in seen:
                continue
            seen.add(id(item))
            stack.extend(item.values() if isinstance(item, dict) else item)
    return False


def _finite_float(token: str) -> float:
    number = float(token)
    if not math.isfinite(number):
        raise ValueError(f"number {token} is out of range")
    return number


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, val in pairs:
        if key in obj:
            raise ValueError(f"duplicate key {shown(key)}")
        obj[key] = val
    return obj


def _depth(value: Any, limit: int) -> int:
    """How deep a value's objects and arrays nest, counted up to `limit` + 1: one level for
    each, none for a number, string, boolean or null in them (`{"a": 1}` is one level), as
    the opening brackets of its text count them."""
    containers = (dict, list, tuple)
    if not isinstance(value, containers):
        return 0
    stack = [(value, 1)]
    deepest = 0
    while stack:
        item, d = stack.pop()
        deepest = max(deepest, d)
        if d > limit:
            return d
        children = item.values() if isinstance(item, dict) else item
        stack.extend((c, d + 1) for c in children if isinstance(c, containers))
    return deepest


#: Built once: json.dumps with any option builds a new encoder on every call, which costs
#: a batch of small payloads as much as encoding them.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, sort_keys=True,
                            allow_nan=False)
_ENCODE_ARGS = (_ENCODER.default, encode_basestring, None, ":", ",", True, False, False)


def encoder() -> Callable[[Any], str]:
    """`dumps` for a run of values (a batch's payloads): the C encoder built once, where
    `dumps` builds one per value. Its record of the containers being written (the circular
    reference check) is left behind by a value that fails, so after any error the encoder
    must be dropped: a batch stops at its first invalid job anyway."""
    if c_make_encoder is None:
        return _ENCODER.encode
    encode = c_make_encoder({}, *_ENCODE_ARGS)
    join = "".join

    def _encode(value: Any) -> str:
        return join(encode(value, 0))

    return _encode


def dumps(value: Any) -> str:
    """The one serialisation jobcoord stores: compact, sorted keys (so equal JSON compares
    equal), no NaN. The same text as `_ENCODER.encode`, without its per-call Python (a
    closure and a chunk list built for every value)."""
    if c_make_encoder is None:
        return _ENCODER.encode(value)
    return "".join(c_make_encoder({}, *_ENCODE_ARGS)(value, 0))


#: The JSON columns of a job that `check` reads, and whose text every read decodes.
JOB_JSON_COLUMNS = ("payload_json", "needs_json", "result_json", "provenance_json")
#: A job's stored JSON kept in other tables, named as `stored_json` and `check` name them.
CHECKPOINT_DATA = "checkpoints.data_json"
EVENT_DETAIL = "job_events.detail"


_NOT_JSON = object()


def _stored_resources_ok(value: Any) -> bool:
    """Whether stored needs are what enqueue writes (`resources`: names to whole amounts)."""
    from .errors import InvalidInput as _Invalid

    if not isinstance(value, dict):
        return False
    try:
        resources(value, "needs")
    except _Invalid:
        return False
    return True


def loads(text: str | bytes) -> Any:
    """json.loads of text jobcoord did not just check: nesting deeper than Python's parser
    reaches is a ValueError, as any other text that is not JSON (RecursionError otherwise:
    an internal error over a row damaged outside jobcoord, or a `[[[...` typed in)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested deeper than can be read") from None


def stored_json(text: str | None, job_id: int, column: str) -> Any:
    """A job's stored JSON column as a value (None kept). Text that is not JSON was written
    outside jobcoord (by hand, a broken restore): DatabaseCorrupt naming the job and the
    column, not an internal error."""
    if text is None:
        return None
    try:
        value = loads(text)
    except ValueError:
        value = _NOT_JSON
    misshapen = (value is not _NOT_JSON and column == "needs_json"
                 and not _stored_resources_ok(value))  # a claim's fit would fail on it
    if (value is _NOT_JSON or misshapen
            or (column == "payload_json" and type(value) is not dict)):
        # A payload is always stored as an object (enqueue refuses anything else): `5` or
        # `null` there was written outside jobcoord too, and would fail a limit's key lookup
        # or a handler as surely as text that does not parse.
        from .errors import DatabaseCorrupt

        what = ("not valid JSON" if value is _NOT_JSON else
                "not names with whole amounts" if misshapen else "not a JSON object")
        raise DatabaseCorrupt(
            "job_unreadable", f"job {job_id}: its stored {column} is {what} (written "
            "outside jobcoord); `jobcoord check` lists every such job", job_id=job_id,
            column=column)
    return value


def json_value(raw: Any, field: str, *, max_bytes: int, require_object: bool,
               too_large_code: str = "payload_too_large", str_is_text: bool = True,
               envelope: int = 0) -> tuple[Any, str]:
    """Parse (or accept) a JSON value strictly; return it and its stored text.

    Bytes are always JSON text. A `str` is JSON text too, unless `str_is_text` is False: then
    it is the value itself (a result may be a plain string; the CLI hands over bytes).

    Refused: invalid JSON, NaN/Infinity, numbers out of float range, duplicate keys, nesting
    deeper than 64, lone surrogates, and anything over max_bytes (with a hint to keep large
    data as an artifact). `envelope`: the text is a request body whose JSON values sit that
    many levels down in it; the body may nest 64 levels more, and no further."""
    is_text = isinstance(raw, bytes) or (isinstance(raw, str) and str_is_text)
    if isinstance(raw, bytes):
        if len(raw) > max_bytes:
            raise too_large(field, len(raw), max_bytes, too_large_code)
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise _bad(field, f"is not valid UTF-8 (byte {e.start})") from None
    if is_text:
        raw = exact_text(raw)  # (a subclass's own len() is not its length)
        if len(raw) > max_bytes:  # more characters than bytes allowed: too large, whatever
            # they are (a lone surrogate counted as the 3 bytes it would take)
            raise too_large(field, len(raw.encode("utf-8", "surrogatepass")), max_bytes,
                            too_large_code)
        utf8_text(raw, field, max_len=max_bytes, allow_empty=True)
        if len(raw.encode("utf-8")) > max_bytes:
            raise too_large(field, len(raw.encode("utf-8")), max_bytes, too_large_code)
        try:
            value = json.loads(raw, parse_constant=_no_constants, parse_float=_finite_float,
                               parse_int=_bounded_int, object_pairs_hook=_no_duplicates)
        except _TooManyDigits as e:
            raise _bad(field, str(e)) from None
        except json.JSONDecodeError as e:
            raise _bad(field, f"is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})"
                       ) from None
        except ValueError as e:
            raise _bad(field, f"is not valid JSON ({e})") from None
        except RecursionError:
            raise _too_deep(field, envelope) from None
    else:
        value = raw
    if require_object and not isinstance(value, dict):
        raise _bad(field, "must be a JSON object ({...})")
    return value, stored_text(value, field, max_bytes=max_bytes, too_large_code=too_large_code,
                              envelope=envelope)


def stored_text(value: Any, field: str, *, max_bytes: int,
                too_large_code: str = "payload_too_large",
                encode: Callable[[Any], str] = dumps, envelope: int = 0) -> str:
    """A parsed (or given) JSON value's stored text, refused as `json_value` refuses it: a
    value that cannot be written as JSON, nesting deeper than 64, a lone surrogate, more
    than max_bytes. `encode` is `dumps` or a batch's `encoder()`; `envelope` as for
    `json_value`."""
    try:
        text = encode(value)
        # An ASCII text's length is its size in bytes (isascii() reads a flag, no scan).
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise _bad(field, "contains a lone surrogate (\\ud800-\\udfff)") from None
    except (TypeError, ValueError) as e:
        if _huge_int(value):
            raise _bad(field, f"holds a number with more than {MAX_INT_DIGITS} digits") from None
        raise _bad(field, f"cannot be stored as JSON ({e})") from None
    except RecursionError:
        raise _too_deep(field, envelope) from None
    # Every level of nesting writes one opening bracket, so a text with no more brackets than
    # the limit cannot be too deep: only such texts need the walk (most payloads are flat).
    limit = MAX_JSON_DEPTH + envelope
    if text.count("{") + text.count("[") > limit and _depth(value, limit) > limit:
        raise _too_deep(field, envelope)
    if size > max_bytes:
        raise too_large(field, size, max_bytes, too_large_code)
    return text


def too_large(field: str, size: int | None, limit: int, code: str) -> InvalidInput:
    """The refusal of an oversized value. `size` None: only the first limit + 1 bytes were
    read (a pipe, stdin), so all that is known is that it is larger than the limit."""
    what = f"is {size} bytes" if size is not None else f"is more than {limit} bytes"
    details: dict[str, Any] = {"field": field, "limit": limit}
    if size is not None:
        details["size"] = size
    return InvalidInput(
        code,
        f"{field} {what}; the limit is {limit}. Keep large inputs and results as "
        "files and pass a reference (artifact storage: `jobcoord migrate --with artifacts`)",
        **details,
    )


#: At most this many roles or kinds per call: a claim probes the index once per (role, kind)
#: pair, and SQLite allows at most 500 terms in one compound SELECT ((20 + 1) * 20 = 420).
MAX_NAMES = 20


def names(value: Any, field: str, *, empty: str | None = None) -> list[str]:
    """A list of names (roles, kinds, statuses), sorted and without repeats. A bare string is
    ONE name, never its characters, in every method. `empty` is the message refusing an empty
    list; without it an empty list is accepted."""
    if isinstance(value, str):
        value = [value]
    elif not isinstance(value, list | tuple | set | frozenset):
        raise _bad(field, "give a name or a list of names")
    if len(value) > MAX_NAMES:
        raise _bad(field, f"{len(value)} names; the limit is {MAX_NAMES}")
    out = sorted({name(item, field) for item in value})
    if not out and empty is not None:
        raise _bad(field, empty)
    return out


def flag(value: Any, field: str) -> bool:
    """A yes/no argument: True or False only (not 0, 1, "yes" or None)."""
    if not isinstance(value, bool):
        raise _bad(field, "must be true or false")
    return value


def _shown(value: int) -> str:
    """An int as a message shows it: in full up to 40 digits, else by its size."""
    if value.bit_length() <= 128:
        return str(value)
    return f"a {len(format(abs(value), 'x'))}-hex-digit number"


def whole(value: Any, field: str, lo: int, hi: int) -> int:
    """`integer`, safe for any int: one out of range is refused without being formatted in
    full (Python refuses to print an int of more than 4300 digits)."""
    value = plain_int(value)
    if isinstance(value, int) and not isinstance(value, bool) and not lo <= value <= hi:
        raise _bad(field, f"{_shown(value)} is outside {lo}..{hi}")
    return integer(value, field, lo, hi)


def finite_seconds(value: Any, field: str, lo: float, hi: float, *,
                   lo_inclusive: bool = True) -> float:
    """`seconds`, safe for any int: one too large for a float is refused as out of range
    instead of overflowing when converted."""
    value = plain_int(value)
    if isinstance(value, int) and not isinstance(value, bool) and not lo <= value <= hi:
        raise _bad(field, f"{_shown(value)} is outside "
                   f"{_seconds_range(lo, hi, lo_inclusive)}")
    return seconds(value, field, lo, hi, lo_inclusive=lo_inclusive)


def safe_duration(value: Any, field: str, lo: float, hi: float) -> float:
    """`duration`, with `finite_seconds`' check of ints first."""
    value = plain_int(value)
    if isinstance(value, int) and not isinstance(value, bool) and not lo <= value <= hi:
        raise _bad(field, f"{_shown(value)} is outside {_seconds_range(lo, hi)}")
    return duration(value, field, lo, hi)


#: A resource or payload-field name: a letter, then letters, digits or underscores.
_RESOURCE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
#: A resource amount's bound (integer units: MB, cores, slots): far above any machine, far
#: below the 64-bit integers both databases and JSON readers keep exactly.
MAX_RESOURCE = 2**40
MAX_RESOURCES = 16


def resources(value: Any, field: str, *, lo: int = 1) -> dict[str, int]:
    """Named integer amounts: `NAME=INT[,NAME=INT]` as text, or a mapping of names to ints.
    Names are unique; amounts are whole numbers in lo..MAX_RESOURCE."""
    pairs: list[tuple[Any, Any]]
    if isinstance(value, str):
        if not value.strip():
            raise _bad(field, "give NAME=INT[,NAME=INT], e.g. gpu_mem_mb=12000,ram_mb=8000")
        pairs = []
        for item in value.split(","):
            name_, sep, amount = item.strip().partition("=")
            if not sep:
                raise _bad(field, f"{item.strip()!r} is not NAME=INT (e.g. gpu_mem_mb=12000)")
            pairs.append((name_.strip(), amount.strip()))
    elif isinstance(value, Mapping):
        pairs = list(mapping_copy(value, field).items())
        if not pairs:
            raise _bad(field, "give at least one NAME=INT")
    else:
        raise _bad(field, "must be NAME=INT[,NAME=INT] text or a mapping of names to "
                   "whole numbers")
    if len(pairs) > MAX_RESOURCES:
        raise _bad(field, f"at most {MAX_RESOURCES} resources")
    out: dict[str, int] = {}
    for key, amount in pairs:
        if not isinstance(key, str) or not _RESOURCE.fullmatch(key):
            raise _bad(field, f"{shown(key)} is not a resource name (a letter, then letters, "
                       "digits or _; at most 64)")
        if key in out:
            raise _bad(field, f"{key} is given twice")
        if not isinstance(value, str) and (isinstance(amount, bool)
                                           or not isinstance(amount, int)):
            raise _bad(field, f"{key}: {shown(amount)} is not a whole number")
        if isinstance(amount, str) and len(amount) > 20:
            raise _bad(field, f"{key}: {amount[:20]}... is outside {lo}..{MAX_RESOURCE}")
        out[key] = whole(amount, f"{field} {key}", lo, MAX_RESOURCE)
    return dict(sorted(out.items()))


#: The resource matched against one GPU's free memory (a job does not span GPUs).
GPU_MEMORY = "gpu_mem_mb"
#: The resource matched against the worker's `memory_available_mb` reading.
RAM = "ram_mb"
#: The resources a claim matches against readings of their own (core.limits), never against
#: a heartbeat's named capacity, and where each one's amount comes from.
MATCHED_ELSEWHERE = {
    RAM: "the readings' memory_available_mb (the worker's free RAM)",
    GPU_MEMORY: "each GPU's memory_free_mb in the readings' gpus (a job's gpu_mem_mb fits "
                "on one GPU)",
}


def capacity(value: Any, field: str) -> dict[str, int]:
    """A heartbeat's named capacity: `resources` from 0, none of them a name a claim matches
    against another reading (such an entry would either override that reading or be
    ignored beside it, and the worker could not tell which)."""
    named = resources(value, field, lo=0)
    for name in named:
        source = MATCHED_ELSEWHERE.get(name)
        if source is not None:
            raise _bad(field, f"{name} is not a capacity name: a claim matches {name} "
                       f"against {source}; report it there")
    return named


def payload_field(value: Any, field: str) -> str:
    """The name of a top-level payload field (a limit's key)."""
    text = utf8_text(value, field, max_len=MAX_NAME)
    if not _FIELD.fullmatch(text):
        raise _bad(field, f"{text!r} is not a payload field name (a letter or _, then "
                   "letters, digits or _; one top-level field, no dots)")
    return text


#: The keys of one GPU's reading (the heartbeat contract, README "Limits and resources")
#: and each one's range.
GPU_READING_RANGES: dict[str, tuple[float, float]] = {
    "memory_free_mb": (0, MAX_RESOURCE), "memory_total_mb": (0, MAX_RESOURCE),
    "utilization_pct": (0, 100), "temperature_c": (-50, 150)}
MAX_GPUS = 64


def gpu_readings(value: Any, field: str = "readings: gpus") -> list[dict[str, float | None]]:
    """A heartbeat's `gpus`: a list of objects with exactly the contract's keys, each a
    number in range or null (unknown); a GPU's free memory at most its total."""
    if not isinstance(value, list):
        raise _bad(field, "must be a list of GPU readings")
    if len(value) > MAX_GPUS:
        raise _bad(field, f"at most {MAX_GPUS} GPUs")
    out = []
    for i, gpu in enumerate(value):
        if not isinstance(gpu, dict):
            raise _bad(field, f"GPU {i} must be an object with "
                       f"{', '.join(GPU_READING_RANGES)}")
        # Named as text: a key may be any hashable (an int, None), which join and sort
        # refused with a bare TypeError.
        unknown = sorted(k if type(k) is str else shown(k)
                         for k in set(gpu) - set(GPU_READING_RANGES))
        if unknown:
            raise _bad(field, f"GPU {i}: unknown key(s) {', '.join(unknown)}; known: "
                       f"{', '.join(GPU_READING_RANGES)}")
        one: dict[str, float | None] = {}
        for key, (lo, hi) in GPU_READING_RANGES.items():
            val = gpu.get(key)
            if val is None or val == "unknown":
                one[key] = None
                continue
            if isinstance(val, bool) or not isinstance(val, int | float) \
                    or not lo <= val <= hi:
                raise _bad(field, f"GPU {i}: {key} must be a number in {lo:g}..{hi:g}, null "
                           "or \"unknown\"")
            one[key] = float(val)
        free, total = one["memory_free_mb"], one["memory_total_mb"]
        if free is not None and total is not None and free > total:
            raise _bad(field, f"GPU {i}: memory_free_mb ({free:g}) is more than "
                       f"memory_total_mb ({total:g})")
        out.append(one)
    return out
