"""PUT batching in the SDK: the pure decision of when a batch leaves."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from protocol.limits import PUT_COLUMNS_MIN, PUT_SPANNING_MIN


@dataclass(frozen=True)
class BatchPolicy:
    # How long the first PUT (or CONFIRM) of a batch may wait for others. At
    # 1 ms, per-message post() at 10k msg/s sent frames of about ten PUTs and
    # the two cores queued behind them: PUT->ACK p50 640 ms, p99 1,164. At 5
    # ms: 82 / 244 (docs/benchmarks.md, 2026-11-25). An idle producer's PUT
    # pays up to 5 ms more; full speed fills frames first either way. Kafka's
    # producer made the same move (linger.ms 0 -> 5 in 4.0).
    linger_ms: float = 5.0
    max_messages: int = 1000
    max_bytes: int = 4 * 1024 * 1024
    # A queue's PUTs of one batch travel as one columnar frame from this many
    # on; fewer go as PutMessages (a frame's fixed cost is paid per frame).
    columns_min: int = PUT_COLUMNS_MIN
    # The PUTs of several queues of one partition share one frame from this
    # many on (the primary commits it queue by queue): each hop pays a
    # frame's fixed cost (about 140 us to encode, decode and check an Arrow
    # frame at the primary) once, not once per queue.
    spanning_min: int = PUT_SPANNING_MIN

    def __post_init__(self) -> None:
        if (self.linger_ms < 0 or self.max_messages < 1 or self.max_bytes < 1 or self.columns_min < 1
                or self.spanning_min < 1):
            raise ValueError("linger_ms >= 0, max_messages >= 1, max_bytes >= 1, columns_min >= 1 and "
                             "spanning_min >= 1 are required")


class Batcher:
    """Accumulates items; `add` and `due` say when to flush. No clock inside:
    callers pass `now_ms`."""

    def __init__(self, policy: BatchPolicy):
        self.policy = policy
        self.items: list[Any] = []
        self.nbytes = 0
        self.first_ms = 0.0

    def add(self, item: object, nbytes: int, now_ms: float) -> bool:
        """Add an item; True when the batch is full and must be flushed now."""
        if not self.items:
            self.first_ms = now_ms
        self.items.append(item)
        self.nbytes += nbytes
        return len(self.items) >= self.policy.max_messages or self.nbytes >= self.policy.max_bytes

    def due(self, now_ms: float) -> bool:
        return bool(self.items) and now_ms - self.first_ms >= self.policy.linger_ms

    def deadline_ms(self) -> float | None:
        return self.first_ms + self.policy.linger_ms if self.items else None

    def take(self) -> list[Any]:
        items, self.items, self.nbytes = self.items, [], 0
        return items
