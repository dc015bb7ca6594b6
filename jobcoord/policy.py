"""The gate policy: which machine readings allow which claims, plus the coordinator's limits.

Defaults come from the seeds. Override any of them with a TOML file passed as `--policy PATH`
(or JOBCOORD_POLICY); unknown keys are refused so a typo never silently keeps a default.

Unknown readings (a platform that cannot report a value) never block: no memory or
temperature reading means no evidence of pressure, no battery means AC power, and no
interactive user session means the user is idle. Set `unknown_blocks_background = true` to
make missing power or idle readings keep background priorities (P2, P3) off the machine.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, fields
from typing import Any

from .errors import InvalidInput

#: Largest policy file read (a policy is a few hundred bytes; this bounds what a wrong path
#: can make a command read).
MAX_POLICY_BYTES = 1 << 20


@dataclass(frozen=True)
class Policy:
    #: No new claim above this memory use (a reading of 90 is refused at 85).
    max_memory_pct: float = 85.0
    #: No new claim above this temperature.
    max_temperature_c: float = 90.0
    #: Priorities from this one on (P2, P3) are background work.
    background_from_priority: int = 2
    #: Background work needs AC power...
    background_requires_ac: bool = True
    #: ...and a user idle for at least this long.
    background_min_idle_s: float = 300.0
    unknown_blocks_background: bool = False
    #: A heartbeat older than this means no claim.
    heartbeat_max_age_s: float = 60.0
    default_lease_s: float = 45.0
    max_lease_s: float = 12 * 3600.0
    max_payload_bytes: int = 256 * 1024
    max_result_bytes: int = 1024 * 1024
    #: Retry backoff after the n-th failed attempt: min(retry_max_s, retry_base_s * 2**(n-1)).
    retry_base_s: float = 10.0
    retry_max_s: float = 600.0
    default_max_attempts: int = 3
    #: Priority of a job enqueued without one: P1, so work a user enqueues by hand is not held
    #: back by the background gates unless they ask for a background priority.
    default_priority: int = 1
    #: Shutdown releases (`fail --reason worker_shutdown`) that give a job back without using
    #: up an attempt; each release past this many counts as a normal attempt, so a job that
    #: outlives every deploy still ends.
    max_releases: int = 10

    def __post_init__(self) -> None:
        # Checked here too, not only when a file is loaded: a Policy built in Python reaches
        # the same time arithmetic, where an unbounded value overflows.
        _check_bounds({f.name: getattr(self, f.name) for f in fields(self)}, "policy")

    @classmethod
    def from_toml(cls, path: str) -> Policy:
        from .small_files import read_small

        try:
            raw, regular = read_small(path, MAX_POLICY_BYTES)
            if len(raw) > MAX_POLICY_BYTES:
                raise InvalidInput("invalid_policy", f"policy {path} is larger than "
                                   f"{MAX_POLICY_BYTES} bytes")
            if not raw and not regular:
                # A pipe nobody writes to: not an empty policy the user meant.
                raise InvalidInput("invalid_policy", f"policy {path} is not a regular file "
                                   "and gave nothing to read")
            data = tomllib.loads(raw.decode("utf-8"))
        except OSError as e:
            raise InvalidInput("invalid_policy", f"cannot read policy {path}: {e.strerror}"
                               ) from None
        except tomllib.TOMLDecodeError as e:
            raise InvalidInput("invalid_policy", f"policy {path} is not valid TOML: {e}"
                               ) from None
        except UnicodeDecodeError as e:  # TOML is UTF-8; tomllib decodes before parsing
            raise InvalidInput("invalid_policy", f"policy {path} is not UTF-8 text (byte "
                               f"{e.start}: {e.object[e.start:e.start + 1]!r})") from None
        except ValueError as e:
            # Valid TOML by its grammar that Python will not convert, e.g. an integer of more
            # than 4,300 digits.
            raise InvalidInput("invalid_policy", f"policy {path} holds a value that cannot "
                               f"be read: {e}") from None
        except RecursionError:
            # Valid TOML by its grammar, nested deeper than its reader recurses.
            raise _too_deep(path) from None
        try:
            return cls._from_data(data, path)
        except RecursionError:  # a value nested hundreds deep, walked by a check
            raise _too_deep(path) from None

    @classmethod
    def _from_data(cls, data: dict[str, Any], path: str) -> Policy:
        from .artifacts.settings import settings_from_mapping  # [artifacts]: per-kind rules
        artifacts = settings_from_mapping(data.pop("artifacts", None), path)
        if "policy" in data:
            # The settings are either all at the top or all in [policy]: a key beside the
            # table (a typo, or a value the table would override) was silently dropped.
            settings = data.pop("policy")
            if not isinstance(settings, dict):
                raise InvalidInput("invalid_policy", f"{path}: policy must be a table "
                                   f"([policy]), not {type(settings).__name__}")
            if data:
                raise InvalidInput("invalid_policy", f"{path}: {', '.join(map(repr, data))} "
                                   "outside [policy]: put every setting in the table")
            data = settings
        policy = cls.from_mapping(data, source=path)
        object.__setattr__(policy, "artifacts", artifacts)
        return policy

    @classmethod
    def from_mapping(cls, data: dict[str, Any], source: str = "policy") -> Policy:
        known = {f.name: f for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, value in data.items():
            if key not in known:
                raise InvalidInput("invalid_policy", f"{source}: unknown setting {key!r}")
            default = getattr(cls, key)
            if isinstance(default, bool):
                ok = isinstance(value, bool)
            elif isinstance(default, int):
                ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
            else:
                ok = (isinstance(value, int | float) and not isinstance(value, bool)
                      and math.isfinite(value) and value >= 0)
            if not ok:
                what = ("true or false" if isinstance(default, bool)
                        else f"a non-negative {type(default).__name__}")
                raise InvalidInput("invalid_policy", f"{source}: {key} must be {what}")
            values[key] = value
        _check_bounds({**{k: f.default for k, f in known.items()}, **values}, source)
        return cls(**values)

    def backoff_s(self, failed_attempts: int) -> float:
        """Deterministic backoff after the n-th failed attempt (n >= 1)."""
        exponent = min(max(failed_attempts, 1) - 1, 30)  # clamp before multiplying
        return min(self.retry_max_s, self.retry_base_s * 2.0**exponent)


def _too_deep(path: str) -> InvalidInput:
    return InvalidInput("invalid_policy", f"policy {path} is nested too deep to read (a "
                        "policy's tables and lists nest a few levels)")


_DAY_S = 86400.0
_MIB = 1024 * 1024
#: Sane bounds of every numeric setting (inclusive), documented in README's policy list.
#: They keep every time computation far from overflow: no lease, backoff or age longer than a
#: week, no payload or result over 64 MiB, no more than 100 attempts (enqueue's own limit).
POLICY_BOUNDS: dict[str, tuple[float, float]] = {
    "max_memory_pct": (0.0, 100.0),
    "max_temperature_c": (0.0, 150.0),
    "background_from_priority": (0, 4),
    "background_min_idle_s": (0.0, 7 * _DAY_S),
    "heartbeat_max_age_s": (1.0, 7 * _DAY_S),
    "default_lease_s": (0.001, 7 * _DAY_S),
    "max_lease_s": (0.001, 7 * _DAY_S),
    "max_payload_bytes": (2, 64 * _MIB),
    "max_result_bytes": (2, 64 * _MIB),
    "retry_base_s": (0.0, 7 * _DAY_S),
    "retry_max_s": (0.0, 7 * _DAY_S),
    "default_max_attempts": (1, 100),
    "default_priority": (0, 3),
    "max_releases": (0, 1000),
}


def _check_bounds(values: dict[str, Any], source: str) -> None:
    """Refuse a setting outside POLICY_BOUNDS (or of the wrong type), naming the key."""
    for key, (lo, hi) in POLICY_BOUNDS.items():
        value = values[key]
        if (isinstance(value, bool) or not isinstance(value, int | float)
                or not math.isfinite(value) or not lo <= value <= hi):
            raise InvalidInput("invalid_policy", f"{source}: {key} = {value!r} is outside "
                               f"{lo:g}..{hi:g}", key=key)
    if values["default_lease_s"] > values["max_lease_s"]:
        raise InvalidInput("invalid_policy", f"{source}: default_lease_s is longer than "
                           "max_lease_s", key="default_lease_s")


@dataclass(frozen=True)
class Readings:
    memory_used_pct: float | None = None
    temperature_c: float | None = None
    on_battery: bool | None = None
    user_idle_s: float | None = None


@dataclass(frozen=True)
class GateDecision:
    """What the gates allow for one worker right now."""

    #: Highest priority number (0..3) the worker may claim; -1 means nothing at all.
    max_priority: int
    #: Why everything is refused, or why background work is refused (code, detail).
    refusal: tuple[str, str] | None = None

    @property
    def blocks_all(self) -> bool:
        return self.max_priority < 0


def evaluate(policy: Policy, r: Readings) -> GateDecision:
    """Apply the gates in a fixed order: memory, temperature (both stop all new claims), then
    power and user activity (which only hold back background priorities)."""
    if r.memory_used_pct is not None and r.memory_used_pct > policy.max_memory_pct:
        return GateDecision(-1, ("memory_gate", f"memory use {r.memory_used_pct:g}% is above "
                                 f"the {policy.max_memory_pct:g}% limit"))
    if r.temperature_c is not None and r.temperature_c > policy.max_temperature_c:
        return GateDecision(-1, ("thermal_gate", f"temperature {r.temperature_c:g} C is above "
                                 f"the {policy.max_temperature_c:g} C limit"))
    foreground = policy.background_from_priority - 1
    strict = policy.unknown_blocks_background
    if policy.background_requires_ac and (r.on_battery or (strict and r.on_battery is None)):
        reason = "on battery" if r.on_battery else "power source unknown"
        return GateDecision(foreground, ("power_gate", f"{reason}: background priorities "
                                         f"(P{policy.background_from_priority}+) need AC power"))
    idle = r.user_idle_s
    if (idle is not None and idle < policy.background_min_idle_s) or (strict and idle is None):
        what = f"user active {idle:g}s ago" if idle is not None else "user activity unknown"
        return GateDecision(foreground, ("user_active", f"{what}: background priorities need "
                                         f"{policy.background_min_idle_s:g}s of idle time"))
    return GateDecision(3)
