"""Real machine readings for the worker heartbeat: memory, temperature, power, user idle time.

Each reading is taken from the platform where it exposes one (psutil, plus the X11 idle
counter and terminal access times for user activity) and is `None` ("unknown") where it does
not. The gate policy (policy.py) decides what unknown means; the defaults are chosen so that a
machine with no interactive user and no battery (a server, a CI box) runs background work:

- no battery at all means AC power (`on_battery` false);
- no interactive session at all means the user is idle, and has been since boot
  (`user_idle_s` = seconds since boot);
- sessions exist but none reports activity: unknown (`None`).

A reading failing (a sensor raising, `xprintidle` hanging) never stops the worker: the value
becomes unknown and the reason is kept in `sources`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import psutil

from . import validate as v
from .errors import InvalidInput

#: Readings the gates use (core.workers.parse_readings).
READING_KEYS = ("memory_used_pct", "temperature_c", "on_battery", "user_idle_s")
#: Readings a claim matches jobs' declared needs against (the heartbeat contract), and
#: named capacity (`heartbeat --capacity`, `worker --readings-override`).
RESOURCE_KEYS = ("memory_available_mb", "gpus", "capacity")
#: Sensor values outside this range are glitches (disconnected probes report -273 or 255).
_SANE_TEMPERATURE_C = (-50.0, 150.0)
#: Idle time is reported at most this large (the coordinator's bound on seconds).
_MAX_IDLE_S = 10 * 365 * 24 * 3600.0
_XPRINTIDLE_TIMEOUT_S = 1.0


@dataclass
class MachineReadings:
    memory_used_pct: float | None = None
    temperature_c: float | None = None
    on_battery: bool | None = None
    user_idle_s: float | None = None
    #: Free RAM in MB (psutil's "available": what new processes can use without swapping).
    memory_available_mb: int | None = None
    #: One reading per NVIDIA GPU through NVML; None: no library, no driver or no GPU.
    gpus: list[dict[str, float | None]] | None = None
    #: Where each value came from, or why it is unknown (for logs and `workers`).
    sources: dict[str, str] = field(default_factory=dict)

    def as_heartbeat(self) -> dict[str, Any]:
        """The readings a heartbeat carries, `"unknown"` where there is no value; `gpus`
        only when the machine reports GPUs."""
        out: dict[str, Any] = {}
        for key in (*READING_KEYS, "memory_available_mb"):
            value = getattr(self, key)
            out[key] = "unknown" if value is None else value
        if self.gpus:
            out["gpus"] = self.gpus
        return out


def memory_used_pct() -> tuple[float | None, str]:
    try:
        return round(float(psutil.virtual_memory().percent), 1), "psutil.virtual_memory"
    except (OSError, RuntimeError, AttributeError) as e:
        return None, f"unavailable: {e}"


def memory_available_mb() -> tuple[int | None, str]:
    try:
        return int(psutil.virtual_memory().available // 2**20), "psutil.virtual_memory"
    except (OSError, RuntimeError, AttributeError) as e:
        return None, f"unavailable: {e}"


def _nvml_value(read: Any) -> float | None:
    """One NVML reading, None when this GPU does not support it."""
    try:
        return float(read())
    except Exception:  # NVMLError_NotSupported and kin: that value is unknown
        return None


def gpus() -> tuple[list[dict[str, float | None]] | None, str]:
    """Each NVIDIA GPU's free and total memory (MB), utilisation (%) and temperature (C),
    through NVML (`nvidia-ml-py`, the optional extra `jobcoord[gpu]`). No library, no driver
    or no GPU: no readings, and the reason, never an error."""
    try:
        import pynvml
    except ImportError:
        return None, "unavailable: nvidia-ml-py is not installed (pip install 'jobcoord[gpu]')"
    try:
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        return None, f"unavailable: NVML: {e}"
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            out.append({
                "memory_free_mb": float(mem.free // 2**20),
                "memory_total_mb": float(mem.total // 2**20),
                "utilization_pct": _nvml_value(
                    lambda h=h: pynvml.nvmlDeviceGetUtilizationRates(h).gpu),
                "temperature_c": _nvml_value(lambda h=h: pynvml.nvmlDeviceGetTemperature(
                    h, pynvml.NVML_TEMPERATURE_GPU)),
            })
    except Exception as e:
        return None, f"unavailable: NVML: {e}"
    finally:
        # Shutting down a library that failed to read: nothing to keep.
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
    if not out:
        return None, "NVML reports no GPU"
    return out, f"NVML ({len(out)} GPUs)"


def temperature_c() -> tuple[float | None, str]:
    """The hottest sensor: a gate protects the machine, so the worst part counts."""
    read = getattr(psutil, "sensors_temperatures", None)
    if read is None:
        return None, "unavailable: no temperature sensors on this platform"
    try:
        groups = read()
    except (OSError, RuntimeError) as e:
        return None, f"unavailable: {e}"
    lo, hi = _SANE_TEMPERATURE_C
    values = [float(t.current) for entries in groups.values() for t in entries
              if t.current is not None and lo < float(t.current) < hi]
    if not values:
        return None, "unavailable: no temperature sensor reported a value"
    return round(max(values), 1), f"psutil.sensors_temperatures ({len(values)} sensors)"


def on_battery() -> tuple[bool | None, str]:
    read = getattr(psutil, "sensors_battery", None)
    if read is None:
        return None, "unavailable: no battery information on this platform"
    try:
        battery = read()
    except (OSError, RuntimeError) as e:
        return None, f"unavailable: {e}"
    if battery is None:
        return False, "no battery: AC power"
    if battery.power_plugged is None:
        return None, "battery present, power source not reported"
    return (not battery.power_plugged), "psutil.sensors_battery"


def x11_idle_s(env: Mapping[str, str] | None = None) -> tuple[float | None, str]:
    """Idle time of the X11 session via `xprintidle` (milliseconds since the last input)."""
    env = os.environ if env is None else env
    if not env.get("DISPLAY"):
        return None, "no X11 display"
    exe = shutil.which("xprintidle", path=env.get("PATH"))
    if exe is None:
        return None, "xprintidle not installed"
    try:
        proc = subprocess.run([exe], capture_output=True, text=True, env=dict(env),
                              timeout=_XPRINTIDLE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"xprintidle failed: {e}"
    text = proc.stdout.strip()
    if proc.returncode != 0 or not text.isdigit():
        return None, f"xprintidle failed (exit {proc.returncode})"
    return int(text) / 1000.0, "xprintidle"


def terminal_idle_s(terminal: str, now: float | None = None) -> float | None:
    """Seconds since input on a terminal, from the device's access time (what `w` shows)."""
    if not terminal or terminal.startswith(":"):  # an X display, not a device
        return None
    path = terminal if terminal.startswith("/dev/") else os.path.join("/dev", terminal)
    try:
        atime = os.stat(path).st_atime
    except OSError:
        return None
    now = time.time() if now is None else now
    return max(0.0, now - atime)


def user_idle_s(env: Mapping[str, str] | None = None) -> tuple[float | None, str]:
    """The most recent user activity over every source the platform offers."""
    found: list[tuple[float, str]] = []
    x11, x11_why = x11_idle_s(env)
    if x11 is not None:
        found.append((x11, "xprintidle"))
    try:
        sessions = psutil.users()
    except (OSError, RuntimeError):
        sessions = None
    now = time.time()
    for s in sessions or ():
        idle = terminal_idle_s(s.terminal or "", now)
        if idle is not None:
            found.append((idle, f"terminal {s.terminal}"))
    if found:
        idle, source = min(found)
        return round(min(idle, _MAX_IDLE_S), 1), source
    if sessions == [] and x11 is None:
        # Nobody is logged in: a server or CI box. Its user is idle, since boot.
        try:
            since_boot = max(0.0, now - psutil.boot_time())
        except (OSError, RuntimeError):
            since_boot = _MAX_IDLE_S
        return round(min(since_boot, _MAX_IDLE_S), 1), "no interactive session: idle since boot"
    return None, f"unknown: sessions without activity data ({x11_why})"


def read_machine(env: Mapping[str, str] | None = None) -> MachineReadings:
    """Take every reading now. Never raises."""
    r = MachineReadings()
    r.memory_used_pct, r.sources["memory_used_pct"] = memory_used_pct()
    r.temperature_c, r.sources["temperature_c"] = temperature_c()
    r.on_battery, r.sources["on_battery"] = on_battery()
    r.user_idle_s, r.sources["user_idle_s"] = user_idle_s(env)
    r.memory_available_mb, r.sources["memory_available_mb"] = memory_available_mb()
    r.gpus, r.sources["gpus"] = gpus()
    return r


def parse_override(text: str | None) -> dict[str, Any]:
    """`--readings-override JSON`: values that replace the real readings (for tests and
    demos). Only the known readings; each is checked again by the coordinator."""
    if text is None:
        return {}
    try:
        value = v.loads(text)
    except ValueError as e:
        raise InvalidInput("invalid_input", f"--readings-override is not valid JSON: {e}"
                           ) from None
    if not isinstance(value, dict):
        raise InvalidInput("invalid_input", "--readings-override must be a JSON object")
    unknown = sorted(set(value) - {*READING_KEYS, *RESOURCE_KEYS})
    if unknown:
        raise InvalidInput("invalid_input", f"--readings-override: unknown reading(s) "
                           f"{', '.join(unknown)}; known: "
                           f"{', '.join((*READING_KEYS, *RESOURCE_KEYS))}")
    if isinstance(value.get("capacity"), dict) and value["capacity"]:
        # Refused before the worker starts, not on its every heartbeat.
        v.capacity(value["capacity"], "--readings-override: capacity")
    return value


def current_readings(override: Mapping[str, Any] | None = None,
                     env: Mapping[str, str] | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """Heartbeat readings (real, then overridden) and where each came from."""
    r = read_machine(env)
    values, sources = r.as_heartbeat(), dict(r.sources)
    for key, value in (override or {}).items():
        values[key] = value
        sources[key] = "override"
    return values, sources
