"""The clocks a worker reads and the watch that notices a suspend or a clock step between them."""

from __future__ import annotations

import time

from ..clock import now_us

#: A job thread and the ticker look at the clocks at least this often (seconds).
LOOP_MAX_WAIT_S = 0.5
#: The wall clock or CLOCK_BOOTTIME running ahead of CLOCK_MONOTONIC by more than this between
#: two looks means the machine was suspended (or its clock stepped): renew or stop at once,
#: and heartbeat at once.
CLOCK_GAP_S = 2.0


class Clock:
    """The clocks a worker reads, in one object so a test can move them (a simulated suspend:
    the wall clock and boot time jump, the monotonic clock does not).

    Local lease and budget timing uses `boot()`, CLOCK_BOOTTIME, which keeps counting while
    the machine is suspended (CLOCK_MONOTONIC stops); the coordinator judges leases by the
    wall clock, which `wall_us()` reads the way the coordinator does."""

    def mono(self) -> float:
        return time.monotonic()

    def boot(self) -> float:
        return boottime()

    def wall_us(self) -> int:
        return now_us()


def boottime() -> float:
    """CLOCK_BOOTTIME (else the monotonic clock): one clock for every process of the machine,
    so a time on it means the same to the worker and to a command's shim."""
    clock_id = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(clock_id) if clock_id is not None else time.monotonic()


class GapWatch:
    """Notices a suspend or a clock step between two looks: the wall clock or boot time
    moved much more (or less) than the monotonic clock."""

    def __init__(self, clock: Clock):
        self.clock = clock
        self.last = self._read()

    def _read(self) -> tuple[float, float, float]:
        return self.clock.mono(), self.clock.boot(), self.clock.wall_us() / 1e6

    def check(self) -> float:
        """Seconds of the gap since the last look (0.0: none)."""
        now = self._read()
        d_mono, d_boot, d_wall = (b - a for a, b in zip(self.last, now, strict=True))
        self.last = now
        gap = max(d_boot - d_mono, abs(d_wall - d_mono))
        return gap if gap > CLOCK_GAP_S else 0.0
