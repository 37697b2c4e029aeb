"""Clocks injected into the cores, so that tests can drive time."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> float: ...


class MonotonicClock:
    def now_ms(self) -> float:
        return time.monotonic() * 1000.0


class ManualClock:
    """A clock that moves only when told to (tests)."""

    def __init__(self, start_ms: float = 0.0) -> None:
        self._now = start_ms

    def now_ms(self) -> float:
        return self._now

    def advance(self, ms: float) -> None:
        self._now += ms


def wall_time_us() -> int:
    """Wall-clock microseconds since the epoch (stored in tables, not used for timing logic)."""
    return time.time_ns() // 1000
