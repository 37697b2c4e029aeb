"""The retransmission buffer: PUTs sent and not ACKed yet, kept to be sent
again after a failover (BlazingMQ's SDK and every relaying hop keep one).

One implementation for the SDK (`taproot.core`) and every forwarding hop
(`replicas.relay`). Entries stay in PUT order (resending in that order keeps a
producer's order across a failover), under a key the owner chooses (a GUID, or
a columnar frame's GUIDs). The buffer is bounded three ways
(`RetransmissionLimits`): by messages and bytes (`refusal` says whether one
more entry fits; the owner decides whether to refuse it or to wait) and by
time (`expire` hands back the entries held past their deadline, for the owner
to answer TIMEOUT). The time bound must not exceed the receiving domain's
dedup history window: a resend after that could be delivered twice.

What is held but not sent on the current stream (the stream is new, or the
queue is not open on it yet) is deferred by queue: each queue's (re)open
takes its own entries in PUT order (`take_deferred`), with no scan of the
whole buffer per queue. `put_frames` packs them into frames. An entry of
several queues (a PUT frame spanning queues) is deferred to each of them and
goes once all are open; until then it holds back the later entries of each
(`blocked`): every queue's PUTs keep their order.

Pure: no clock (times come in as `now_ms`), no threads, no I/O.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from dataclasses import dataclass
from typing import Callable, Generic, Hashable, Iterable, Iterator, Sequence, TypeVar

from protocol import taproot_pb2 as pb
from protocol.codes import ResultCode
from protocol.frames import wrapped
from protocol.limits import DEDUP_HISTORY_WINDOW_MS

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class RetransmissionLimits:
    """How much a retransmission buffer may hold. The SDK's `Session` and the
    cluster's `[ha]` settings (`retransmission_max_messages`,
    `retransmission_max_bytes`, `retransmission_timeout_ms`) take their
    defaults from here."""
    max_messages: int = 1_000_000
    max_bytes: int = 1 << 30
    timeout_ms: int = DEDUP_HISTORY_WINDOW_MS  # <= every domain's dedup_history_window_ms

    def __post_init__(self) -> None:
        if self.max_messages < 1 or self.max_bytes < 1 or self.timeout_ms < 1:
            raise ValueError(f"retransmission limits must be >= 1, got {self}")


@dataclass
class Held(Generic[T]):
    item: T                 # what the owner needs to resend and answer it
    nbytes: int
    count: int              # messages (a columnar frame holds many)
    since_ms: float
    deadline_ms: float

    @property
    def timeout_ms(self) -> float:
        return self.deadline_ms - self.since_ms


class RetransmissionBuffer(Generic[K, T]):
    """Entries in arrival order, counted by messages and bytes."""

    def __init__(self, limits: RetransmissionLimits | None = None):
        self.limits = limits or RetransmissionLimits()
        self._entries: "OrderedDict[K, Held[T]]" = OrderedDict()
        self._timeouts: Counter[float] = Counter()  # the held entries' time bounds (expire's shortest)
        self._deferred: dict[Hashable, deque[K]] = {}  # queue -> keys held but not sent on this stream
        self._spanning: dict[K, tuple[Hashable, ...]] = {}   # deferred entries of several queues -> those queues
        self._gone: set[K] = set()      # entries of several queues, one of them forgotten: never sent
        self.messages = 0
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def refusal(self, nbytes: int, count: int = 1) -> tuple[ResultCode, str] | None:
        """Why `count` more messages of `nbytes` would not fit, or None."""
        if self.messages + count > self.limits.max_messages:
            return ResultCode.LIMIT_MESSAGES, (f"retransmission buffer holds {self.messages} PUTs "
                                               f"(max {self.limits.max_messages})")
        if self.nbytes + nbytes > self.limits.max_bytes:
            return ResultCode.LIMIT_BYTES, (f"retransmission buffer holds {self.nbytes} bytes "
                                            f"(max {self.limits.max_bytes})")
        return None

    @property
    def full(self) -> bool:
        """At or past a count or bytes bound (a producer that may wait, waits)."""
        return self.messages >= self.limits.max_messages or self.nbytes >= self.limits.max_bytes

    def hold(self, key: K, item: T, nbytes: int, count: int, now_ms: float,
             timeout_ms: float | None = None) -> None:
        """Keep `item` until `release(key)`. The same key again (a resent PUT)
        replaces the earlier entry: one copy, at the end."""
        self.release(key)
        timeout = self.limits.timeout_ms if timeout_ms is None else min(timeout_ms, self.limits.timeout_ms)
        self._entries[key] = Held(item, nbytes, count, now_ms, now_ms + timeout)
        self._timeouts[timeout] += 1
        self.nbytes += nbytes
        self.messages += count

    def peek(self, key: K) -> Held[T] | None:
        """The entry of `key`, left held."""
        return self._entries.get(key)

    def release(self, key: K) -> Held[T] | None:
        """The entry of `key` (its ACK came), or None if it is not held."""
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._forget(entry)
        return entry

    def _forget(self, entry: Held[T]) -> None:
        self.nbytes -= entry.nbytes
        self.messages -= entry.count
        timeout = entry.timeout_ms
        self._timeouts[timeout] -= 1
        if self._timeouts[timeout] <= 0:
            del self._timeouts[timeout]

    def defer(self, group: Hashable, key: K) -> None:
        """`key`, held, was not sent: it goes when `group` (its queue) opens."""
        self._deferred.setdefault(group, deque()).append(key)

    def defer_many(self, groups: Sequence[Hashable], key: K) -> None:
        """`key` (an entry of several queues), held, was not sent: it goes
        when every one of `groups` is open, after what each deferred before it."""
        groups = tuple(dict.fromkeys(groups))
        if len(groups) == 1:
            return self.defer(groups[0], key)
        self._spanning[key] = groups
        for group in groups:
            self._deferred.setdefault(group, deque()).append(key)

    def defer_all(self, group_of: Callable[[K, Held[T]], Hashable | Sequence[Hashable]]) -> None:
        """A new stream, on which nothing held was sent: every entry deferred
        to its group (a list: to each of those groups), in one pass, in PUT order."""
        self._deferred, self._spanning, self._gone = {}, {}, set()
        for key, entry in self._entries.items():
            group = group_of(key, entry)
            if isinstance(group, list):
                self.defer_many(group, key)
            else:
                self._deferred.setdefault(group, deque()).append(key)

    def blocked(self, group: Hashable) -> bool:
        """`group` still has entries deferred (held back behind an entry of
        several queues): a new entry of it must wait behind them too."""
        keys = self._deferred.get(group)
        return keys is not None and self._head(keys) is not None

    def _head(self, keys: "deque[K]") -> K | None:
        """The first key of a group's deferred entries still to be sent
        (those answered meanwhile, or never to be sent, dropped)."""
        while keys:
            key = keys[0]
            if key in self._entries and key not in self._gone:
                return key
            keys.popleft()
        return None

    def take_deferred(self, group: Hashable, is_open: Callable[[Hashable], bool] | None = None) -> list[Held[T]]:
        """`group` is open: its entries not sent yet, in PUT order (those
        answered meanwhile skipped); they count as sent from now on. An entry
        of several queues goes only once every one is open (`is_open`) and it
        is first in each of them; then the entries each of those held back go
        too. Per queue the order is PUT order."""
        entries = self._entries
        if not self._spanning and not self._gone:
            return [entry for entry in (entries.get(key) for key in self._deferred.pop(group, ())) if entry is not None]
        out: list[Held[T]] = []
        work = [group]
        while work:
            g = work.pop()
            keys = self._deferred.get(g)
            while keys and (key := self._head(keys)) is not None:
                groups = self._spanning.get(key)
                if groups is not None:
                    others = [h for h in groups if h != g]
                    if not all(is_open is not None and is_open(h) for h in others) or any(
                            self._head(self._deferred[h]) != key for h in others):
                        break   # waits for another queue, or behind that queue's earlier entries
                    del self._spanning[key]
                    for h in others:
                        self._deferred[h].popleft()
                        work.append(h)   # what it held back there may go now
                keys.popleft()
                out.append(entries[key])
            if keys is not None and not keys:
                del self._deferred[g]
        return out

    def forget_deferred(self, group: Hashable) -> list[K]:
        """`group` is gone: nothing of it is to be sent (nor an entry it
        shares with other queues: it no longer holds theirs back). Returns
        the keys it had deferred that are still held (the owner answers them)."""
        keys = self._deferred.pop(group, ())
        for key in keys:
            if self._spanning.pop(key, None) is not None:
                self._gone.add(key)
        return [key for key in keys if key in self._entries]

    def items(self) -> Iterator[tuple[K, Held[T]]]:
        """Every entry, oldest first (what a resend goes through)."""
        return iter(list(self._entries.items()))

    def expire(self, now_ms: float) -> list[tuple[K, Held[T]]]:
        """Remove and return the entries past their deadline. Entries are in
        arrival order, so the scan stops at the first one too young for even
        the shortest time bound held."""
        shortest = min(self._timeouts, default=self.limits.timeout_ms)
        expired = []
        for key, entry in self._entries.items():
            if entry.since_ms > now_ms - shortest:
                break
            if entry.deadline_ms <= now_ms:
                expired.append(key)
        return [(key, self._pop(key)) for key in expired]

    def _pop(self, key: K) -> Held[T]:
        entry = self._entries.pop(key)
        self._forget(entry)
        return entry

    def clear(self) -> list[tuple[K, Held[T]]]:
        """Remove and return every entry (a session that ends answers them all)."""
        entries = list(self._entries.items())
        self._entries.clear()
        self._timeouts.clear()
        self._deferred.clear()
        self._spanning.clear()
        self._gone.clear()
        self.messages = self.nbytes = 0
        return entries


def put_frames(puts: Iterable[pb.PutMessage | pb.PutColumns], max_messages: int) -> list[pb.Frame]:
    """Buffered PUTs as frames to resend, in order: runs of at most
    `max_messages` single PUTs as PutBatch frames, each columnar frame as it was."""
    frames: list[pb.Frame] = []
    singles: list[pb.PutMessage] = []
    for put in puts:
        if isinstance(put, pb.PutColumns):
            if singles:
                frames.append(pb.Frame(put=pb.PutBatch(messages=singles)))
                singles = []
            frames.append(wrapped("put_columns", put))
            continue
        singles.append(put)
        if len(singles) >= max_messages:
            frames.append(pb.Frame(put=pb.PutBatch(messages=singles)))
            singles = []
    if singles:
        frames.append(pb.Frame(put=pb.PutBatch(messages=singles)))
    return frames
