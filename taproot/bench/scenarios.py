"""Benchmark scenarios: BlazingMQ's published table (1 KiB messages)."""

from __future__ import annotations

from dataclasses import dataclass, replace

MODES = ("priority", "fanout", "broadcast")


@dataclass(frozen=True)
class Scenario:
    """`queues` queues, each with `producers` producers and `consumers`
    consumers (in fanout each consumer is its own app and gets every message;
    in broadcast every consumer gets every message)."""
    name: str
    mode: str = "priority"
    queues: int = 1
    producers: int = 1      # per queue
    consumers: int = 1      # per queue
    size: int = 1024
    rate: float = 0.0       # msg/s over all producers; 0: as fast as ACKs allow
    duration_s: float = 10.0
    batch: int = 1000       # messages the Taproot SDK batches per PUT frame
    window: int = 10_000    # unacknowledged PUTs a producer may have (every system)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        for name in ("queues", "producers", "consumers", "size", "batch", "window"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.rate < 0 or self.duration_s <= 0:
            raise ValueError("rate must be >= 0 and duration > 0")

    @property
    def label(self) -> str:
        return f"{self.mode} {self.queues}Q/{self.producers * self.queues}P/{self.consumers * self.queues}C"

    @property
    def copies(self) -> int:
        """How many consumers receive each message."""
        return 1 if self.mode == "priority" else self.consumers

    def with_(self, **changes) -> "Scenario":
        return replace(self, **changes)


# BlazingMQ's benchmark table ("Performance" in ../shared/reference/blazingmq.md).
SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("priority-1q", "priority", 1, 1, 1),
    Scenario("priority-10q", "priority", 10, 1, 1),
    Scenario("priority-100q", "priority", 100, 1, 1),
    Scenario("fanout-5c", "fanout", 1, 1, 5),
    Scenario("fanout-30c", "fanout", 1, 1, 30),
    Scenario("broadcast-1c", "broadcast", 1, 1, 1),
    Scenario("broadcast-5c", "broadcast", 1, 1, 5),
)}
