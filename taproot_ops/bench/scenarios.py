"""Benchmark scenarios: BlazingMQ's published table (1 KiB messages)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

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
    queues_per_client: int = 1  # Taproot: each producer/consumer session serves this many queues
    app_subscriptions: bool = False  # Taproot fanout: some apps subscribe (APP_RULES); producers post property n
    bulk: bool = False      # Taproot: producers post columnar frames of `batch` rows (`post_columns`)
    batch_consumer: bool = False  # Taproot: consumers take `get_batch` lots and confirm each with one call
    federated: bool = False  # Taproot: producers on one cluster, consumers on another, a push link between

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        for name in ("queues", "producers", "consumers", "size", "batch", "window", "queues_per_client"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.rate < 0 or self.duration_s <= 0:
            raise ValueError("rate must be >= 0 and duration > 0")
        if self.federated and self.mode == "broadcast":
            raise ValueError("broadcast messages are not stored, so no link carries them")

    @property
    def label(self) -> str:
        clients = [*(["bulk producers"] if self.bulk else []), *(["batch consumers"] if self.batch_consumer else [])]
        suffix = (f" ({', '.join(clients)})" if clients else "") + (", across a push link" if self.federated else "")
        if self.queues_per_client > 1:
            return (f"{self.mode} {self.queues}Q/{self.sessions(self.producers)}P/"
                    f"{self.sessions(self.consumers)}C ({self.queues_per_client} queues per client)") + suffix
        return f"{self.mode} {self.queues}Q/{self.producers * self.queues}P/{self.consumers * self.queues}C" + suffix

    def sessions(self, per_queue: int) -> int:
        """Client sessions of one role: `per_queue` for every group of
        `queues_per_client` queues."""
        return per_queue * -(-self.queues // self.queues_per_client)

    @property
    def copies(self) -> int:
        """How many consumers receive each message."""
        return 1 if self.mode == "priority" else self.consumers

    def with_(self, **changes: Any) -> "Scenario":
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


# fanout-5c-subs: producers post property n = 0..9 in turn; these apps
# subscribe (the others get everything). Each consumer checks every message it
# gets against its app's rule, and waits for exactly the matching ACKed count.
N_VALUES = 10
APP_RULES: dict[int, tuple[str, Callable[[int], bool]]] = {
    1: ("n % 2 = 0", lambda n: n % 2 == 0),
    3: ("n < 3", lambda n: n < 3),
    4: ("n >= 5 && n != 7", lambda n: n >= 5 and n != 7),
}


def app_matches(app: int, n: int) -> bool:
    rule = APP_RULES.get(app)
    return rule is None or rule[1](n)


# Taproot-only scenarios (the peers have no application subscriptions).
TAPROOT_ONLY: dict[str, Scenario] = {s.name: s for s in (
    Scenario("fanout-5c-subs", "fanout", 1, 1, 5, app_subscriptions=True),
    # The client paths built for throughput: a bulk producer (columnar frames
    # of `batch` rows) and batch consumers (issue 15's targets).
    Scenario("priority-1q-batch", "priority", 1, 1, 1, bulk=True, batch_consumer=True),
    # The same paths for `--compare`'s ten queues and fanout to five apps.
    Scenario("priority-10q-batch", "priority", 10, 1, 1, bulk=True, batch_consumer=True),
    Scenario("fanout-5c-batch", "fanout", 1, 1, 5, bulk=True, batch_consumer=True),
    Scenario("broadcast-5c-batch", "broadcast", 1, 1, 5, batch_consumer=True),
    # The same with a bulk producer: each PUT frame of `batch` rows goes to
    # the five consumers as one PUSH frame each, never committed.
    Scenario("broadcast-5c-bulk", "broadcast", 1, 1, 5, bulk=True, batch_consumer=True),
    # Federation (docs/federation.md): posted to cluster "london", consumed on
    # cluster "paris"; PUT->PUSH is across the push link.
    Scenario("federation-push", "priority", 1, 1, 1, federated=True),
    Scenario("federation-push-batch", "priority", 1, 1, 1, bulk=True, batch_consumer=True, federated=True),
)}


# Per-message cost against the number of queues (the issue's "flat from 1 to
# 10,000 queues"): the same two producer and two consumer sessions each time,
# only the queues they spread over change. `--scenario queues` runs them all.
QUEUE_SWEEP: dict[str, Scenario] = {s.name: s for s in (
    Scenario("queues-1", "priority", 1, 2, 2),
    Scenario("queues-10", "priority", 10, 1, 1, queues_per_client=5),
    Scenario("queues-100", "priority", 100, 1, 1, queues_per_client=50),
    Scenario("queues-1000", "priority", 1000, 1, 1, queues_per_client=500),
    Scenario("queues-10000", "priority", 10_000, 1, 1, queues_per_client=5000),
)}
