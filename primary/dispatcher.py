"""Routing for one queue and one app: a plain state machine, no I/O.

Messages enter in PUT order (`add_messages`) from the delivery log. Each goes to
a consumer whose subscription matches it (a consumer without one matches
everything): among the matching consumers, only those with the highest
priority are eligible, round-robin, and only while they have capacity (max
unconfirmed messages and bytes). A consumer at capacity receives nothing new,
and there is no spillover to lower priorities (BlazingMQ's rule). A message no
consumer matches stays pending, and later messages pass it.

When a consumer goes away its unconfirmed messages return to the front of the
queue, in their original order, flagged for redelivery (delivery_count + 1).
A message that has already been pushed `max_delivery_attempts` times is not
pushed again but dropped as a poison pill; a message whose TTL passed is
dropped as expired. Dropped messages are collected for the caller
(`take_dropped`), which writes them to the dead-letter table.

A columnar PUT frame enters as one `MessageRun` (its Arrow columns) and
goes to a consumer as one run, cut at its window, when that consumer is the
only one of the top priority with room; otherwise it is dispatched row by
row. Either way the outcome is the per-message one (`tests/test_dispatcher.py`
holds both to the same schedules). A consumer holds a run it was pushed as
one span, not an entry a row, and a CONFIRM frame's seq range is taken
from it in one step (`primary/held.py`).

Every method returns the pushes to send as `(consumer_key, message or run)`
pairs; the caller owns the links. Not thread safe: the caller holds the
partition lock.
"""

from __future__ import annotations

import functools
from collections import deque
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Concatenate,
    Hashable,
    Iterable,
    Mapping,
    NamedTuple,
    ParamSpec,
    Protocol,
    Sequence,
    TypeVar,
    cast,
)

import numpy as np
import pyarrow as pa

from primary.held import HeldRows
from protocol.limits import MAX_UNCONFIRMED_BYTES, MAX_UNCONFIRMED_MESSAGES
from protocol.properties import VIA, from_wire, maps_to_wire, wire_to_maps

if TYPE_CHECKING:
    from primary.ledger import Ledger

ConsumerKey = Hashable
REASON_ATTEMPTS = "max_delivery_attempts"
REASON_TTL = "ttl_expired"


class StoredMessage:
    """A message held for delivery to one app. Slotted, and its wire
    properties are built only when first needed (push or subscription
    matching): the primary may hold millions of these, and most are routed
    long before anything reads their properties."""

    __slots__ = ("guid", "seq", "payload", "_wire", "_maps", "put_time_us", "delivery_count", "expires_us",
                 "compression", "_props")

    def __init__(self, guid: bytes, seq: int, payload: bytes, properties: list[Any] | None = None,
                 put_time_us: int = 0, delivery_count: int = 0, expires_us: int = 0, compression: int = 0,
                 *, maps: tuple[Any, Any] | None = None, _props: dict[str, Any] | None = None):
        self.guid, self.seq, self.payload = guid, seq, payload
        self._wire = properties   # list[pb.Property]; opaque here
        self._maps = maps         # or the tables' (values, types) pair lists, turned into _wire on demand
        self.put_time_us, self.delivery_count = put_time_us, delivery_count
        self.expires_us = expires_us   # primary clock; 0: never expires
        self.compression = compression
        self._props = _props

    def __repr__(self) -> str:
        return f"StoredMessage(guid={self.guid.hex()}, seq={self.seq}, delivery_count={self.delivery_count})"

    @property
    def properties(self) -> list[Any]:
        if self._wire is None:
            self._wire = maps_to_wire(*self._maps) if self._maps else []
        return self._wire

    @property
    def property_maps(self) -> tuple[list[Any] | None, list[Any] | None]:
        """(values, types) as the tables' string maps; (None, None) when it has none."""
        if self._maps:
            return self._maps[0], self._maps[1]
        if self._wire:
            values, types = wire_to_maps(self._wire)
            return values, types
        return None, None

    @property
    def size(self) -> int:
        return len(self.payload)

    @property
    def typed_properties(self) -> dict[str, Any]:
        if self._props is None:
            self._props = from_wire(self.properties)
        return self._props

    def for_app(self) -> "StoredMessage":
        """A copy with its own delivery state, sharing payload and properties."""
        return StoredMessage(self.guid, self.seq, self.payload, self._wire, self.put_time_us,
                             self.delivery_count, self.expires_us, self.compression, maps=self._maps,
                             _props=self._props)


class MessageRun:
    """Messages of one committed frame for one app, held as the frame's Arrow
    columns instead of one StoredMessage each: what the express lane hands
    the dispatcher for a columnar PUT frame, and what goes out as one
    PushColumns frame when one consumer takes it (a sole consumer of the
    top priority with room: the common case); with subscriptions, or
    several consumers to alternate between, it becomes StoredMessages.
    Every row has the same delivery count and expiry.
    `table` has the push columns but the delivery count (`columns.PUSH_SCHEMA`);
    the GUIDs, seqs and sizes are also Python lists, for the dispatcher's
    bookkeeping (known GUIDs, unconfirmed per consumer, byte windows)."""

    __slots__ = ("table", "guids", "seqs", "sizes", "delivery_count", "expires_us")

    def __init__(self, table: pa.Table, guids: list[bytes], seqs: list[int], sizes: list[int],
                 delivery_count: int = 0, expires_us: int = 0):
        self.table, self.guids, self.seqs, self.sizes = table, guids, seqs, sizes
        self.delivery_count, self.expires_us = delivery_count, expires_us

    def __len__(self) -> int:
        return len(self.guids)

    def __repr__(self) -> str:
        return f"MessageRun(seq={self.seqs[0]}..{self.seqs[-1]}, rows={len(self)}, " \
               f"delivery_count={self.delivery_count})"

    @property
    def seq(self) -> int:
        """The first row's seq (pushes are merged across apps by it)."""
        return self.seqs[0]

    @property
    def size(self) -> int:
        return sum(self.sizes)

    def for_app(self) -> "MessageRun":
        """A copy with its own delivery state, sharing the columns."""
        return MessageRun(self.table, self.guids, self.seqs, self.sizes, self.delivery_count, self.expires_us)

    def head(self, count: int) -> "tuple[MessageRun, MessageRun | None]":
        """The first `count` rows, and the rest (None when nothing is left)."""
        if count >= len(self):
            return self, None
        rest = MessageRun(self.table.slice(count), self.guids[count:], self.seqs[count:], self.sizes[count:],
                          self.delivery_count, self.expires_us)
        return MessageRun(self.table.slice(0, count), self.guids[:count], self.seqs[:count], self.sizes[:count],
                          self.delivery_count, self.expires_us), rest

    def sharing(self, expires_us: int) -> "MessageRun":
        """A run of the same rows with another expiry: the rows of one frame
        spanning queues of different TTLs share their columns."""
        return MessageRun(self.table, self.guids, self.seqs, self.sizes, self.delivery_count, expires_us)

    def take(self, rows: Sequence[int]) -> "MessageRun":
        return MessageRun(self.table.take(pa.array(rows, pa.int64())), [self.guids[i] for i in rows],
                          [self.seqs[i] for i in rows], [self.sizes[i] for i in rows],
                          self.delivery_count, self.expires_us)

    def messages(self) -> list[StoredMessage]:
        """One StoredMessage per row: where a run meets the per-message path
        (a consumer with a subscription, a drop, a peer without columnar PUSH)."""
        t = self.table
        return [StoredMessage(guid, seq, payload, None, put_time, self.delivery_count, self.expires_us,
                              compression, maps=(values, types) if values else None)
                for guid, seq, payload, values, types, put_time, compression in zip(
                    self.guids, self.seqs, *(t[c].to_pylist() for c in (
                        "payload", "properties", "property_types", "put_time_us", "compression")))]


class FrameRun(MessageRun):
    """The rows of one PUT frame spanning queues, delivered once (`take_fresh`):
    each row is held by its own queue's consumer as (run, row), all sharing
    the frame's columns. `made_us`: when the run was made, on the primary's
    clock. A consumer slow to confirm one row would keep the whole frame in
    memory; `QueueDispatcher.own_frames` gives rows held too long copies of
    their own."""

    __slots__ = ("made_us",)

    def __init__(self, table: pa.Table, guids: list[bytes], seqs: list[int], sizes: list[int],
                 delivery_count: int = 0, expires_us: int = 0, made_us: int = 0):
        super().__init__(table, guids, seqs, sizes, delivery_count, expires_us)
        self.made_us = made_us

    def sharing(self, expires_us: int) -> "FrameRun":
        return FrameRun(self.table, self.guids, self.seqs, self.sizes, self.delivery_count, expires_us, self.made_us)


class SharedPush:
    """First deliveries of rows of one PUT frame spanning queues to the sole
    consumers of many queues: row `rows[n]` of the frame to `keys[n]`, held
    there as (`runs[n]`, `rows[n]`). The runs are the frame's, one per
    expiry of its queues (`MessageRun.sharing`): one table, its rows as
    committed. One push where there would be one a queue (`take_fresh`),
    sent as PushColumns frames of rows taken from the table, with no
    Python object per row."""

    __slots__ = ("runs", "rows", "keys")
    delivery_count = 1

    def __init__(self, runs: "list[MessageRun]", rows: list[int], keys: "list[ConsumerKey]"):
        self.runs, self.rows, self.keys = runs, rows, keys

    def __len__(self) -> int:
        return len(self.rows)

    def __repr__(self) -> str:
        return f"SharedPush(rows={len(self)}, queues={len(set(self.keys))})"

    @property
    def table(self) -> pa.Table:
        """The frame's push columns (`MessageRun.table`), shared by its runs."""
        return self.runs[0].table

    @property
    def seq(self) -> int:
        """The first row's seq (pushes are merged across apps by it)."""
        return self.runs[0].seqs[self.rows[0]]

    def put_times_us(self) -> np.ndarray:
        """Each row's producer time (0: none given)."""
        return np.asarray(self.table["put_time_us"].take(pa.array(self.rows, pa.int64())).to_numpy(), np.int64)

    def messages(self, rows: Sequence[int]) -> list[StoredMessage]:
        """Rows of the frame as StoredMessages, as pushed (where a push meets
        the per-message path: a peer without columnar PUSH)."""
        return self.runs[0].take(rows).messages()


Pending = StoredMessage | MessageRun
# A consumer's unconfirmed message: a StoredMessage, or row i of a MessageRun
Held = StoredMessage | tuple[MessageRun, int]


class Confirmed(NamedTuple):
    guid: bytes
    seq: int


class ConfirmedRows(NamedTuple):
    """What one CONFIRM frame confirmed: GUIDs and their seqs, in order."""
    guids: list[bytes]
    seqs: list[int]


class Matcher(Protocol):
    """A consumer subscription: an `Expression`, or a pull link's `NotFrom`."""
    @property
    def text(self) -> str: ...

    def matches(self, properties: Mapping[str, object]) -> bool: ...


@dataclass(frozen=True)
class NotFrom:
    """A pull link's consumer (`OpenQueue.link`) takes nothing that has been
    through its own cluster (the `taproot.via` property): a message pulled
    from there, or pushed from there, stays here for the consumers here
    rather than go back and be dropped as a loop. `inner`: the consumer's
    own subscription, if any."""
    cluster: str
    inner: Matcher | None = None

    @property
    def text(self) -> str:
        return self.inner.text if self.inner is not None else ""

    def matches(self, properties: Mapping[str, object]) -> bool:
        via = properties.get(VIA)
        if isinstance(via, str) and self.cluster in via.split(","):
            return False
        return self.inner is None or self.inner.matches(properties)


@dataclass
class ConsumerOptions:
    max_unconfirmed_messages: int = MAX_UNCONFIRMED_MESSAGES
    max_unconfirmed_bytes: int = MAX_UNCONFIRMED_BYTES
    priority: int = 0
    subscriptions: Sequence[Matcher] = ()   # OR-combined; empty matches everything

    def matches(self, message: StoredMessage) -> bool:
        if not self.subscriptions:
            return True
        props = message.typed_properties
        return any(s.matches(props) for s in self.subscriptions)

    @property
    def paused(self) -> bool:
        return self.max_unconfirmed_messages <= 0 or self.max_unconfirmed_bytes <= 0


@dataclass
class _Consumer:
    key: ConsumerKey
    options: ConsumerOptions
    unconfirmed: HeldRows = field(default_factory=HeldRows)   # by seq, in push order
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

    def room_for(self, run: MessageRun) -> int:
        """How many of `run`'s first rows this consumer takes now, by the
        same rule as `has_capacity` checked before each row."""
        room = self.options.max_unconfirmed_messages - len(self.unconfirmed)
        limit = self.options.max_unconfirmed_bytes
        if room <= 0 or limit <= 0:
            return 0
        sizes = np.asarray(run.sizes[:room], np.int64)
        before = self.unconfirmed_bytes + np.cumsum(sizes) - sizes    # bytes held before each row
        fits = int(np.searchsorted(before, limit, side="left"))
        return max(fits, 1) if not self.unconfirmed else fits


Push = tuple[ConsumerKey, "Pending | SharedPush"]   # (None, SharedPush): `take_fresh`'s, of many consumers
Dropped = tuple[StoredMessage, str, str]      # message, reason, detail
_P = ParamSpec("_P")
_R = TypeVar("_R")


def _off_ledger(method: "Callable[Concatenate[QueueDispatcher, _P], _R]"
                ) -> "Callable[Concatenate[QueueDispatcher, _P], _R]":
    """A dispatcher method that works on its consumers' held rows: the rows
    a `Ledger` holds for it come back into its consumer first, and once the
    method is done the ledger learns whether it may hold rows again."""
    def wrapper(self: "QueueDispatcher", /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        if self._ledger is None:
            return method(self, *args, **kwargs)
        self._unplain()
        try:
            return method(self, *args, **kwargs)
        finally:
            self._sync_ledger()
    functools.update_wrapper(wrapper, method)
    return wrapper


class QueueDispatcher:
    sole_consumer_path = True   # off: every message through `_pick` (the tests' reference)

    def __init__(self, *, max_delivery_attempts: int = 0, clock: Callable[[], int] | None = None) -> None:
        self.max_delivery_attempts = max_delivery_attempts
        self._clock = clock                      # microseconds, for TTL; None: TTL never checked
        self._pending: deque[Pending] = deque()
        self._known: set[bytes] = set()          # guids pending or in flight
        self._consumers: dict[ConsumerKey, _Consumer] = {}
        self._rr: deque[ConsumerKey] = deque()   # round-robin order
        self._dropped: list[Dropped] = []
        # Counts for metrics (`primary.metrics`), kept under the partition's
        # lock like the rest: messages pushed (a redelivery counts again, in
        # `redelivered` too), confirmed, and dropped by reason.
        self._pushed = 0
        self.redelivered = 0
        self._confirmed = 0
        self.dropped: dict[str, int] = {}
        self.broadcasts = 0     # PUTs of a broadcast queue (never stored), whether anyone got them or not
        self.purged = 0         # messages an admin purged
        # Rows of frames spanning queues may be held in a partition's
        # `Ledger` instead, while this dispatcher is plain (`attach`).
        self._ledger: Ledger | None = None
        self._slot = -1
        self._plain = False                       # (the ledger's mirror: it may hold rows for us)
        self._plain_as: tuple[Any, ...] = ()      # the sole consumer and window it was told

    def attach(self, ledger: "Ledger", owner: Any) -> None:
        """Let `ledger` hold this dispatcher's rows of frames spanning
        queues while it is plain (`primary.ledger`); `owner` names them in
        its CONFIRMs."""
        self._ledger = ledger
        self._slot = ledger.register(self, owner)
        self._sync_ledger()

    def _sync_ledger(self) -> None:
        """Tell the ledger whether this dispatcher is plain now: a sole
        consumer without a subscription, nothing waiting, nothing held here."""
        ledger = self._ledger
        if ledger is None:
            return
        consumer = None if self._pending else self._sole_consumer()
        if consumer is not None and not consumer.unconfirmed:
            o = consumer.options
            plain_as = (consumer.key, o.max_unconfirmed_messages, o.max_unconfirmed_bytes)
            if not self._plain or plain_as != self._plain_as:
                ledger.set_plain(self._slot, *plain_as)
        elif self._plain:
            ledger.release([self._slot])

    def _unplain(self) -> None:
        """Before this dispatcher's consumer is worked on here: the rows the
        ledger holds for it into it, and the ledger told it holds none."""
        if self._plain:
            assert self._ledger is not None
            self._ledger.release([self._slot])

    def _take_held(self, entries: list[tuple[int, "tuple[MessageRun, int]"]], size: int) -> None:
        """Rows the ledger held for the sole consumer, in push order, after
        those it holds here (none: the ledger holds rows only while it
        holds none here)."""
        consumer = next(iter(self._consumers.values()))
        consumer.unconfirmed.update(entries)
        consumer.unconfirmed_bytes += size
        self._known.update(run.guids[row] for _, (run, row) in entries)

    # -- inspection ---------------------------------------------------------
    @property
    def pending_count(self) -> int:
        return sum(len(p) if isinstance(p, MessageRun) else 1 for p in self._pending)

    @property
    def pushed(self) -> int:
        """Messages pushed (a redelivery counts again, in `redelivered` too)."""
        return self._pushed + (int(self._ledger.pushed[self._slot]) if self._ledger is not None else 0)

    @property
    def confirmed(self) -> int:
        return self._confirmed + (int(self._ledger.confirmed[self._slot]) if self._ledger is not None else 0)

    @property
    def unconfirmed_count(self) -> int:
        return sum(len(c.unconfirmed) for c in self._consumers.values()) + self._held_in_ledger()[0]

    def _held_in_ledger(self) -> tuple[int, int]:
        """Rows and bytes the ledger holds for the sole consumer."""
        return self._ledger.held(self._slot) if self._plain and self._ledger is not None else (0, 0)

    def consumer_keys(self) -> list[ConsumerKey]:
        return list(self._consumers)

    def unconfirmed_of(self, key: ConsumerKey) -> list[int]:
        """The seqs `key` holds unconfirmed, in push order."""
        if self._plain and self._ledger is not None:   # (held there or here, never both)
            return list(self._consumers[key].unconfirmed) or self._ledger.seqs_of(self._slot)
        return list(self._consumers[key].unconfirmed)

    def consumers_info(self) -> list[dict[str, object]]:
        """Each consumer as the admin API shows it, in round-robin order."""
        out: list[dict[str, object]] = []
        ledger_rows, ledger_bytes = self._held_in_ledger()   # (plain: the sole consumer's)
        for key in self._rr:
            c = self._consumers[key]
            o = c.options
            out.append({"key": key, "priority": o.priority, "paused": o.paused,
                        "subscriptions": [s.text for s in o.subscriptions],
                        "max_unconfirmed_messages": o.max_unconfirmed_messages,
                        "max_unconfirmed_bytes": o.max_unconfirmed_bytes,
                        "unconfirmed_messages": len(c.unconfirmed) + ledger_rows,
                        "unconfirmed_bytes": c.unconfirmed_bytes + ledger_bytes})
        return out

    def oldest_pending(self) -> StoredMessage | None:
        """The message that has waited longest for a consumer, or None."""
        if not self._pending:
            return None
        first = self._pending[0]
        return first.messages()[0] if isinstance(first, MessageRun) else first

    @_off_ledger
    def purge(self) -> "ConfirmedRows":
        """Drop every message waiting or pushed and not confirmed (an admin's
        purge): they are returned as confirmed rows, for the confirm log that
        keeps them finished across a restart. A consumer's later CONFIRM of
        one is ignored, as any CONFIRM of a seq it does not hold."""
        done = ConfirmedRows([], [])
        for pending in self._pending:
            for m in pending.messages() if isinstance(pending, MessageRun) else [pending]:
                done.guids.append(m.guid)
                done.seqs.append(m.seq)
        self._pending.clear()
        for consumer in self._consumers.values():
            for seq, held in consumer.unconfirmed.items():
                done.guids.append(held[0].guids[held[1]] if isinstance(held, tuple) else held.guid)
                done.seqs.append(seq)
            consumer.unconfirmed.clear()
            consumer.unconfirmed_bytes = 0
        self._known.clear()
        self.purged += len(done.seqs)
        return done

    @property
    def has_dropped(self) -> bool:
        """Messages were dropped since the last `take_dropped`."""
        return bool(self._dropped)

    def take_dropped(self) -> list[Dropped]:
        """Messages dropped since the last call (poison pills, expired)."""
        dropped, self._dropped = self._dropped, []
        return dropped

    # -- events -------------------------------------------------------------
    @_off_ledger
    def add_messages(self, messages: Iterable[Pending]) -> list[Push]:
        """Messages (or runs of them) in PUT order."""
        for message in messages:
            if isinstance(message, MessageRun):
                if self._known.isdisjoint(message.guids):
                    self._known.update(message.guids)
                    self._pending.append(message)
                    continue
                self.add_messages(message.messages())   # some already known: row by row
                continue
            if message.guid in self._known:
                continue  # already pending or in flight: the log holds each GUID once
            self._known.add(message.guid)
            self._pending.append(message)
        return self._dispatch()

    @_off_ledger
    def add_consumer(self, key: ConsumerKey, options: ConsumerOptions) -> list[Push]:
        assert key not in self._consumers, f"consumer {key!r} added twice"
        self._consumers[key] = _Consumer(key, options)
        self._rr.append(key)
        return self._dispatch()

    @_off_ledger
    def configure_consumer(self, key: ConsumerKey, options: ConsumerOptions) -> list[Push]:
        self._consumers[key].options = options
        return self._dispatch()

    @_off_ledger
    def remove_consumer(self, key: ConsumerKey) -> list[Push]:
        consumer = self._consumers.pop(key, None)
        if consumer is None:
            return []
        self._rr.remove(key)
        # Back to the front, oldest first, so redelivery keeps PUT order. A
        # message out of delivery attempts is dropped now, not when a consumer
        # next has room: the dead-letter table shows it at once.
        for message in reversed(_regrouped(consumer.unconfirmed.values())):
            if self.max_delivery_attempts and message.delivery_count >= self.max_delivery_attempts:
                for m in reversed(message.messages()) if isinstance(message, MessageRun) else [message]:
                    self._drop(m, REASON_ATTEMPTS, f"pushed {m.delivery_count} times, never confirmed")
            else:
                self._pending.appendleft(message)
        return self._dispatch()

    def confirm(self, key: ConsumerKey, seq: int, guid: bytes | None = None) -> tuple[Confirmed | None, list[Push]]:
        """Returns the confirmed message (None if unknown or not held by `key`)."""
        confirmed, pushes = self.confirm_many(key, [seq], None if guid is None else [guid])
        return (Confirmed(confirmed.guids[0], seq) if confirmed.seqs else None), pushes

    @_off_ledger
    def confirm_many(self, key: ConsumerKey, seqs: Iterable[int], guids: Sequence[bytes] | None = None,
                     into: "ConfirmedRows | None" = None) -> tuple["ConfirmedRows", list[Push]]:
        """Confirm a CONFIRM frame's seqs for `key` at once, then dispatch once:
        the messages confirmed (seqs `key` does not hold are skipped, and so
        is a seq whose GUID, when `guids` names one, is not the held one) and
        what the room they free lets through. With `into` the confirmed rows
        are appended to it (a frame's queues into one list) and it is returned."""
        confirmed = ConfirmedRows([], []) if into is None else into
        consumer = self._consumers.get(key)
        if consumer is None:
            return confirmed, []
        done, done_seqs = confirmed.guids, confirmed.seqs
        before = len(done_seqs)
        unconfirmed, known = consumer.unconfirmed, self._known
        freed = 0
        for n, seq in enumerate(seqs):
            held = unconfirmed.pop(seq, None) if guids is None else unconfirmed.get(seq)
            if held is None:
                continue
            if isinstance(held, tuple):
                run, i = held
                guid = run.guids[i]
                size = run.sizes[i]
            else:
                guid, size = held.guid, held.size
            if guids is not None:
                if guids[n] and guids[n] != guid:
                    continue   # not the message held for this seq: it stays held
                unconfirmed.pop(seq)
            known.discard(guid)
            done.append(guid)
            done_seqs.append(seq)
            freed += size
        consumer.unconfirmed_bytes -= freed
        self._confirmed += len(done_seqs) - before
        return confirmed, (self._dispatch() if len(done_seqs) > before and self._pending else [])

    def own_frames(self, made_before_us: int) -> int:
        """Rows held unconfirmed as rows of a frame spanning queues
        (`FrameRun`) made before `made_before_us` become StoredMessages of
        their own (one take a frame), in place, with their delivery state:
        the frame's other rows were confirmed long ago, and a consumer
        that confirms slowly would keep each frame it holds a row of in
        memory (about a MiB a frame of 1,000 1 KiB rows). Returns how many."""
        owned = 0
        for consumer in self._consumers.values():
            stale: dict[int, tuple[FrameRun, list[int], list[int]]] = {}   # id(run) -> run, rows, seqs
            for seq, held in consumer.unconfirmed.items():
                if isinstance(held, tuple) and isinstance(held[0], FrameRun):
                    if held[0].made_us >= made_before_us:
                        break   # (a frame's rows are pushed as it is made: the rest held are younger)
                    entry = stale.get(id(held[0]))
                    if entry is None:
                        entry = stale[id(held[0])] = (held[0], [], [])
                    entry[1].append(held[1])
                    entry[2].append(seq)
            for run, rows, seqs in stale.values():
                for seq, message in zip(seqs, run.take(rows).messages()):
                    consumer.unconfirmed[seq] = message   # (the same place in push order)
                owned += len(rows)
        return owned

    @_off_ledger
    def dispatch(self) -> list[Push]:
        """What the room consumers have lets through now (after
        `confirm_ranges`)."""
        return self._dispatch()

    def expire(self) -> None:
        """Drop pending messages whose TTL has passed (a periodic sweep: a queue
        with no consumer never dispatches)."""
        if self._clock is None or not self._pending:
            return
        now = self._clock()
        kept: deque[Pending] = deque()
        for message in self._pending:
            if message.expires_us and message.expires_us <= now:
                self._drop_all(message, REASON_TTL, "expired before it was pushed")
            else:
                kept.append(message)
        self._pending = kept

    def broadcast(self, message: StoredMessage) -> list[Push]:
        """Broadcast mode: every highest-priority matching consumer that is not
        paused gets the message now; nothing is kept (at-most-once)."""
        self.broadcasts += 1
        candidates = [c for c in self._consumers.values()
                      if not c.options.paused and c.options.matches(message)]
        if not candidates:
            return []
        top = max(c.options.priority for c in candidates)
        pushes: list[Push] = [(c.key, message) for c in candidates if c.options.priority == top]
        self._pushed += len(pushes)
        return pushes

    def broadcast_run(self, run: MessageRun) -> list[Push]:
        """`broadcast` for a frame: the same targets for every row (the run
        itself to each), unless a consumer has a subscription (row by row)."""
        if any(c.options.subscriptions for c in self._consumers.values()):
            return [push for message in run.messages() for push in self.broadcast(message)]
        self.broadcasts += len(run)
        candidates = [c for c in self._consumers.values() if not c.options.paused]
        if not candidates:
            return []
        top = max(c.options.priority for c in candidates)
        pushes: list[Push] = [(c.key, run) for c in candidates if c.options.priority == top]
        self._pushed += len(pushes) * len(run)
        return pushes

    # -- routing ------------------------------------------------------------
    def _drop(self, message: StoredMessage, reason: str, detail: str) -> None:
        self._known.discard(message.guid)
        self._dropped.append((message, reason, detail))
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def _drop_all(self, message: Pending, reason: str, detail: str) -> None:
        for m in message.messages() if isinstance(message, MessageRun) else [message]:
            self._drop(m, reason, detail)

    def _pick(self, message: Pending) -> _Consumer | None:
        """The consumer for `message`, or None: nobody matches, or every
        matching consumer of the top priority is at capacity."""
        top = None
        for consumer in self._consumers.values():
            if _matches(consumer.options, message) and (top is None or consumer.options.priority > top):
                top = consumer.options.priority
        if top is None:
            return None
        for _ in range(len(self._rr)):
            key = self._rr[0]
            self._rr.rotate(-1)
            consumer = self._consumers[key]
            if consumer.options.priority == top and consumer.has_capacity() and _matches(consumer.options, message):
                return consumer
        return None

    def _sole_consumer(self) -> "_Consumer | None":
        """The consumer `_dispatch` gives every message to while it has room:
        the only one, without a subscription. None otherwise."""
        if not self.sole_consumer_path or len(self._consumers) != 1:
            return None
        consumer = next(iter(self._consumers.values()))
        return None if consumer.options.subscriptions else consumer

    def _takers(self) -> int:
        """How many consumers of the top priority have room. A run goes whole
        only to a sole taker: it is what round robin, message by message,
        would give it (and it leaves the rotation as those picks would)."""
        top = max(c.options.priority for c in self._consumers.values())
        return sum(1 for c in self._consumers.values() if c.options.priority == top and c.has_capacity())

    def _dispatch(self) -> list[Push]:
        pushes: list[Push] = []
        if not self._pending or not self._consumers:
            return pushes
        filtering = any(c.options.subscriptions for c in self._consumers.values())
        now = self._clock() if self._clock is not None else 0
        skipped: list[Pending] = []
        # A sole consumer without a subscription (a queue's usual state) takes
        # every message while it has room: what `_pick` and `_takers` would
        # decide, without asking them per message.
        sole = self._sole_consumer()
        while self._pending:
            if not (sole.has_capacity() if sole is not None
                    else any(c.has_capacity() for c in self._consumers.values())):
                break
            message = self._pending.popleft()
            if isinstance(message, MessageRun) and sole is None and (filtering or self._takers() > 1):
                # Subscriptions look at each message, and round robin between
                # consumers alternates per message: row by row then.
                self._pending.extendleft(reversed(message.messages()))
                continue
            if now and message.expires_us and message.expires_us <= now:
                self._drop_all(message, REASON_TTL, "expired before it was pushed")
                continue
            if self.max_delivery_attempts and message.delivery_count >= self.max_delivery_attempts:
                self._drop_all(message, REASON_ATTEMPTS, f"pushed {message.delivery_count} times, never confirmed")
                continue
            consumer = sole if sole is not None else self._pick(message)
            if consumer is None:
                skipped.append(message)
                if not filtering:
                    break  # every consumer matches, so every top one is at capacity
                continue
            if isinstance(message, MessageRun):
                message, rest = message.head(consumer.room_for(message))
                if rest is not None:
                    self._pending.appendleft(rest)
                message.delivery_count += 1
                if type(message) is MessageRun:
                    consumer.unconfirmed.add_run(message)
                else:   # (a frame's rows are held one by one: `own_frames` takes them apart)
                    consumer.unconfirmed.update(zip(message.seqs, ((message, i) for i in range(len(message)))))
                consumer.unconfirmed_bytes += message.size
                rows = len(message)
            else:
                message.delivery_count += 1
                consumer.unconfirmed[message.seq] = message
                consumer.unconfirmed_bytes += message.size
                rows = 1
            self._pushed += rows
            if message.delivery_count > 1:
                self.redelivered += rows
            pushes.append((consumer.key, message))
        # Messages nobody could take stay in front, in their order.
        self._pending.extendleft(reversed(skipped))
        return pushes


def _matches(options: ConsumerOptions, message: Pending) -> bool:
    """A run reaches `_pick` only when no consumer has a subscription."""
    return isinstance(message, MessageRun) or options.matches(message)


def _regrouped(held: Iterable[Held]) -> list[Pending]:
    """A consumer's unconfirmed messages in order, rows of one run back
    together as one run (those left of it: some rows were confirmed), each
    with delivery state of its own: a run's rows may be held by several
    consumers (the apps of a frame, or the queues of one spanning queues)."""
    out: list[Pending] = []
    run: MessageRun | None = None
    rows: list[int] = []
    for item in held:
        if isinstance(item, tuple) and item[0] is run:
            rows.append(item[1])
            continue
        if run is not None:
            out.append(run.for_app() if len(rows) == len(run) else run.take(rows))
            run, rows = None, []
        if isinstance(item, tuple):
            run, rows = item[0], [item[1]]
        else:
            out.append(item)
    if run is not None:
        out.append(run.for_app() if len(rows) == len(run) else run.take(rows))
    return out


def confirm_ranges(dispatchers: Sequence["QueueDispatcher | None"], keys: Sequence[ConsumerKey],
                   starts: Sequence[Sequence[int]], counts: Sequence[Sequence[int]], into: ConfirmedRows
                   ) -> tuple[list[int], list["QueueDispatcher"]]:
    """A CONFIRM frame's seq ranges of many queues confirmed in one pass, not
    a call per queue: entry n is ranges of consumer `keys[n]` of
    `dispatchers[n]` (None: no consumer ever came), seqs `starts[n][i]` ..
    `starts[n][i] + counts[n][i] - 1`, confirmed as `confirm_many` confirms
    them (a seq the consumer does not hold is skipped), the rows appended
    to `into`. Returns how many each entry confirmed, and the dispatchers whose freed room may let waiting
    messages through, in the order first confirmed: the caller dispatches
    each once (`dispatch`), as `confirm_many` does after a frame's seqs
    (a queue confirmed by two of its consumers in one frame, two queue ids
    of one link, is dispatched once after both)."""
    done, done_seqs = into.guids, into.seqs
    confirmed: list[int] = []
    freed: dict[QueueDispatcher, None] = {}
    for dispatcher, key, start, count in zip(dispatchers, keys, starts, counts):
        consumer = None if dispatcher is None else dispatcher._consumers.get(key)
        if dispatcher is None or consumer is None:
            confirmed.append(0)
            continue
        dispatcher._unplain()   # (its rows may be in the ledger: `Ledger.confirm_slots` is their way)
        unconfirmed, known = consumer.unconfirmed, dispatcher._known
        before = len(done_seqs)
        size = 0
        for first, many in zip(start, count):
            guids, seqs, taken_bytes = unconfirmed.take_range(first, many)
            if seqs:
                known.difference_update(guids)
                done += guids
                done_seqs += seqs
                size += taken_bytes
        n = len(done_seqs) - before
        confirmed.append(n)
        if n:
            consumer.unconfirmed_bytes -= size
            dispatcher._confirmed += n
            if dispatcher._pending:
                freed[dispatcher] = None   # (`dispatch` tells the ledger)
            elif not unconfirmed:
                dispatcher._sync_ledger()
    return confirmed, list(freed)


def take_fresh(dispatchers: Sequence[QueueDispatcher], runs: Sequence[MessageRun], rows: Sequence[int],
               now_us: int, spilled: set[QueueDispatcher]) -> tuple[list[int], list[ConsumerKey], list[int]]:
    """New messages of many queues dispatched in one pass rather than a call
    per queue: row `rows[n]` of `runs[n]` (the runs of one frame spanning
    queues, delivered once, none of it pushed yet) for `dispatchers[n]`,
    each queue's rows in seq order. A row goes to its queue's sole consumer
    at once, held there as (run, row) with no StoredMessage, when
    `add_messages` would do exactly that (the queue in its usual state:
    nothing waiting, `_sole_consumer`; the consumer with room; its GUID not
    held; not expired). Returns the positions taken and their consumers,
    and the positions spilled, in order: the caller hands those to
    `add_messages` (`spilled_messages`). Once a dispatcher spills, its later
    rows spill too (they queue behind), in this call and in later ones
    given the same `spilled`."""
    taken: list[int] = []
    keys: list[ConsumerKey] = []
    rest: list[int] = []
    sole: dict[QueueDispatcher, _Consumer | None] = {}
    for n, (dispatcher, run, row) in enumerate(zip(dispatchers, runs, rows)):
        consumer = sole.get(dispatcher, _UNSEEN)
        if consumer is _UNSEEN:
            dispatcher._unplain()   # (its rows go into its consumer here: none may stay in the ledger)
            consumer = sole[dispatcher] = (None if dispatcher in spilled or dispatcher._pending
                                           else dispatcher._sole_consumer())
        if consumer is not None:
            guid = run.guids[row]
            known = dispatcher._known
            if guid not in known and consumer.has_capacity() and not (
                    run.expires_us and run.expires_us <= now_us):
                known.add(guid)
                consumer.unconfirmed[run.seqs[row]] = (run, row)
                consumer.unconfirmed_bytes += run.sizes[row]
                dispatcher._pushed += 1
                taken.append(n)
                keys.append(consumer.key)
                continue
            sole[dispatcher] = None
        spilled.add(dispatcher)
        rest.append(n)
    return taken, keys, rest


def spilled_messages(runs: Sequence[MessageRun], rows: Sequence[int], positions: Sequence[int]
                     ) -> list[StoredMessage]:
    """The rows at `positions` (`take_fresh`'s spilled) as StoredMessages for
    `add_messages`, not pushed yet: one take of each run's rows, not one a row."""
    of_run: dict[int, tuple[MessageRun, list[int], list[int]]] = {}
    for at, n in enumerate(positions):
        run = runs[n]
        entry = of_run.get(id(run))
        if entry is None:
            entry = of_run[id(run)] = (run, [], [])
        entry[1].append(rows[n])
        entry[2].append(at)
    out: list[StoredMessage] = [cast(StoredMessage, None)] * len(positions)
    for run, run_rows, ats in of_run.values():
        some = run.take(run_rows)
        some.delivery_count = 0
        for at, message in zip(ats, some.messages()):
            out[at] = message
    return out


_UNSEEN: Any = object()
