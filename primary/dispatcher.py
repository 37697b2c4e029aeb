"""Priority-mode routing for one queue: a plain state machine, no I/O, no clock.

Messages enter in PUT order (`add_messages`) from the delivery log. They go
round-robin to the consumers with the highest priority that have capacity
(max unconfirmed messages and bytes); a consumer at capacity receives nothing
new, and there is no spillover to lower priorities (BlazingMQ's rule). When a
consumer goes away its unconfirmed messages return to the front of the queue,
in their original order, flagged for redelivery (delivery_count + 1).

Every method returns the pushes to send as `(consumer_key, message)` pairs;
the caller owns the links. Not thread safe: the caller holds the partition lock.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Hashable, Iterable

ConsumerKey = Hashable


@dataclass
class StoredMessage:
    guid: bytes
    seq: int
    payload: bytes
    properties: list  # list[pb.Property]; opaque here
    put_time_us: int
    delivery_count: int = 0

    @property
    def size(self) -> int:
        return len(self.payload)


@dataclass
class ConsumerOptions:
    max_unconfirmed_messages: int = 1000
    max_unconfirmed_bytes: int = 32 * 1024 * 1024
    priority: int = 0


@dataclass
class _Consumer:
    key: ConsumerKey
    options: ConsumerOptions
    unconfirmed: "OrderedDict[bytes, StoredMessage]" = field(default_factory=OrderedDict)
    unconfirmed_bytes: int = 0

    def has_capacity(self) -> bool:
        # BlazingMQ: a consumer is at capacity once either limit is reached, so a
        # consumer with 0/0 is paused. A single message larger than the byte
        # limit still goes to an idle consumer, or it could never be delivered.
        if len(self.unconfirmed) >= self.options.max_unconfirmed_messages:
            return False
        if self.options.max_unconfirmed_bytes <= 0:
            return False
        return not self.unconfirmed or self.unconfirmed_bytes < self.options.max_unconfirmed_bytes


Push = tuple[ConsumerKey, StoredMessage]


class QueueDispatcher:
    def __init__(self) -> None:
        self._pending: deque[StoredMessage] = deque()
        self._known: set[bytes] = set()          # guids pending or in flight
        self._consumers: dict[ConsumerKey, _Consumer] = {}
        self._rr: deque[ConsumerKey] = deque()   # round-robin order

    # -- inspection ---------------------------------------------------------
    @property
    def pending_count(self) -> int:
        return len(self._pending)

    @property
    def unconfirmed_count(self) -> int:
        return sum(len(c.unconfirmed) for c in self._consumers.values())

    def consumer_keys(self) -> list[ConsumerKey]:
        return list(self._consumers)

    def unconfirmed_of(self, key: ConsumerKey) -> list[bytes]:
        return list(self._consumers[key].unconfirmed)

    # -- events -------------------------------------------------------------
    def add_messages(self, messages: Iterable[StoredMessage]) -> list[Push]:
        for message in messages:
            if message.guid in self._known:
                continue  # already pending or in flight: the log holds each GUID once
            self._known.add(message.guid)
            self._pending.append(message)
        return self._dispatch()

    def add_consumer(self, key: ConsumerKey, options: ConsumerOptions) -> list[Push]:
        assert key not in self._consumers, f"consumer {key!r} added twice"
        self._consumers[key] = _Consumer(key, options)
        self._rr.append(key)
        return self._dispatch()

    def configure_consumer(self, key: ConsumerKey, options: ConsumerOptions) -> list[Push]:
        self._consumers[key].options = options
        return self._dispatch()

    def remove_consumer(self, key: ConsumerKey) -> list[Push]:
        consumer = self._consumers.pop(key, None)
        if consumer is None:
            return []
        self._rr.remove(key)
        # Back to the front, oldest first, so redelivery keeps PUT order.
        for message in reversed(consumer.unconfirmed.values()):
            self._pending.appendleft(message)
        return self._dispatch()

    def confirm(self, key: ConsumerKey, guid: bytes) -> tuple[StoredMessage | None, list[Push]]:
        """Returns the confirmed message (None if unknown or not held by `key`)."""
        consumer = self._consumers.get(key)
        if consumer is None:
            return None, []
        message = consumer.unconfirmed.pop(guid, None)
        if message is None:
            return None, []
        consumer.unconfirmed_bytes -= message.size
        self._known.discard(guid)
        return message, self._dispatch()

    # -- routing ------------------------------------------------------------
    def _dispatch(self) -> list[Push]:
        pushes: list[Push] = []
        if not self._pending or not self._consumers:
            return pushes
        top = max(c.options.priority for c in self._consumers.values())
        while self._pending:
            sent = False
            for _ in range(len(self._rr)):
                key = self._rr[0]
                self._rr.rotate(-1)
                consumer = self._consumers[key]
                if consumer.options.priority != top or not consumer.has_capacity():
                    continue
                message = self._pending.popleft()
                message.delivery_count += 1
                consumer.unconfirmed[message.guid] = message
                consumer.unconfirmed_bytes += message.size
                pushes.append((key, message))
                sent = True
                break
            if not sent:
                break  # every top-priority consumer is at capacity
        return pushes
