"""The frozen clock and the readings the rule tests share."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

#: The instant frozen-clock tests start at.
T0 = datetime(2026, 3, 1, 9, 0, 0, tzinfo=UTC)

#: Readings that pass every gate, background ones included: AC power, user idle.
IDLE_ON_AC = {"memory_used_pct": 40, "temperature_c": 55, "on_battery": False,
              "user_idle_s": 900}


def at(t: float) -> datetime:
    """T0 plus t seconds."""
    return T0 + timedelta(seconds=t)


def iso_at(t: float) -> str:
    """at(t) as jobcoord prints times."""
    return at(t).isoformat().replace("+00:00", "Z")
