"""Clocks: the cores take a `Clock` (an injectable `now_ms`) instead of reading time themselves."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> float: ...


class MonotonicClock:
    def now_ms(self) -> float:
        return time.monotonic() * 1000.0


def wall_time_us() -> int:
    """Wall-clock microseconds since the epoch (stored in tables, not used for timing logic)."""
    return time.time_ns() // 1000
