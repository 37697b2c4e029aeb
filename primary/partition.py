"""One storage partition on its primary: the PUT and confirm logs (delta-rs
writers), the queues mapped to it, the express lane, and the tail of its
delivery log.

Data path: a PUT group is committed to the PUT log, ACKed, and then routed at
once by the express lane (`express.py`: the partition's GUID history and the
domains' app subscriptions). The pipeline, the authority, later writes its
own decision for each row to the delivery log; the tailer reconciles the two
(pushes what only the pipeline kept, records every disagreement) and, for
`delivery = "pipeline"` domains, pushes only then. The delivery log holds no
payload: messages are read from the PUT log by seq when needed.

Threads: one group-commit thread for PUTs, one for CONFIRMs, one tailer for
the delivery log, and one compactor per owned table (`compaction.py`).
Routing state (`QueueState.dispatcher`) is guarded by `Partition.lock`; the
express decisions by `Partition._decisions_lock`, which the PUT commit holds
from before its Delta commit until its decisions are recorded, so the tailer
never sees a delivery row before the express decision for it. Links are only
ever written through `Link.send`, which is thread safe.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import json
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence, TypeVar, cast, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

import conf
from conf import ClusterConfig, DomainConfig
from primary.compaction import Compactor
from primary.dispatcher import (
    ConfirmedRows,
    ConsumerKey,
    ConsumerOptions,
    Dropped,
    FrameRun,
    MessageRun,
    Pending,
    Push,
    QueueDispatcher,
    SharedPush,
    StoredMessage,
    confirm_ranges,
    spilled_messages,
)
from primary.express import AppRules, Disagreement, GuidHistory, Reconciler
from primary.group_commit import GroupCommitter, GroupPolicy
from primary.ledger import Ledger, take_fresh_held
from primary.metrics import NodeMetrics
from primary.quota import DomainQuota
from protocol import ResultCode, pb, wire
from protocol.clock import wall_time_us
from protocol.codes import COMPRESSION_CODES, COMPRESSION_NAMES
from protocol.columns import (
    PUT_TIME,
    ack_columns,
    encode_push_run,
    encode_push_table,
    joined_values,
    push_run_table,
    push_table,
)
from protocol.frames import frame_of
from protocol.properties import wire_to_maps
from protocol.seqs import ranges as seq_ranges
from protocol.uri import QueueUri
from storage import deltars, tables
from storage.leases import Fenced

if TYPE_CHECKING:
    from primary.links import LinkForwarder, PullLinks
    from protocol.stream import Link

log = logging.getLogger(__name__)
Targets = dict[tuple["QueueState", str], list[Pending]]   # (queue, app) -> what to push
PUSH_FRAME_MESSAGES_MAX = 1000
SIDE_LOG_RETRIES_S = (0.1, 0.5, 2.0)   # pauses before retrying a failed confirm / dead-letter commit
COLUMNAR_RUN_MIN = 8   # fewer rows of one queue are decided and pushed one by one: a columnar run costs ~40 µs
# A frame spanning queues is held as its rows (`_Fresh`) from this many rows:
# making its run costs ~100 µs, and a spilled row's StoredMessage is taken
# from it (~170 µs a frame); a smaller frame's rows go the per-queue way.
FRESH_RUN_ROWS = 64
SPAN_NUMPY_MIN = 32   # a PUSH frame's rows of many queues from this many: their seq ranges found with numpy
TTL_SWEEP_INTERVAL_S = 0.5
FRAME_HOLD_S = 5.0   # a frame's rows held unconfirmed this long get copies of their own (`own_frames`)
# How often the tail trims the delivery log to its retention (`_trim_delivery_log`):
# a listing of the log each time, so not on every poll.
DELIVERY_TRIM_INTERVAL_S = 60.0
ROUTE_CHUNK_ROWS = 20_000  # delivery rows routed per hold of the partition lock
DISAGREEMENTS_LOGGED_MAX = 20  # log lines per delivery poll; the table has every one
MESSAGE_COLUMNS = ["domain", "queue", "guid", "seq", "payload", "properties", "property_types", "producer_time",
                   "put_time", "compression"]
DELIVERY_COLUMNS = ["domain", "queue", "guid", "seq", "apps"]
Q = TypeVar("Q")
_NONE: Any = object()   # (`queue_runs`: before the first row)


@dataclass(eq=False)  # identity: used as a dict key
class QueueState:
    """One queue on its primary: a dispatcher per app ("" outside fanout), the
    open handle counts for max_consumers / max_producers, and the domain's quota."""
    uri: QueueUri
    domain: DomainConfig
    quota: DomainQuota | None = None
    dispatchers: dict[str, QueueDispatcher] = field(default_factory=dict)
    consumers: int = 0
    producers: int = 0
    puts: int = 0          # messages committed (the commit thread counts them)
    index: int = -1        # its partition's number for it (`Partition._queue_names`); -1: made elsewhere
    ledger: Ledger | None = None   # the partition's: each dispatcher's rows of frames spanning queues, while plain
    _rules: tuple[DomainConfig, AppRules] | None = None
    _fresh: "tuple[Any, ...] | None" = field(default=None, repr=False)   # (`fresh_profile`)

    def fresh_profile(self) -> "tuple[bool, bool, tuple[str, ...], int, bool, tuple[QueueState, str], int]":
        """What the express lane asks of this queue for each run of a frame
        (`Partition._express_runs`): whether it is express, whether its
        apps have subscriptions, its apps, its messages' TTL, whether it is
        lean (one app, no quota), its target (queue, first app) and that
        app's dispatcher's ledger slot (-1: no dispatcher yet). Made once
        per domain configuration and quota, and again once the dispatcher
        exists. Read without the partition's lock: it creates nothing."""
        cached = self._fresh
        if cached is None or cached[0] is not self.domain or cached[1] is not self.quota or cached[2][6] < 0:
            rules = self.rules
            apps = rules.apps
            app = apps[0] if apps else ""
            dispatcher = self.dispatchers.get(app)
            cached = self._fresh = (self.domain, self.quota, (
                self.express, rules.filtered, apps, self.domain.message_ttl_ms,
                len(apps) == 1 and self.quota is None, (self, app), -1 if dispatcher is None else dispatcher._slot))
        profile: tuple[bool, bool, tuple[str, ...], int, bool, tuple[QueueState, str], int] = cached[2]
        return profile

    @property
    def accepted(self) -> int:
        """Messages this queue took: committed, or broadcast (never stored)."""
        return self.puts + sum(d.broadcasts for d in self.dispatchers.values())

    def dispatcher(self, app: str = "") -> QueueDispatcher:
        d = self.dispatchers.get(app)
        if d is None:
            d = self.dispatchers[app] = QueueDispatcher(
                max_delivery_attempts=self.domain.max_delivery_attempts, clock=wall_time_us)
            if self.ledger is not None:
                d.attach(self.ledger, (self, app))
        return d

    def set_domain(self, domain: DomainConfig, quota: DomainQuota | None) -> None:
        self.domain, self.quota = domain, quota
        for d in self.dispatchers.values():
            d.max_delivery_attempts = domain.max_delivery_attempts

    # -- the domain's quota (every call site goes through these) -------------------
    def admit(self, guids: Iterable[bytes], sizes: Iterable[int]) -> tuple[ResultCode, str] | None:
        """Count PUTs against the quota, all or none: the refusal of the first
        that does not fit, with the ones before it taken back."""
        if self.quota is None:
            return None
        admitted: list[bytes] = []
        for guid, size in zip(guids, sizes):
            refused = self.quota.admit(self.uri.queue, guid, size)
            if refused is not None:
                self.unadmit(admitted)
                return refused
            admitted.append(guid)
        return None

    def unadmit(self, guids: Iterable[bytes]) -> None:
        """PUTs admitted but not stored (a refused or failed commit)."""
        if self.quota is not None:
            for guid in guids:
                self.quota.unadmit(guid)

    def delivered(self, message: "StoredMessage", apps: Iterable[str]) -> None:
        """A stored message counts until every app in `apps` is done with it."""
        if self.quota is not None:
            self.quota.delivered(self.uri.queue, message.guid, message.size, set(apps))

    def delivered_rows(self, guids: list[bytes], sizes: list[int], apps: Iterable[str]) -> None:
        """`delivered` for the rows of a run."""
        if self.quota is not None:
            targets = set(apps)
            for guid, size in zip(guids, sizes):
                self.quota.delivered(self.uri.queue, guid, size, set(targets))

    def app_done(self, guid: bytes, app: str) -> None:
        """Confirmed, dead-lettered or expired for `app`."""
        if self.quota is not None:
            self.quota.app_done(guid, app)

    def apps_done(self, guids: Iterable[bytes], app: str) -> None:
        """`app_done` for many messages."""
        if self.quota is not None:
            for guid in guids:
                self.quota.app_done(guid, app)

    @property
    def express(self) -> bool:
        return self.domain.delivery == "express"

    @property
    def rules(self) -> AppRules:
        """The domain's app subscriptions, compiled once per domain
        configuration. A `queue@cluster` queue has no app here: its messages
        are stored and ACKed, and its link forwards them (`primary/links.py`)."""
        cached = self._rules
        if cached is None or cached[0] is not self.domain:
            rules = AppRules((), {}) if self.uri.cluster else AppRules(self.domain.apps, self.domain.subscriptions)
            cached = self._rules = (self.domain, rules)
        return cached[1]


@dataclass
class PendingPut:
    link: "Link"
    queue_id: int
    queue: QueueState
    message: pb.PutMessage
    arrived_us: int = 0    # when the node handed it to the group commit (wall clock; 0: not known)


@dataclass
class PendingColumns:
    """A checked columnar batch of PUTs to one queue (`PutColumns`): `table`
    holds the rows admitted, `guids` every row of the frame (what its ACK
    names), `refused` the rows of a per-message frame refused on their own.
    A frame spanning queues (`PutColumns.queue_ids`, queue_id 0) names its
    admitted rows' queues in `row_runs`, as runs (each queue and how many of
    its rows come next); `queue` is its first row's. The node puts such a
    frame's rows queue by queue, each queue's in the frame's order."""
    link: "Link"
    queue_id: int
    queue: QueueState
    table: pa.Table
    guids: bytes
    refused: dict[int, tuple[ResultCode, str]] = field(default_factory=dict)
    row_runs: list[tuple[QueueState, int]] | None = None
    arrived_us: int = 0    # as `PendingPut.arrived_us`

    @property
    def runs(self) -> list[tuple[QueueState, int]]:
        """The rows as runs of one queue: each queue and how many of its rows
        come next."""
        return [(self.queue, self.table.num_rows)] if self.row_runs is None else self.row_runs

    def unadmit(self) -> None:
        """Give the admitted rows' quota back (the frame was not committed)."""
        guids = self.table["guid"].to_pylist()
        at = 0
        for state, count in self.runs:
            state.unadmit(guids[at:at + count])
            at += count


class SlotRuns:
    """Runs of confirmed rows of ledger slots, as arrays: `counts[i]` rows of
    slot `slots[i]`'s owner (queue and app), in that order. What
    `Ledger.confirm_slots` returns, kept so: a CONFIRM frame of a session
    with thousands of queues makes no tuple a queue, and its commit takes
    the queue and app columns from `Partition._slot_names` by slot."""

    __slots__ = ("slots", "counts")

    def __init__(self, slots: np.ndarray, counts: np.ndarray):
        self.slots, self.counts = slots, counts


@dataclass
class PendingConfirms:
    """What one CONFIRM frame (or an admin's purge) confirmed on a
    partition: its rows (GUIDs and seqs, in order) and the queue and app of
    each run of them (`runs`: queue, app, rows, or a `SlotRuns` of many;
    a frame of a session with thousands of queues has a run per queue).
    `committed`, if given, is set once the commit was tried, with `ok`
    saying whether it is durable (a purge waits for it)."""
    runs: "_Runs"
    confirmed: ConfirmedRows
    committed: threading.Event | None = None
    ok: bool = False

    @classmethod
    def of(cls, queue: QueueState, app_id: str, confirmed: ConfirmedRows,
           committed: threading.Event | None = None) -> "PendingConfirms":
        """The rows of one queue and app."""
        return cls([(queue, app_id, len(confirmed.seqs))], confirmed, committed)


# What a CONFIRM frame confirmed on a partition, as runs (queue, app, rows),
# and what dispatching after it dropped (queue, app, messages).
_Runs = list["tuple[QueueState, str, int] | SlotRuns"]
_Gone = list[tuple[QueueState, str, list[Dropped]]]

# One queue's part of a CONFIRM frame: its state, the app, the consumer that
# confirms, the seqs, and the GUIDs they must hold (None: not checked).
ConfirmEntry = tuple[QueueState, str, ConsumerKey, Iterable[int], Sequence[bytes] | None]
# Consecutive seq ranges of one queue in a ConfirmColumns frame: the queue's
# state, the app, the consumer that confirms, the ranges' starts and counts.
ConfirmRange = tuple[QueueState, str, ConsumerKey, Sequence[int], Sequence[int]]


class PurgeFailed(Exception):
    """A purge's record could not be made durable (the messages are gone
    from memory; after a restart they would come back)."""


@dataclass
class DeadLetter:
    queue: QueueState
    app_id: str
    message: StoredMessage
    reason: str
    detail: str


def send_pushes(pushes: list[Push], frame_messages_max: int = PUSH_FRAME_MESSAGES_MAX) -> None:
    """Send dispatcher output ((link, queue_id), message) in order, per link.

    The pushes to the queues whose consumers take columnar frames
    (`Link.columnar`, asked for in the OpenQueue) go as PushColumns frames,
    one for the pushes of many queues of one session (`Link.push_groups`,
    the queues' ranges in `range_queue_ids`): a `MessageRun` (a PUT frame's
    rows) as its Arrow columns, single messages from `COLUMNAR_RUN_MIN` of
    them. A broadcast queue's run goes as a frame of its own, once for the
    queues of a link it goes to (their ids in the header). The rest go as
    PushBatch frames, where consecutive pushes of one message (same GUID and
    delivery count) to several queues of one link travel as one PushMessage
    with `queue_ids`: fanout apps and broadcast consumers below a proxy or
    replica cost one copy on that link, not one per consumer. Each queue's
    pushes keep their order. A SharedPush's rows go as one PushColumns frame
    per session below a link, its rows taken from the PUT frame they came
    in (`_LinkRows`)."""
    by_link: dict["Link", list[tuple[int, Pending | _LinkRows]]] = {}
    for key, pending in pushes:
        if isinstance(pending, SharedPush):
            _share_out(pending, by_link)
            continue
        link, queue_id = cast("tuple[Link, int]", key)
        items = by_link.setdefault(link, [])
        if isinstance(pending, MessageRun) and queue_id not in link.columnar:
            items.extend((queue_id, m) for m in pending.messages())   # a peer that asked for PushBatch
        else:
            items.append((queue_id, pending))
    for link, items in by_link.items():
        # Each columnar push's span: its queue's push group (a broadcast
        # queue's single pushes have no seqs: a span of their own; its runs
        # go as they are, below); spans too short for a frame go as messages.
        columnar, broadcast, groups = link.columnar, link.broadcast, link.push_groups
        keys: list[int | None] = [None] * len(items)
        sizes: dict[int, int] = {}
        for n, (queue_id, message) in enumerate(items):
            if queue_id not in columnar or isinstance(message, _LinkRows):
                continue
            if isinstance(message, MessageRun):
                if queue_id in broadcast:
                    continue
                rows = len(message)
            else:
                rows = 1
            key = keys[n] = -1 - queue_id if queue_id in broadcast else groups.get(queue_id, 0)
            sizes[key] = sizes.get(key, 0) + rows
        messages: list[pb.PushMessage] = []
        spans: dict[int, list[tuple[int, Pending]]] = {}   # span key -> its pushes, in order
        i = 0
        while i < len(items):
            queue_id, message = items[i]
            key = keys[i]
            if isinstance(message, _LinkRows):
                _send_held(link, messages, spans, frame_messages_max)   # (each queue's order)
                message.send(link, frame_messages_max)
                i += 1
                continue
            if key is not None and sizes[key] >= COLUMNAR_RUN_MIN:
                span = spans.get(key)
                if span is None:
                    span = spans[key] = []
                span.append((queue_id, message))
                i += 1
                continue
            if isinstance(message, MessageRun):
                # A broadcast queue's run (once for the queues of this link it
                # goes to), or a run too short to join a span: a frame of its
                # own, after everything before it (each queue's order).
                _send_held(link, messages, spans, frame_messages_max)
                end = i + 1
                while end < len(items) and items[end][1] is message:
                    end += 1
                queue_ids = [q for q, _ in items[i:end]] if end - i > 1 else []
                for start in range(0, len(message), frame_messages_max):
                    count = min(frame_messages_max, len(message) - start)
                    link.send(_push_frame(link, queue_id, message.seqs[start:start + count],
                                          encode_push_run(message.table.slice(start, count), message.delivery_count),
                                          queue_ids))
                i = end
                continue
            if messages:
                last = messages[-1]
                if last.guid == message.guid and last.delivery_count == message.delivery_count:
                    if not last.queue_ids:
                        last.queue_ids.append(last.queue_id)
                    last.queue_ids.append(queue_id)
                    i += 1
                    continue
            messages.append(_push_message(queue_id, message))
            i += 1
        _send_push_batches(link, messages, frame_messages_max)
        for span in spans.values():
            _send_span(link, span, frame_messages_max)


class _LinkRows:
    """A SharedPush's rows for one link's columnar queues: rows of its
    frame (`push.table`), with the link's queue ids."""

    __slots__ = ("push", "rows", "queue_ids")

    def __init__(self, push: SharedPush) -> None:
        self.push = push
        self.rows: list[int] = []
        self.queue_ids: list[int] = []

    def send(self, link: "Link", frame_messages_max: int) -> None:
        """PushColumns frames (`_SpanFrame`) of at most `frame_messages_max`
        rows, each a take of the frame's rows."""
        for start in range(0, len(self.rows), frame_messages_max):
            end = start + frame_messages_max
            frame = _SpanFrame()
            frame.add_rows(self.push.table.take(pa.array(self.rows[start:end], pa.int64())),
                           self.queue_ids[start:end])
            frame.send(link)


def _share_out(push: SharedPush, by_link: "dict[Link, list[tuple[int, Pending | _LinkRows]]]") -> None:
    """A SharedPush's rows into each link's pushes: one `_LinkRows` for the
    columnar queues of each push group of the link (a session below it: a
    relay forwards such a frame as it is) when they are COLUMNAR_RUN_MIN
    rows or more, single messages otherwise (and for a peer that asked for
    PushBatch)."""
    keys = cast("list[tuple[Link, int]]", push.keys)
    link = keys[0][0]
    if len(keys) >= COLUMNAR_RUN_MIN and all(key[0] is link for key in keys):
        # The usual frame: its rows to columnar queues of one session below
        # one link, sorted out in comprehensions rather than a row at a time.
        queue_ids = [queue_id for _, queue_id in keys]
        groups = link.push_groups
        if link.columnar.issuperset(queue_ids) and len({groups.get(q, 0) for q in queue_ids}) == 1:
            whole = _LinkRows(push)
            whole.rows, whole.queue_ids = push.rows, queue_ids
            by_link.setdefault(link, []).append((0, whole))
            return
    mine: dict[tuple["Link", int], _LinkRows] = {}
    singles: list[tuple[list[tuple[int, Pending | _LinkRows]], int, int]] = []   # (items, at, row) of PushBatch peers
    for row, (link, queue_id) in zip(push.rows, keys):
        if queue_id not in link.columnar:
            items = by_link.setdefault(link, [])
            singles.append((items, len(items), row))
            items.append((queue_id, cast(StoredMessage, None)))   # (the message, below)
            continue
        group = link.push_groups.get(queue_id, 0)
        rows = mine.get((link, group))
        if rows is None:
            rows = mine[link, group] = _LinkRows(push)
            by_link.setdefault(link, []).append((0, rows))
        rows.rows.append(row)
        rows.queue_ids.append(queue_id)
    if singles:
        for (items, at, _), message in zip(singles, push.messages([row for _, _, row in singles])):
            items[at] = (items[at][0], message)
    for (link, _), rows in mine.items():
        if len(rows.rows) < COLUMNAR_RUN_MIN:
            items = by_link[link]
            at = next(n for n, item in enumerate(items) if item[1] is rows)
            items[at:at + 1] = list(zip(rows.queue_ids, push.messages(rows.rows)))


def _send_held(link: "Link", messages: list[pb.PushMessage], spans: dict[int, list[tuple[int, Pending]]],
               frame_messages_max: int) -> None:
    """What `send_pushes` holds for a link, sent and cleared: before a frame
    that goes on its own."""
    _send_push_batches(link, messages, frame_messages_max)
    messages.clear()
    for span in spans.values():
        _send_span(link, span, frame_messages_max)
    spans.clear()


def _push_message(queue_id: int, message: StoredMessage) -> pb.PushMessage:
    return pb.PushMessage(queue_id=queue_id, guid=message.guid, payload=message.payload,
                          properties=message.properties, put_time_us=message.put_time_us,
                          delivery_count=message.delivery_count, sequence=message.seq,
                          compression=message.compression)  # type: ignore[arg-type]  # a Compression value


class _SpanFrame:
    """One PushColumns frame being built from a span's pushes: its rows'
    tables, and its seq ranges (consecutive seqs of one queue make one)."""

    def __init__(self) -> None:
        self.parts: list[pa.Table] = []
        self.singles: list[StoredMessage] = []
        self.queue_ids: list[int] = []
        self.starts: list[int] = []
        self.counts: list[int] = []
        self.rows = 0
        self._next_seq = -1

    def _range(self, queue_id: int, seqs: list[int]) -> None:
        """The ranges extended by `seqs` (ascending) of `queue_id`."""
        for first, count in zip(*seq_ranges(seqs)):
            self._extend(queue_id, first, count)

    def _extend(self, queue_id: int, first: int, count: int) -> None:
        """One more range of `queue_id`; it joins the last range when it is
        the same queue's next seq."""
        if first == self._next_seq and self.queue_ids and self.queue_ids[-1] == queue_id:
            self.counts[-1] += count
        else:
            self.queue_ids.append(queue_id)
            self.starts.append(first)
            self.counts.append(count)
        self._next_seq = first + count

    def add(self, queue_id: int, message: StoredMessage) -> None:
        """One message (its range made without `_range`'s computation: a span
        of thousands of queues adds a message or two of each)."""
        self.singles.append(message)
        self._extend(queue_id, message.seq, 1)
        self.rows += 1

    def add_rows(self, rows: pa.Table, queue_ids: list[int]) -> None:
        """Rows of a frame's push columns (`MessageRun.table`) pushed for
        the first time (a SharedPush's), each of its queue."""
        self._flush_singles()
        self.parts.append(push_run_table(rows, 1))
        if len(queue_ids) < SPAN_NUMPY_MIN:
            for queue_id, seq in zip(queue_ids, rows["seq"].to_pylist()):
                self._extend(queue_id, seq, 1)
        else:
            self._extend_rows(np.asarray(queue_ids, np.int64), np.asarray(rows["seq"].to_numpy(), np.int64))
        self.rows += len(queue_ids)

    def _extend_rows(self, queue_ids: np.ndarray, seqs: np.ndarray) -> None:
        """`_extend` a row at a time (row i of queue `queue_ids[i]`, seq
        `seqs[i]`), in numpy: a range starts where the queue changes or the
        seq does not follow, the first one joining the last range if it follows it."""
        n = len(seqs)
        starts = np.empty(n, np.bool_)
        starts[0] = not (int(seqs[0]) == self._next_seq and self.queue_ids and self.queue_ids[-1] == int(queue_ids[0]))
        starts[1:] = (queue_ids[1:] != queue_ids[:-1]) | (seqs[1:] != seqs[:-1] + 1)
        at = np.flatnonzero(starts)
        if not starts[0]:
            self.counts[-1] += int(at[0]) if len(at) else n
        self.queue_ids.extend(queue_ids[at].tolist())
        self.starts.extend(seqs[at].tolist())
        self.counts.extend(np.diff(np.append(at, n)).tolist())
        self._next_seq = int(seqs[-1]) + 1

    def add_run(self, queue_id: int, run: MessageRun, start: int, count: int) -> None:
        self._flush_singles()
        self.parts.append(push_run_table(run.table.slice(start, count), run.delivery_count))
        seqs = run.seqs
        if seqs[start + count - 1] - seqs[start] == count - 1:   # (a run's seqs ascend: consecutive, one range)
            self._extend(queue_id, seqs[start], count)
        else:
            self._range(queue_id, seqs[start:start + count])
        self.rows += count

    def _flush_singles(self) -> None:
        if self.singles:
            self.parts.append(_push_table(self.singles))
            self.singles = []

    def send(self, link: "Link") -> None:
        self._flush_singles()
        body = encode_push_table(self.parts[0] if len(self.parts) == 1 else pa.concat_tables(self.parts))
        one_queue = self.queue_ids.count(self.queue_ids[0]) == len(self.queue_ids)
        if self.queue_ids[0] in link.broadcast:   # (a span of its own) no seqs: nothing to confirm
            frame = frame_of("push_columns", queue_id=self.queue_ids[0], count=self.rows, arrow_ipc=body)
        else:
            frame = frame_of("push_columns", queue_id=self.queue_ids[0], count=self.rows, seq_starts=self.starts,
                             seq_counts=self.counts, range_queue_ids=[] if one_queue else self.queue_ids,
                             arrow_ipc=body)
        link.send(frame)


def _send_span(link: "Link", span: list[tuple[int, Pending]], frame_messages_max: int) -> None:
    """A span's pushes (of one push group, in order) as PushColumns frames
    of at most `frame_messages_max` rows, or, fewer than COLUMNAR_RUN_MIN
    (a span sent ahead of a run that goes on its own), as PushMessages."""
    if sum(len(m) if isinstance(m, MessageRun) else 1 for _, m in span) < COLUMNAR_RUN_MIN:
        _send_push_batches(link, [_push_message(q, one) for q, m in span
                                  for one in (m.messages() if isinstance(m, MessageRun) else [m])],
                           frame_messages_max)
        return
    frame = _SpanFrame()
    for queue_id, message in span:
        if not isinstance(message, MessageRun):
            frame.add(queue_id, message)
            if frame.rows == frame_messages_max:
                frame.send(link)
                frame = _SpanFrame()
            continue
        start = 0
        while start < len(message):
            count = min(len(message) - start, frame_messages_max - frame.rows)
            frame.add_run(queue_id, message, start, count)
            start += count
            if frame.rows == frame_messages_max:
                frame.send(link)
                frame = _SpanFrame()
    if frame.rows:
        frame.send(link)


def _send_push_batches(link: "Link", messages: list[pb.PushMessage], frame_messages_max: int) -> None:
    for start in range(0, len(messages), frame_messages_max):
        link.send(pb.Frame(push=pb.PushBatch(messages=messages[start:start + frame_messages_max])))


def _push_frame(link: "Link", queue_id: int, seqs: list[int], arrow_ipc: bytes,
                queue_ids: list[int] | None = None) -> pb.Frame:
    """A PushColumns frame of these rows, its seqs as ranges in the header
    (what relays track as unconfirmed; none for a broadcast queue)."""
    starts, counts = seq_ranges(seqs) if queue_id not in link.broadcast else ([], [])
    return frame_of("push_columns", queue_id=queue_id, count=len(seqs), queue_ids=queue_ids or [],
                    seq_starts=starts, seq_counts=counts, arrow_ipc=arrow_ipc)


def _push_table(run: list[StoredMessage]) -> pa.Table:
    """PUSH rows of these messages: their columns, properties as the tables' maps."""
    maps = [m.property_maps for m in run]
    return push_table(
        [m.guid for m in run], [m.seq for m in run], [m.payload for m in run],
        [v for v, _ in maps], [t for _, t in maps], [m.put_time_us for m in run],
        [m.delivery_count for m in run], [m.compression for m in run])


def _frames_merged(items: list[PendingPut | PendingColumns]) -> list[PendingPut | PendingColumns]:
    """The items of a commit, in order, with consecutive frames of one
    express queue without subscriptions (and of one schema) as one: the
    express lane decides and pushes them as one run (`_express_frame`),
    not a run a frame. A paced producer's frames hold tens of rows, a
    commit several of them, and each run's Arrow calls cost about as much
    whatever its rows."""
    out: list[PendingPut | PendingColumns] = []
    group: list[PendingColumns] = []

    def close() -> None:
        if len(group) == 1:
            out.append(group[0])
        elif group:
            first = group[0]
            table = pa.concat_tables([g.table for g in group])
            out.append(PendingColumns(first.link, first.queue_id, first.queue, table, b""))
        group.clear()

    for item in items:
        if not (isinstance(item, PendingColumns) and len(item.runs) == 1 and item.queue.express
                and not item.queue.rules.filtered):
            close()
            out.append(item)
            continue
        if group and (item.queue is not group[0].queue or not item.table.schema.equals(group[0].table.schema)):
            close()
        group.append(item)
    close()
    return out


def _segments(items: list[PendingPut | PendingColumns]) -> list[list[PendingPut] | PendingColumns]:
    """`items` in order, consecutive single PUTs together, and consecutive
    frames of one schema as one (their tables and runs joined): a group's
    PUT-log rows are built a part at a time, and a part's Arrow calls cost
    about as much whatever its rows (a paced producer's frames hold tens)."""
    out: list[list[PendingPut] | PendingColumns] = []
    frames: list[PendingColumns] = []

    def close() -> None:
        if len(frames) == 1:
            out.append(frames[0])
        elif frames:
            first = frames[0]
            out.append(PendingColumns(first.link, 0, first.queue, pa.concat_tables([f.table for f in frames]), b"",
                                      row_runs=[run for f in frames for run in f.runs]))
        frames.clear()

    for item in items:
        if isinstance(item, PendingColumns):
            if frames and not item.table.schema.equals(frames[0].table.schema):
                close()
            frames.append(item)
            continue
        close()
        if out and isinstance(out[-1], list):
            out[-1].append(item)
        else:
            out.append([item])
    close()
    return out


def send_acks(acks: list[tuple["Link", pb.AckMessage]]) -> None:
    by_link: dict["Link", list[pb.AckMessage]] = {}
    for link, ack in acks:
        by_link.setdefault(link, []).append(ack)
    for link, messages in by_link.items():
        link.send(pb.Frame(ack=pb.AckBatch(messages=messages)))


def _answer_puts(singles: list[PendingPut], bulks: list[PendingColumns], code: ResultCode, text: str) -> None:
    """One ACK per single PUT and one per columnar frame, all with `code`."""
    send_acks([(i.link, pb.AckMessage(queue_id=i.queue_id, guid=i.message.guid, code=wire(code), message=text))
               for i in singles])
    for b in bulks:
        b.link.send(ack_columns(b.queue_id, b.guids, code, text, b.refused))


def push_run(rows: pa.Table, seqs: list[int], delivery_count: int = 0, expires_us: int = 0) -> MessageRun:
    """A MessageRun of PUT rows (a decoded PutColumns frame, or its rows
    committed), with their seqs: the push columns as they are."""
    return MessageRun(_run_columns(rows, seqs), rows["guid"].to_pylist(), seqs,
                      pc.binary_length(rows["payload"]).to_pylist(), delivery_count, expires_us)


def _run_columns(rows: pa.Table, seqs: list[int]) -> pa.Table:
    """A run's columns (`MessageRun.table`) of PUT rows with these seqs."""
    put_time = (rows[PUT_TIME].fill_null(0) if PUT_TIME in rows.column_names
                else pa.array(np.zeros(rows.num_rows, np.int64)))
    return pa.table({
        "guid": rows["guid"], "seq": pa.array(seqs, pa.int64()), "payload": rows["payload"],
        "properties": rows["properties"], "property_types": rows["property_types"],
        "put_time_us": put_time, "compression": _compression_codes(rows["compression"]),
    })


class Partition:
    def __init__(self, index: int, config: ClusterConfig, epoch: int = 1,
                 quota_for: Callable[[str], DomainQuota | None] = lambda _: None,
                 on_fenced: Callable[[], None] = lambda: None, local_address: Callable[[], str] = lambda: "",
                 metrics: NodeMetrics | None = None):
        self.index = index
        self.metrics = metrics or NodeMetrics()
        self.config = config
        self.paths = tables.PartitionPaths(config.data_dir, index)
        self.epoch = epoch
        self.lock = threading.RLock()
        # Held from a dispatch until its pushes are on the links: two threads
        # dispatching in turn (the PUT commit's express lane, a CONFIRM that
        # frees a consumer's window) would otherwise send in the other order,
        # and a consumer would see PUT order broken. Taken before `lock`.
        self._push_lock = threading.RLock()
        self.queues: dict[tuple[str, str], QueueState] = {}
        self.ledger = Ledger()   # (under `lock`)
        self._slot_names_cache: tuple[pa.Array, pa.Array, pa.Array] | None = None
        self._queue_names: tuple[list[str], list[str]] = ([], [])   # domain and queue by QueueState.index
        self._queue_columns_cache: tuple[pa.Array, pa.Array] | None = None
        self.quota_for = quota_for
        self._wake = threading.Event()
        self._stopping = threading.Event()
        # Each appender first claims its table for this epoch (raises `Fenced`
        # if a newer primary already has), and every commit carries the epoch.
        self.on_fenced = on_fenced
        # Their checkpoints are written by a thread each, off the commit threads.
        durable = config.primary.durability == "fsync"
        appender = functools.partial(deltars.Appender, epoch=epoch, durable=durable, background_checkpoints=True)
        self._puts = appender(self.paths.puts, tables.PUTS_SCHEMA)
        self._confirms = appender(self.paths.confirms, tables.CONFIRMS_SCHEMA)
        self._dead = appender(self.paths.dead_letters, tables.DEAD_LETTERS_SCHEMA)
        self._disagreements = appender(self.paths.disagreements, tables.DISAGREEMENTS_SCHEMA)
        # The tailer's own handle on the PUT log, to read messages by seq
        # (an Appender belongs to its commit thread).
        self._puts_reader = DeltaTable(self.paths.puts)
        # Express lane (`express.py`).
        # Its hash drawn for this partition; its generations sorted on a thread of their own.
        self._history = GuidHistory(config.history_window_ms * 1000, seed=os.urandom(16), spawn=_on_a_thread)
        self._reconciler = Reconciler()
        self._decisions_lock = threading.Lock()
        self._judged_seq = -1       # every PUT row up to this seq has been judged by the pipeline
        # (PUT-log version, last seq, wall time) of this primary's commits
        self._commit_seqs: deque[tuple[int, int, float]] = deque()
        self._judged_puts_version: int | None = None   # the newest the delivery log records; only grows
        self.disagreements_total = 0
        self._next_seq = self._max_column("seq") + 1
        # put_time never goes backwards within a partition: the pipeline uses it
        # as its watermark, and a row older than the watermark would be dropped.
        self._last_put_us = self._max_column("put_time")
        self._delivery_version = -1
        self._delivery_tail: deltars.LogTail | None = None  # opened once the pipeline creates it
        policy = GroupPolicy(config.primary.group_commit_max_messages,
                             config.primary.group_commit_max_bytes,
                             config.primary.group_commit_linger_ms,
                             config.primary.group_commit_eager_messages,
                             config.primary.group_commit_busy_linger_ms)
        self.put_committer: GroupCommitter[PendingPut | PendingColumns] = GroupCommitter(
            f"puts-{index}", self._commit_puts, policy, config.primary.pending_puts_max)
        confirm_policy = GroupPolicy(config.primary.group_commit_max_messages,
                                     config.primary.group_commit_max_bytes,
                                     config.primary.confirm_commit_linger_ms)
        self.confirm_committer: GroupCommitter[PendingConfirms] = GroupCommitter(
            f"confirms-{index}", self._commit_confirms, confirm_policy, 10_000_000)
        self.dead_committer: GroupCommitter[DeadLetter] = GroupCommitter(
            f"dead-{index}", self._commit_dead, policy, 10_000_000)
        self._tailer = threading.Thread(target=self._tail_delivery, name=f"tail-{index}", daemon=True)
        every, target = config.primary.compact_every_commits, config.primary.compact_target_file_bytes
        keep_s = config.primary.log_retention_s
        # The dedup stream and this primary read the PUT log by version;
        # nothing reads the confirm log's history.
        self.compactors = (Compactor(self.paths.puts, every, f"puts-{index}", target, durable, keep_s,
                                     self._puts_log_needed_from, self._puts),
                           Compactor(self.paths.confirms, every, f"confirms-{index}", target, durable, keep_s,
                                     appender=self._confirms))
        self.on_pushes: Callable[[list[Push]], None] = send_pushes
        # Federation links (primary/links.py, imported only with links: it loads the SDK).
        self.links: list[LinkForwarder] = []
        self.pulls: PullLinks | None = None
        if config.links:
            from primary.links import LinkForwarder, PullLinks
            # A link that never ran starts here: what is committed from now on.
            start_at = (self._puts.table.version(), self._next_seq - 1)
            # TLS as this cluster's clients use it: a remote cluster must trust the same CA.
            tls = conf.client_tls(config)
            tokens = conf.link_tokens(config)   # what each link presents there ([[links]] token_file)
            self.links = [LinkForwarder(link, config.name, index, config.data_dir, lambda: self.config.domains,
                                        start_at=start_at, tls=tls, token=tokens[link.name])
                          for link in config.links if link.direction == "push"]
            pulls = [link for link in config.links if link.direction == "pull"]
            self.pulls = PullLinks(pulls, config.name, index, local_address, tls, tokens) if pulls else None

    # -- lifecycle ----------------------------------------------------------
    def start(self) -> None:
        self._recover()
        for forwarder in self.links:
            forwarder.start()
        if self.pulls is not None:
            self.pulls.start()
        self.put_committer.start()
        self.confirm_committer.start()
        self.dead_committer.start()
        self._tailer.start()
        for compactor in self.compactors:
            compactor.start()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        self.put_committer.stop()
        self.confirm_committer.stop()
        self.dead_committer.stop()
        self._tailer.join(10)
        for forwarder in self.links:
            forwarder.stop()
        if self.pulls is not None:
            self.pulls.stop()
        for compactor in self.compactors:
            compactor.stop()
        for appender in (self._puts, self._confirms, self._dead, self._disagreements):
            appender.close()

    def notify_delivery(self) -> None:
        self._wake.set()

    def consumer_opened(self, state: QueueState, app: str, key: Any, options: ConsumerOptions, link: str) -> None:
        """A consumer here opened (or changed) a queue: the pull links that
        carry its domain follow (a link's own consumer, `link`, does not count)."""
        if self.pulls is None or link or state.uri.cluster or not self.pulls.carries(state.uri.domain):
            return
        subscriptions = tuple(s.text for s in options.subscriptions) or None
        self.pulls.consumer(state.uri.domain, state.uri.queue, app, key, subscriptions)

    def consumer_closed(self, state: QueueState, app: str, key: Any) -> None:
        if self.pulls is not None:
            self.pulls.consumer_gone(state.uri.domain, state.uri.queue, app, key)

    def queue_state(self, uri: QueueUri, domain: DomainConfig) -> QueueState:
        key = (uri.domain, uri.queue)
        with self.lock:
            state = self.queues.get(key)
            if state is None:
                state = QueueState(QueueUri(uri.domain, uri.queue), domain, self.quota_for(uri.domain),
                                   ledger=self.ledger, index=len(self._queue_names[1]))
                self._queue_names[0].append(uri.domain)   # (domain first: a reader sizes by the queues)
                self._queue_names[1].append(uri.queue)
                self.queues[key] = state
            return state

    def _queue_columns(self) -> tuple[pa.Array, pa.Array]:
        """The domain and queue of each QueueState of this partition, by its
        `index`, as string arrays (PUT-log rows of a frame spanning queues
        take their columns from them). Queues only come: the arrays are made
        again when there are more."""
        n = len(self._queue_names[1])
        cached = self._queue_columns_cache
        if cached is None or len(cached[1]) < n:
            cached = self._queue_columns_cache = (pa.array(self._queue_names[0][:n], pa.string()),
                                                  pa.array(self._queue_names[1][:n], pa.string()))
        return cached

    def route(self, state: QueueState, app: str, action: Callable[[QueueDispatcher], list[Push]]) -> None:
        """Run `action` on the app's dispatcher under the lock, then send its
        pushes and dead-letter whatever it dropped."""
        self.route_many([(state, app, action)])

    def route_many(self, calls: Iterable[tuple[QueueState, str, Callable[[QueueDispatcher], list[Push]]]]) -> None:
        """`route` for several queues, their pushes sent together: a link's
        pushes of many queues go as frames spanning them (`send_pushes`),
        not a frame per queue."""
        with self._push_lock:
            routed, dropped = self._dispatch_all(calls)
            pushes = [push for pushes in routed for push in pushes]
            if pushes:
                self._push(pushes)
        for state, app, messages in dropped:
            self._dead_letter(state, app, messages)

    def confirm(self, entries: Iterable[ConfirmEntry]) -> PendingConfirms | None:
        """A ConfirmBatch frame's queues (their GUIDs checked, when given;
        a ConfirmColumns frame goes to `confirm_ranges`), in one pass under one hold of the locks:
        each queue's seqs confirmed in its app's dispatcher, what the room they
        free lets through sent together (frames spanning queues), and what
        they confirmed returned for the confirm committer (None: nothing), its
        rows in one list with a run per queue. No callable, result or
        dispatcher is made per queue (a frame of a session with thousands of
        queues holds a range or two of each)."""
        def confirm_each(rows: ConfirmedRows, runs: _Runs, pushes: list[Push], dropped: _Gone) -> None:
            for state, app, key, seqs, guids in entries:
                dispatcher = state.dispatchers.get(app)
                if dispatcher is None:
                    continue   # no consumer of this app ever came: nothing is held
                before = len(rows.seqs)
                _, freed = dispatcher.confirm_many(key, seqs, guids, rows)
                if freed:
                    pushes.extend(freed)
                if dispatcher.has_dropped:
                    dropped.append((state, app, dispatcher.take_dropped()))
                count = len(rows.seqs) - before
                if count:
                    runs.append((state, app, count))
                    if state.quota is not None:
                        state.apps_done(rows.guids[before:], app)
        return self._confirming(confirm_each)

    def confirm_ranges(self, ranges: Sequence[ConfirmRange]) -> PendingConfirms | None:
        """`confirm` for a ConfirmColumns frame's seq ranges (what the SDK
        sends), of one queue or of thousands: the ranges of consumers whose
        rows the ledger holds in a few array operations (`Ledger.confirm_slots`),
        the others in one pass over them (`dispatcher.confirm_ranges`), no
        call per queue, then each queue whose freed room lets waiting
        messages through dispatched once. Consecutive entries of one queue
        and app make one run of the rows."""
        if not ranges:
            return None

        def confirm_all(rows: ConfirmedRows, runs: _Runs, pushes: list[Push], dropped: _Gone) -> None:
            held = self.ledger.keys
            slots: list[int] = []
            lengths: list[int] = []
            starts: list[Sequence[int]] = []
            counts: list[Sequence[int]] = []
            rest: list[ConfirmRange] = []
            for entry in ranges:
                slot = held.get(entry[2])
                if slot is None:
                    rest.append(entry)
                    continue
                slots.append(slot)
                lengths.append(len(entry[3]))
                starts.append(entry[3])
                counts.append(entry[4])
            if slots:
                total = sum(lengths)
                self._confirm_held(np.repeat(np.asarray(slots, np.int64), lengths),
                                   np.fromiter(itertools.chain.from_iterable(starts), np.int64, total),
                                   np.fromiter(itertools.chain.from_iterable(counts), np.int64, total), rows, runs)
            if rest:
                self._confirm_rest(rest, rows, runs, pushes, dropped)
        return self._confirming(confirm_all)

    def confirm_held(self, link: Any, queue_ids: np.ndarray, starts: np.ndarray, counts: np.ndarray
                     ) -> tuple[bool, PendingConfirms | None]:
        """`confirm_ranges` for a frame's ranges when every one is of a plain
        dispatcher's sole consumer (range i of the consumer (link,
        `queue_ids[i]`)), in the ledger (`Ledger.confirm_slots`): (True,
        what it confirmed). (False, None) when one is not: nothing was done
        (the caller makes entries then). Which consumers are plain is read
        under the lock, as they change under it."""
        found: list[bool] = []

        def confirm(rows: ConfirmedRows, runs: _Runs, _pushes: list[Push], _dropped: _Gone) -> None:
            slots = self.ledger.slots_of(link, queue_ids)
            if slots is not None:
                found.append(True)
                self._confirm_held(slots, starts, counts, rows, runs)
        done = self._confirming(confirm)
        return bool(found), done

    def _confirm_held(self, slots: np.ndarray, starts: np.ndarray, counts: np.ndarray, rows: ConfirmedRows,
                      runs: _Runs) -> None:
        at = len(rows.seqs)
        hit, confirmed = self.ledger.confirm_slots(slots, starts, counts, rows)
        if not len(hit):
            return
        runs.append(SlotRuns(hit, confirmed))
        owners = self.ledger.owners()
        held = [owners[slot] for slot in hit.tolist()]
        if any(state.quota is not None for state, _ in held):
            for (state, app), n in zip(held, confirmed.tolist()):
                if state.quota is not None:
                    state.apps_done(rows.guids[at:at + n], app)
                at += n

    def _slot_names(self) -> tuple[pa.Array, pa.Array, pa.Array]:
        """The domain, queue and app of each ledger slot's owner, by slot, as
        string arrays (a CONFIRM commit takes its columns of `SlotRuns`
        from them). Slots only come: the arrays are made again when there
        are more."""
        owners = self.ledger.owners()
        n = len(owners)
        names = self._slot_names_cache
        if names is None or len(names[0]) < n:
            mine = owners[:n]
            names = self._slot_names_cache = (pa.array([state.uri.domain for state, _ in mine], pa.string()),
                                              pa.array([state.uri.queue for state, _ in mine], pa.string()),
                                              pa.array([app for _, app in mine], pa.string()))
        return names

    def _confirm_rest(self, ranges: Sequence[ConfirmRange], rows: ConfirmedRows, runs: _Runs, pushes: list[Push],
                      dropped: _Gone) -> None:
        """`confirm_ranges` for ranges of consumers whose rows their dispatchers hold."""
        states, apps, keys, starts, counts = zip(*ranges)
        dispatchers = [state.dispatchers.get(app) for state, app in zip(states, apps)]
        at = len(rows.seqs)
        confirmed, freed = confirm_ranges(dispatchers, keys, starts, counts, rows)
        for state, app, n in zip(states, apps, confirmed):
            if n:
                self._confirmed_run(state, app, at, n, rows, runs)
                at += n
        if freed:
            owner = {id(d): (state, app) for d, state, app in zip(dispatchers, states, apps)}
            for dispatcher in freed:
                pushes.extend(dispatcher.dispatch())
                if dispatcher.has_dropped:
                    dropped.append((*owner[id(dispatcher)], dispatcher.take_dropped()))

    @staticmethod
    def _confirmed_run(state: QueueState, app: str, at: int, n: int, rows: ConfirmedRows, runs: _Runs) -> None:
        """Rows `at` .. `at + n - 1` confirmed (those after `runs`' rows) were of `state`'s `app`."""
        last = runs[-1] if runs else None
        if isinstance(last, tuple) and last[0] is state and last[1] == app:
            runs[-1] = (state, app, last[2] + n)
        else:
            runs.append((state, app, n))
        if state.quota is not None:
            state.apps_done(rows.guids[at:at + n], app)

    def _confirming(self, confirm: "Callable[[ConfirmedRows, _Runs, list[Push], _Gone], None]"
                    ) -> PendingConfirms | None:
        """Run `confirm` under the push lock and the partition's lock, with the
        lists it fills: the rows confirmed, their runs (queue, app, rows), the
        pushes the freed room lets through and what dispatching dropped. Then
        send the pushes (still under the push lock), dead-letter the dropped,
        and return the rows for the confirm committer (None: nothing)."""
        rows = ConfirmedRows([], [])
        runs: _Runs = []
        pushes: list[Push] = []
        dropped: _Gone = []
        with self._push_lock:
            with self.lock:
                confirm(rows, runs, pushes, dropped)
            if pushes:
                self._push(pushes)
        for state, app, messages in dropped:
            self._dead_letter(state, app, messages)
        return PendingConfirms(runs, rows) if runs else None

    def _dispatch_all(self, calls: Iterable[tuple[QueueState, str, Callable[[QueueDispatcher], list[Push]]]]
                      ) -> tuple[list[list[Push]], list[tuple[QueueState, str, list[Dropped]]]]:
        """Each action on its app's dispatcher, all under one hold of the
        lock (a commit or a CONFIRM frame touches thousands of queues when
        there are that many): each one's pushes, and what they dropped.
        The caller holds the push lock."""
        routed: list[list[Push]] = []
        dropped: list[tuple[QueueState, str, list[Dropped]]] = []
        with self.lock:
            for state, app, action in calls:
                dispatcher = state.dispatcher(app)
                routed.append(action(dispatcher))
                gone = dispatcher.take_dropped()
                if gone:
                    dropped.append((state, app, gone))
        return routed, dropped

    def _dead_letter(self, state: QueueState, app: str, dropped: list[Dropped]) -> None:
        for message, reason, detail in dropped:
            log.warning("partition %d: taproot://%s/%s%s: message seq %d removed from delivery: %s (%s)",
                        self.index, state.uri.domain, state.uri.queue, f"?id={app}" if app else "",
                        message.seq, reason, detail)
            state.app_done(message.guid, app)
        self.dead_committer.submit([DeadLetter(state, app, m, r, d) for m, r, d in dropped], 0)

    def own_frames(self) -> int:
        """Rows of frames spanning queues held unconfirmed for more than
        FRAME_HOLD_S get copies of their own (`QueueDispatcher.own_frames`),
        so a slow consumer keeps its rows in memory, not their frames."""
        before_us = wall_time_us() - int(FRAME_HOLD_S * 1e6)
        owned = 0
        with self.lock:
            self.ledger.release(self.ledger.stale(before_us))   # (into their dispatchers, as (run, row))
            states = list(self.queues.values())
        for state in states:
            with self.lock:
                for dispatcher in state.dispatchers.values():
                    owned += dispatcher.own_frames(before_us)
        return owned

    def expire(self) -> None:
        """TTL sweep of every queue whose domain has one."""
        with self.lock:
            targets = [(s, app) for s in self.queues.values() if s.domain.message_ttl_ms
                       for app in list(s.dispatchers)]
        for state, app in targets:
            self.route(state, app, _expire)

    def _max_column(self, column: str) -> int:
        return _max_stat(self._puts.table, column)

    def _recover(self) -> None:
        """Rebuild what is unconfirmed, with Arrow joins rather than Python
        sets of every confirmed GUID:

            (delivery rows, plus the express lane's decisions for the PUT rows
             past the last PUT version the pipeline judged), per app,
            minus confirms and dead letters.

        The GUID history is rebuilt from the PUT log's window first, so the
        express decisions for the unjudged rows (and for every PUT from now
        on) see every GUID committed within it, by any earlier primary."""
        now_us = wall_time_us()
        delivery = deltars.try_open(self.paths.delivery)
        self._delivery_tail = None if delivery is None else deltars.LogTail(delivery)
        if delivery is not None:
            self._delivery_version, delivered = deltars.read_snapshot(delivery, DELIVERY_COLUMNS)
            judged = self._judged_bound(-1, self._delivery_version)
        else:
            delivered, judged = _columns_of(tables.DELIVERY_SCHEMA, DELIVERY_COLUMNS).empty_table(), None
        if judged is None:  # no commit says (an older release): trust the delivery rows
            judged = _max_of(delivered["seq"])
        self._judged_seq = judged
        # 1. The GUID history, from the window's PUT rows, and the rows past the judged seq.
        horizon = pa.scalar(now_us - self._history.window_us, pa.int64()).cast(tables.TIMESTAMP)
        ds = self._puts.table.to_pyarrow_dataset()
        window = deltars.without_views(ds.to_table(
            columns=["guid", "seq", "put_time"],
            filter=(pc.field("put_time") >= horizon) | (pc.field("seq") > judged))).sort_by("seq")
        guids = window["guid"].to_pylist()
        seqs = window["seq"].to_pylist()
        times = window["put_time"].cast(pa.int64()).to_pylist()
        duplicate: dict[int, bool] = {}
        start = 0
        for end in range(1, len(seqs) + 1):  # one history commit per PUT commit (one put_time)
            if end == len(seqs) or times[end] != times[start]:
                for seq, dup in zip(seqs[start:end], self._history.commit(guids[start:end], times[start])):
                    if seq > judged:
                        duplicate[seq] = dup
                start = end
        self._history.expire(now_us)
        # 2. Express decisions for the unjudged rows the pipeline has not delivered.
        candidates = pa.array(sorted(duplicate), pa.int64())
        unjudged = candidates.filter(pc.invert(pc.is_in(candidates, value_set=delivered["seq"].combine_chunks()))
                                     ).to_pylist() if duplicate else []
        express_rows = self._put_rows(self._puts.table, unjudged) if unjudged else None
        targets = [delivered.select(["domain", "queue", "guid", "seq", "apps"])]
        if express_rows is not None and express_rows.num_rows:
            apps = self._express_apps(express_rows, [duplicate[s] for s in express_rows["seq"].to_pylist()])
            targets.append(express_rows.select(["domain", "queue", "guid", "seq"]).append_column(
                "apps", pa.array(apps, pa.list_(pa.string()))))
        targets_table = pa.concat_tables(targets, promote_options="permissive")
        # 3. Per app, minus what is confirmed or dead-lettered.
        waiting = _unfinished(_per_app(targets_table, self.config.domains),
                              [t.to_pyarrow_table(columns=["guid", "app_id"]) for t in (self._confirms.table,
                                                                                           self._dead.table)])
        routed = 0
        if waiting.num_rows:
            messages = self._put_rows(self._puts.table, pc.unique(waiting["seq"]).to_pylist())
            routed = self._route_waiting(messages, waiting)
        log.info("partition %d recovered: next seq %d, delivery version %d, pipeline judged through seq %d, "
                 "%d express decisions re-made, %d (message, app) pairs unconfirmed, GUID history %d",
                 self.index, self._next_seq, self._delivery_version, judged, len(duplicate), routed,
                 len(self._history))

    def _express_apps(self, rows: pa.Table, duplicates: list[bool]) -> list[list[str]]:
        """Re-make the express decisions for PUT rows (recovery), recording
        them for reconciliation: the apps, or none for a duplicate or a
        `pipeline` domain's row (its delivery row decides)."""
        result: list[list[str]] = []
        columns = {name: rows[name].to_pylist() for name in ("domain", "queue", "guid", "seq", "properties",
                                                            "property_types")}
        for i, dup in enumerate(duplicates):
            state = self._state_for(columns["domain"][i], columns["queue"][i])
            if state is None or not state.express:
                result.append([])  # a `pipeline` domain: its delivery row decides
                continue
            message = StoredMessage(columns["guid"][i], columns["seq"][i], b"",
                                    maps=(columns["properties"][i], columns["property_types"][i]))
            result.append(list(self._decide(state, message, dup) or ()))
        return result

    def _state_for(self, domain: str, queue: str) -> QueueState | None:
        state = self.queues.get((domain, queue))
        if state is None:
            domain_config = self.config.domains.get(domain)
            if domain_config is None:
                log.error("partition %d: message for unknown domain %r: kept in storage only", self.index, domain)
                return None
            state = self.queue_state(QueueUri(domain, queue), domain_config)
        return state

    # -- PUT path -----------------------------------------------------------
    def _commit_puts(self, items: list[PendingPut | PendingColumns]) -> None:
        """One Delta commit for every PUT of the group (single PUTs and columnar
        batches alike), then the ACKs."""
        taken_us = wall_time_us()
        build_started = time.perf_counter()
        now_us = self._last_put_us = max(taken_us, self._last_put_us)
        singles = [i for i in items if isinstance(i, PendingPut)]
        bulks = [i for i in items if isinstance(i, PendingColumns)]
        next_seq = self._next_seq
        try:
            batch = self._put_batch(items, now_us)
        except Exception as exc:
            # Nothing was written: answer at once rather than leave the
            # producers to their timeout.
            self._next_seq = next_seq
            log.exception("partition %d: building the rows of %d PUTs failed", self.index, len(items))
            self._refuse_puts(singles, bulks, ResultCode.STORAGE_FAILURE, f"the commit could not be built: {exc}")
            return
        count = batch.num_rows
        started = time.perf_counter()
        targets: Targets = {}
        # Held from before the commit until its express decisions are
        # recorded: a delivery row for these seqs cannot be reconciled before.
        with self._decisions_lock:
            try:
                # Answered before the handle moves to this commit (`settle` below).
                version = self._puts.append(batch, settle=False)
                self.compactors[0].on_commit()
            except Fenced as exc:
                # A newer primary has the partition: nothing was written. No ACK:
                # the node ends these links and the hops below resend the PUTs to
                # the new primary from their retransmission buffers.
                log.warning("partition %d: fenced, %d PUTs left to the new primary: %s", self.index, count, exc)
                self.on_fenced()
                return
            except Exception as exc:
                log.exception("partition %d: PUT commit of %d messages failed", self.index, count)
                self._refuse_puts(singles, bulks, ResultCode.STORAGE_FAILURE, f"Delta commit failed: {exc}")
                return
            self._commit_seqs.append((version, self._next_seq - 1, time.time()))
            # The ACKs first: the producers wait for them; the express
            # decisions come next, still before any delivery row is reconciled.
            _answer_puts(singles, bulks, ResultCode.SUCCESS, "")
            self._count_puts(singles, bulks, taken_us)
            for forwarder in self.links:
                forwarder.notify()
            targets, fresh = self._express(batch, items, now_us)
        if targets or fresh:
            self._route_targets(targets, fresh)
        self._settle_puts()
        if log.isEnabledFor(logging.DEBUG):
            log.debug("partition %d: %d PUTs: commit and ACK %.1f ms (build %.1f ms)", self.index, count,
                      (time.perf_counter() - started) * 1000, (started - build_started) * 1000)

    def _settle_puts(self) -> None:
        """The PUT log's handle to the commit just answered: off the ACK and
        PUSH path, before the next group. A failure here is retried by the
        next commit (`Appender.append` settles first), which refuses its PUTs
        if it fails again."""
        try:
            self._puts.settle()
        except Exception:
            log.warning("partition %d: updating the PUT log's handle failed; the next commit retries it",
                        self.index, exc_info=True)
        # The next commit's files, created now rather than on its ACK path.
        self._puts.reserve()

    def _count_puts(self, singles: list[PendingPut], bulks: list[PendingColumns], taken_us: int) -> None:
        """Each queue's committed messages (`QueueState.puts`), and PUT->ACK
        from the producers' put times (`metrics`), a frame at a time, with
        its phases (`NodeMetrics.observe_put_ack`): this group was taken by
        the commit thread at `taken_us` and is answered now."""
        now_us = wall_time_us()
        observe = self.metrics.observe_put_ack
        for state, group in itertools.groupby(singles, key=lambda i: i.queue):
            run = list(group)
            state.puts += len(run)
            if run[0].message.put_time_us:
                observe(run[0].message.put_time_us, run[0].arrived_us, taken_us, now_us, len(run))
        for b in bulks:
            for state, n in b.runs:
                state.puts += n
            if PUT_TIME in b.table.column_names and b.table.num_rows:
                put_us = b.table[PUT_TIME][0].as_py()
                if put_us:
                    observe(put_us, b.arrived_us, taken_us, now_us, b.table.num_rows)

    def _put_batch(self, items: list[PendingPut | PendingColumns], now_us: int) -> pa.Table:
        """The PUT-log rows of one group commit, in the order the PUTs came
        (a producer's single PUTs and frames to one queue may share a
        commit: their seqs keep its order). Consecutive single PUTs make
        one part, each frame another."""
        parts = []
        for singles_or_bulk in _segments(items):
            if isinstance(singles_or_bulk, PendingColumns):
                t = singles_or_bulk.table
                producer_us = t[PUT_TIME] if PUT_TIME in t.column_names else pa.nulls(t.num_rows, pa.int64())
                parts.append(self._rows(singles_or_bulk.runs, t["guid"], t["payload"],
                                        t["properties"], t["property_types"], producer_us, t["compression"], now_us))
                continue
            singles = singles_or_bulk
            props = [wire_to_maps(i.message.properties) for i in singles]
            parts.append(self._rows(
                queue_runs(i.queue for i in singles),
                pa.array([i.message.guid for i in singles], pa.binary()),
                pa.array([i.message.payload for i in singles], pa.binary()),
                pa.array([p[0] for p in props], tables.PROPERTY_MAP),
                pa.array([p[1] for p in props], tables.PROPERTY_MAP),
                pa.array([i.message.put_time_us or None for i in singles], pa.int64()),
                pa.array([COMPRESSION_NAMES.get(i.message.compression) for i in singles], pa.string()), now_us))
        return pa.concat_tables(parts) if len(parts) > 1 else parts[0]

    @staticmethod
    def _refuse_puts(singles: list[PendingPut], bulks: list[PendingColumns], code: ResultCode, text: str) -> None:
        """Answer a group that was not committed, and give its quota back."""
        for i in singles:
            i.queue.unadmit([i.message.guid])
        for b in bulks:
            b.unadmit()
        _answer_puts(singles, bulks, code, text)

    def _express(self, batch: pa.Table, items: list[PendingPut | PendingColumns], now_us: int
                 ) -> "tuple[Targets, list[_Fresh]]":
        """The express lane, right after the commit: the GUID history decides
        duplicates (ACKed, never pushed), the app subscriptions the targets.
        Rows are in `batch` order: the items' order (`_put_batch`). The rows
        of a frame spanning queues, a row or a few of each, go to `_Fresh`
        (dispatched in one pass, `take_fresh`) where their queue has nothing
        in `targets` yet, which they would pass."""
        duplicates = self._history.commit(joined_values(batch["guid"]), now_us)   # (16 bytes each: checked at the door)
        first_seq = batch["seq"][0].as_py()
        targets: Targets = {}
        fresh: list[_Fresh] = []
        row = 0
        for b in _frames_merged(items):
            if isinstance(b, PendingPut):
                state, m = b.queue, b.message
                if state.express:
                    ttl_ms = state.domain.message_ttl_ms
                    message = StoredMessage(m.guid, first_seq + row, m.payload, list(m.properties), m.put_time_us,
                                            expires_us=now_us + ttl_ms * 1000 if ttl_ms else 0,
                                            compression=m.compression)
                    self._decide_and_target(targets, state, message, duplicates[row])
                row += 1
                continue
            row = self._express_runs(b, targets, fresh, first_seq, row, duplicates, now_us)
        return targets, fresh

    def _express_runs(self, b: PendingColumns, targets: Targets, fresh: "list[_Fresh]", first_seq: int, row: int,
                      duplicates: list[bool], now_us: int) -> int:
        """The express lane for a frame's queue runs from `row` of the
        commit: a run of COLUMNAR_RUN_MIN rows of a queue without
        subscriptions as one (`_express_frame`); a queue's few rows without
        subscriptions or targets in this commit into the frame's `_Fresh`,
        every row to every app and a duplicate to none (`_decide` without
        asking the rules row by row), in this loop: with thousands of queues
        of a row or two each in a commit, it runs once a message, so it
        makes no call a row for a queue of one app and no quota; the rest
        row by row into `targets` (`_express_rows`), with every row of a
        frame of fewer than FRESH_RUN_ROWS rows. Returns the next row."""
        offset = 0
        small = b.table.num_rows < FRESH_RUN_ROWS
        built: _MessageBuilder | None = None
        guid: list[bytes] | None = None
        frame_fresh: _Fresh | None = None
        decisions = _Decisions()
        seqs, keys, guids, decided = decisions.seqs, decisions.keys, decisions.guids, decisions.apps
        reconciler = self._reconciler
        last_ttl_ms, run = -1, None
        for state, count in b.runs:
            express, filtered, apps, ttl_ms, lean, target, slot = state.fresh_profile()
            if not express:
                row += count
                offset += count
                continue
            if count >= COLUMNAR_RUN_MIN and not filtered:
                decisions.flush(reconciler)
                table = b.table if count == b.table.num_rows else b.table.slice(offset, count)
                row = self._express_frame(targets, state, table, first_seq, row, duplicates, now_us)
                offset += count
                continue
            if small or filtered or (targets and any((state, app) in targets for app in apps)):
                decisions.flush(reconciler)
                if built is None:
                    built = _MessageBuilder.of_frame(b.table)
                row = self._express_rows(targets, state, built, offset, count, first_seq, row, duplicates, now_us)
                offset += count
                continue
            if frame_fresh is None:
                guid = b.table["guid"].to_pylist()
                frame_fresh = _Fresh(b.table, first_seq + row - offset, guid)
                fresh.append(frame_fresh)
                fresh_rows, fresh_runs, fresh_targets = frame_fresh.rows, frame_fresh.runs, frame_fresh.targets
                fresh_slots = frame_fresh.slots
            assert guid is not None
            if ttl_ms != last_ttl_ms or run is None:
                last_ttl_ms, run = ttl_ms, frame_fresh.run(now_us + ttl_ms * 1000 if ttl_ms else 0)
            for i in range(offset, offset + count):
                seqs.append(first_seq + row)
                keys.append(state)
                guids.append(guid[i])
                if duplicates[row]:
                    decided.append(None)
                else:
                    decided.append(apps)
                    if lean:
                        fresh_rows.append(i)
                        fresh_runs.append(run)
                        fresh_targets.append(target)
                        fresh_slots.append(slot)
                    else:
                        frame_fresh.add(i, state, run, apps)
                row += 1
            offset += count
        decisions.flush(reconciler)
        return row

    def _express_rows(self, targets: Targets, state: QueueState, built: _MessageBuilder, offset: int,
                      count: int, first_seq: int, row: int, duplicates: list[bool], now_us: int) -> int:
        """The express lane row by row for `count` rows of one queue, from
        `offset` of a frame (`built` from its columns) and `row` of the
        commit, into `targets` (a queue with subscriptions, or with targets
        in this commit already; the others go to `_Fresh.add_rows`).
        Returns the next row."""
        ttl_ms = state.domain.message_ttl_ms
        expires_us = now_us + ttl_ms * 1000 if ttl_ms else 0
        for i in range(offset, offset + count):
            self._decide_and_target(targets, state, built.stored(i, first_seq + row, expires_us), duplicates[row])
            row += 1
        return row

    def _express_frame(self, targets: Targets, state: QueueState, table: pa.Table, first_seq: int, row: int,
                       duplicates: list[bool], now_us: int) -> int:
        """The express lane for a columnar frame to a queue whose apps have no
        subscriptions: every row goes to every app (or, a duplicate, to none),
        so the decision is made once for the frame (one reconciler run) and
        each app gets the frame's rows as one `MessageRun`, its Arrow columns
        as they are: no Python object per row but its GUID. The same outcome
        as `_decide_and_target` row by row. Returns the next row."""
        apps = state.rules.apps
        ttl_ms = state.domain.message_ttl_ms
        count = table.num_rows
        dups = duplicates[row:row + count]
        first = first_seq + row
        self._reconciler.decided_run(first, state, table["guid"], apps, dups)
        seqs = list(range(first, first + count))
        rows = table
        if any(dups):
            keep = [not d for d in dups]
            rows = table.filter(pa.array(keep))
            seqs = [q for q, k in zip(seqs, keep) if k]
            if not seqs:
                return int(row + count)
        run = push_run(rows, seqs, 0, now_us + ttl_ms * 1000 if ttl_ms else 0)
        state.delivered_rows(run.guids, run.sizes, apps)
        for n, app in enumerate(apps):
            targets.setdefault((state, app), []).append(run if n == 0 else run.for_app())
        return int(row + count)

    def _decide(self, state: QueueState, message: StoredMessage, duplicate: bool) -> tuple[str, ...] | None:
        """The express decision for one committed row, recorded for
        reconciliation: the apps it goes to, or None for a duplicate."""
        apps = None if duplicate else state.rules.target_apps(lambda: message.typed_properties)
        self._reconciler.decided(message.seq, state, message.guid, apps)
        return apps

    def _decide_and_target(self, targets: Targets, state: QueueState, message: StoredMessage, duplicate: bool) -> None:
        apps = self._decide(state, message, duplicate)
        if apps is not None:
            _add_targets(targets, state, message, apps)

    def _rows(self, runs: list[tuple[QueueState, int]], guid: Any, payload: Any, properties: Any,
              property_types: Any, producer_us: Any, compression: Any, now_us: int) -> pa.Table:
        """PUT-log rows, numbered from the partition's next sequence number;
        `runs`: their queues, as (queue, consecutive rows), in order. No
        Python object per row: the columns of one value are repeated."""
        counts = [n for _, n in runs]
        count = sum(counts)
        first_seq = self._next_seq
        self._next_seq += count
        domain = queue = None
        if len(runs) > 1:   # a frame spanning queues: its columns by each queue's index
            ids = np.fromiter((q.index for q, _ in runs), np.int64, len(runs))
            if ids.min() >= 0:
                at = np.repeat(ids, counts)
                domains, queues = self._queue_columns()
                domain, queue = domains.take(at), queues.take(at)
        if domain is None or queue is None:
            domain = _repeated([q.uri.domain for q, _ in runs], counts)
            queue = _repeated([q.uri.queue for q, _ in runs], counts)
        return pa.table({
            "domain": domain,
            "queue": queue,
            "guid": guid,
            "seq": pa.array(np.arange(first_seq, first_seq + count, dtype=np.int64)),
            "payload": payload,
            "properties": properties,
            "property_types": property_types,
            "producer_time": producer_us.cast(tables.TIMESTAMP),
            "put_time": pa.repeat(pa.scalar(now_us, tables.TIMESTAMP), count),
            "epoch": pa.repeat(pa.scalar(self.epoch, pa.int64()), count),
            "compression": compression,
        }, schema=tables.PUTS_SCHEMA)

    def _commit_confirms(self, items: list[PendingConfirms]) -> None:
        now = datetime.now(timezone.utc)
        domain, queue, app_id = self._run_columns_of([run for i in items for run in i.runs])
        total = len(domain)
        batch = pa.table({
            "domain": domain,
            "queue": queue,
            "app_id": app_id,
            "guid": pa.array(itertools.chain.from_iterable(i.confirmed.guids for i in items), pa.binary(), size=total),
            "seq": pa.array(itertools.chain.from_iterable(i.confirmed.seqs for i in items), pa.int64(), size=total),
            "confirm_time": pa.repeat(pa.scalar(now, tables.TIMESTAMP), total),
        }, schema=tables.CONFIRMS_SCHEMA)
        # Not fatal for correctness: an unpersisted confirm means the message
        # is delivered again after a restart (at-least-once).
        ok = self._append_or_log(self._confirms, batch, "CONFIRM")
        if ok:
            self.compactors[1].on_commit()
        for i in items:
            if i.committed is not None:
                i.ok = ok
                i.committed.set()

    def _run_columns_of(self, runs: _Runs) -> tuple[pa.Array, pa.Array, pa.Array]:
        """The domain, queue and app columns of confirmed rows, from their
        runs: consecutive (queue, app, rows) runs a part, each `SlotRuns` a
        part taken from `_slot_names`."""
        parts: list[tuple[pa.Array, pa.Array, pa.Array]] = []
        named: list[tuple[QueueState, str, int]] = []

        def close() -> None:
            if named:
                counts = [count for _, _, count in named]
                parts.append((_repeated([state.uri.domain for state, _, _ in named], counts),
                              _repeated([state.uri.queue for state, _, _ in named], counts),
                              _repeated([app for _, app, _ in named], counts)))
                named.clear()

        for run in runs:
            if isinstance(run, SlotRuns):
                close()
                at = np.repeat(run.slots, run.counts)
                parts.append(tuple(column.take(at) for column in self._slot_names()))
            else:
                named.append(run)
        close()
        if len(parts) == 1:
            return parts[0]
        if not parts:
            empty = pa.array([], pa.string())
            return empty, empty, empty
        return tuple(pa.concat_arrays([p[i] for p in parts]) for i in range(3))

    def _append_or_log(self, appender: deltars.Appender, batch: pa.Table, what: str) -> bool:
        """Commit a batch to one of the primary's side logs (confirms, dead
        letters, disagreements), whose loss costs a redelivery or a record,
        never a message. A failure is retried (`SIDE_LOG_RETRIES_S`), then
        logged; fenced, the partition steps down (the new primary delivers
        these messages again)."""
        for attempt, pause_s in enumerate((*SIDE_LOG_RETRIES_S, None)):
            try:
                appender.append(batch)
                return True
            except Fenced:
                self.on_fenced()
                return False
            except Exception:
                if pause_s is None:
                    log.exception("partition %d: %s commit of %d rows failed %d times; given up (after a "
                                  "restart these messages are delivered again)", self.index, what,
                                  batch.num_rows, attempt + 1)
                    return False
                log.warning("partition %d: %s commit of %d rows failed; retrying in %.1f s", self.index, what,
                            batch.num_rows, pause_s, exc_info=True)
                time.sleep(pause_s)
        return False

    def _commit_dead(self, items: list[DeadLetter]) -> None:
        now = datetime.now(timezone.utc)
        props = [(i.message.properties and wire_to_maps(i.message.properties)) or ([], []) for i in items]
        batch = pa.table({
            **_message_columns(items),
            "payload": pa.array([i.message.payload for i in items], pa.binary()),
            "properties": pa.array([p[0] for p in props], tables.PROPERTY_MAP),
            "property_types": pa.array([p[1] for p in props], tables.PROPERTY_MAP),
            "compression": pa.array([COMPRESSION_NAMES.get(i.message.compression) for i in items], pa.string()),
            "producer_time": pa.array([i.message.put_time_us or None for i in items], pa.int64())
            .cast(tables.TIMESTAMP),
            "delivery_count": pa.array([i.message.delivery_count for i in items], pa.int64()),
            "reason": pa.array([i.reason for i in items], pa.string()),
            "detail": pa.array([i.detail for i in items], pa.string()),
            "dead_time": pa.array([now] * len(items), tables.TIMESTAMP),
        }, schema=tables.DEAD_LETTERS_SCHEMA)
        # Like a lost confirm: after a restart the message is delivered again.
        self._append_or_log(self._dead, batch, "dead-letter")

    # -- delivery path ------------------------------------------------------
    def _tail_delivery(self) -> None:
        interval_s = self.config.primary.delivery_poll_interval_ms / 1000
        next_sweep = next_frames = 0.0
        # The first trim a full interval in: none in a partition's first minute
        # (its tests call `_trim_delivery_log` themselves, and must not race one).
        next_trim = time.monotonic() + DELIVERY_TRIM_INTERVAL_S
        while not self._stopping.is_set():
            self._wake.wait(interval_s)
            self._wake.clear()
            try:
                self._catch_up()
                if time.monotonic() >= next_trim:
                    next_trim = time.monotonic() + DELIVERY_TRIM_INTERVAL_S
                    self._trim_delivery_log()
                # The TTL sweep looks at every queue: not on every poll (at
                # 10,000 queues it was 6% of a node's Python time). Dispatch
                # checks TTL itself, so this only records what sits unpushed.
                if time.monotonic() >= next_sweep:
                    next_sweep = time.monotonic() + TTL_SWEEP_INTERVAL_S
                    self.expire()
                if time.monotonic() >= next_frames:
                    next_frames = time.monotonic() + FRAME_HOLD_S / 2
                    self.own_frames()
            except Exception:
                log.exception("partition %d: reading the delivery log failed; retrying", self.index)

    def _catch_up(self) -> None:
        """Reconcile new delivery rows with the express lane's decisions, and
        push what only the pipeline decided (`express.Reconciler`)."""
        # One reader for the life of the partition: a poll with nothing new
        # is a stat, and the pipeline's appends are read from their commit
        # files (`deltars.LogTail`); reopening would replay the whole log.
        if self._delivery_tail is None:
            table = deltars.try_open(self.paths.delivery)
            if table is None:
                return  # the pipeline has not created it yet
            self._delivery_tail = deltars.LogTail(table)
            self._delivery_version = -1
        latest, rows = self._delivery_tail.read_since(self._delivery_version, columns=DELIVERY_COLUMNS)
        if latest <= self._delivery_version:
            return
        judged = self._judged_bound(self._delivery_version, latest)
        pushes: list[tuple[QueueState, int, tuple[str, ...]]] = []
        disagreements: list[Disagreement] = []
        if rows.num_rows:
            rows, states, which = self._delivery_states(rows.sort_by("seq"))
        with self._decisions_lock:
            if rows.num_rows:
                express = np.array([s is not None and s.express for s in states], np.bool_)[which]
                outcomes = self._reconciler.delivered_rows(
                    rows["seq"].combine_chunks().to_numpy(), self._delivery_apps(rows, states, which), express,
                    rows["guid"].combine_chunks())
                for row, outcome in outcomes:
                    if outcome.push_apps:
                        pushes.append((cast(QueueState, states[which[row]]), outcome.seq, outcome.push_apps))
                    if outcome.disagreement is not None:
                        disagreements.append(outcome.disagreement)
            if judged is not None and judged > self._judged_seq:
                self._judged_seq = judged
                disagreements.extend(self._reconciler.judged_through(judged))
        for start in range(0, len(pushes), ROUTE_CHUNK_ROWS):
            self._push_delivered(pushes[start:start + ROUTE_CHUNK_ROWS])
        self._delivery_version = latest
        if disagreements:
            self._record(disagreements)

    def _trim_delivery_log(self) -> int:
        """Delete the delivery log's entries older than
        `maintenance.delivery_log_retention_minutes` that no reader needs:
        those before the newest checkpoint at or below the version this
        primary has read (`deltars.trim_log`). Spark's own cleanup keeps
        everything since a midnight, and every refresh of the log lists it;
        this keeps the log to its retention. Returns the files deleted."""
        if self._delivery_tail is None or self._delivery_version < 0:
            return 0
        keep_s = self.config.maintenance.delivery_log_retention_minutes * 60
        removed = deltars.trim_log(self.paths.delivery, self._delivery_version, keep_s)
        if removed:
            log.info("partition %d: deleted %d delivery-log entries older than %d minutes", self.index, removed,
                     self.config.maintenance.delivery_log_retention_minutes)
        return removed

    def _delivery_states(self, rows: pa.Table) -> tuple[pa.Table, list[QueueState | None], np.ndarray]:
        """Delivery rows of queues this partition knows, each row's queue
        (`states[which[row]]`), looked up once per distinct queue."""
        keys = pc.binary_join_element_wise(rows["domain"], rows["queue"], "/").combine_chunks().dictionary_encode()
        with self.lock:
            found = [self._state_for(*key.split("/", 1)) for key in keys.dictionary.to_pylist()]
        which = keys.indices.to_numpy()
        known = np.array([s is not None for s in found], np.bool_)[which]
        if not known.all():
            rows, which = rows.filter(pa.array(known)), which[known]
        return rows, found, which

    @staticmethod
    def _delivery_apps(rows: pa.Table, states: list[QueueState | None], which: np.ndarray) -> pa.Array:
        """The rows' apps; a null one (a row from before fanout existed) is
        every app of its domain."""
        apps = rows["apps"].combine_chunks()
        if apps.null_count:
            apps = pa.array([a if a is not None else list(cast(QueueState, states[w]).domain.apps)
                             for a, w in zip(apps.to_pylist(), which.tolist())], pa.list_(pa.string()))
        return apps

    def _push_delivered(self, pushes: list[tuple[QueueState, int, tuple[str, ...]]]) -> None:
        """Push delivery rows the express lane did not: their messages come
        from the PUT log, by seq."""
        self._puts_reader.update_incremental()
        self._route_rows(self._put_rows(self._puts_reader, [seq for _, seq, _ in pushes]), pushes)

    def _route_waiting(self, messages: pa.Table, waiting: pa.Table) -> int:
        """Recovery: route each (message, app) still unconfirmed (`waiting`,
        in seq order). Returns the pair count."""
        pushes: list[tuple[QueueState, int, tuple[str, ...]]] = []
        apps: list[str] = []
        domains, queues, seqs, app_ids = (waiting[c].to_pylist() for c in ("domain", "queue", "seq", "app_id"))
        for n, (domain, queue, seq, app) in enumerate(zip(domains, queues, seqs, app_ids)):
            apps.append(app)
            if n + 1 == len(seqs) or seqs[n + 1] != seq:
                state = self._state_for(domain, queue)
                if state is not None:
                    pushes.append((state, seq, tuple(apps)))
                apps = []
        self._route_rows(messages, pushes)
        return sum(len(a) for _, _, a in pushes)

    def _route_rows(self, messages: pa.Table, pushes: list[tuple[QueueState, int, tuple[str, ...]]]) -> None:
        """Route PUT-log rows (`messages`, by seq) to the apps each push names."""
        by_seq = {seq: i for i, seq in enumerate(messages["seq"].to_pylist())}
        built = _MessageBuilder.of_log(messages)
        targets: Targets = {}
        for state, seq, apps in pushes:
            i = by_seq.get(seq)
            if i is None:
                log.error("partition %d: delivery row seq %d has no PUT row: not pushed", self.index, seq)
                continue
            _add_targets(targets, state, built.message(i, state.domain.message_ttl_ms), apps)
        self._route_targets(targets)

    def purge(self, state: QueueState, app: str | None = None, timeout_s: float = 30.0) -> dict[str, int]:
        """Drop every message of the queue (of one app, or of every app) that
        waits or was pushed and not confirmed, and record them in the confirm
        log, so that neither a restart nor a failover brings them back;
        returns how many each app lost. Rows a `delivery = "pipeline"`
        domain still waits on Spark for are not purged (they are not here
        yet). Raises PurgeFailed if the record could not be committed."""
        apps = [app] if app is not None else sorted(state.dispatchers)
        purged: dict[str, int] = {}
        items: list[tuple[str, PendingConfirms]] = []
        with self._push_lock, self.lock:
            for a in apps:
                dispatcher = state.dispatchers.get(a)
                rows = dispatcher.purge() if dispatcher is not None else ConfirmedRows([], [])
                purged[a] = len(rows.seqs)
                if rows.seqs:
                    state.apps_done(rows.guids, a)
                    items.append((a, PendingConfirms.of(state, a, rows, threading.Event())))
        if items:
            if not self.confirm_committer.submit([i for _, i in items], 0, sum(purged.values())):
                raise PurgeFailed(f"partition {self.index} is stopping: the purge of {sum(purged.values())} "
                                  "messages was not recorded")
            for a, i in items:
                if not (i.committed is not None and i.committed.wait(timeout_s) and i.ok):
                    raise PurgeFailed(f"partition {self.index}: the confirm log commit recording the purge of "
                                      f"{len(i.confirmed.seqs)} messages of app {a!r} failed "
                                      "(see the log)")
        log.info("partition %d: purged %s of %s", self.index,
                 ", ".join(f"{n} messages of app {a!r}" for a, n in purged.items()) or "nothing", state.uri)
        return purged

    def _push(self, pushes: list[Push]) -> None:
        """Send pushes (the caller holds the push lock) and time them (metrics)."""
        self.on_pushes(pushes)
        self.metrics.observe_pushes(pushes)

    def _route_targets(self, targets: Targets, fresh: "Sequence[_Fresh]" = ()) -> None:
        """Hand messages to each target app's dispatcher (each list in seq
        order), then send the pushes together, merged by sequence number (each
        app's own order kept): a message going to several apps below one link
        then goes down that link once (`send_pushes`). `fresh` first: frames'
        rows of many queues, each taken at once by its queue's sole consumer
        (`take_fresh`), or else ahead of that queue's `targets`."""
        with self._push_lock:
            first: list[Push] = []
            with self.lock:   # (held on through `_dispatch_all`)
                if fresh:
                    targets = self._take_fresh(fresh, targets, first)
                routed, dropped = self._dispatch_all(
                    (state, app, functools.partial(QueueDispatcher.add_messages, messages=messages))
                    for (state, app), messages in targets.items())
            routed = [pushes for pushes in [first, *routed] if pushes]
            if len(routed) == 1:
                self._push(routed[0])
            elif routed:
                # A stable sort of the concatenation is that merge (ties keep the
                # apps' order), in C: heapq.merge over 10,000 queues' lists was 17%
                # of a node's Python time.
                self._push(sorted(itertools.chain.from_iterable(routed), key=lambda push: push[1].seq))
        for state, app, messages in dropped:
            self._dead_letter(state, app, messages)

    def _take_fresh(self, fresh: "Sequence[_Fresh]", targets: Targets, pushes: list[Push]) -> Targets:
        """`fresh` through `take_fresh` (the caller holds the lock): what its
        sole consumers take at once into `pushes` as one SharedPush a frame,
        and the targets with the rest ahead of each queue's own."""
        spilled: set[QueueDispatcher] = set()
        rest: Targets = {}
        now_us = wall_time_us()
        ledger = self.ledger
        for f in fresh:
            slots = np.asarray(f.slots, np.int64)
            for i in np.flatnonzero(slots < 0).tolist():   # (a queue's first consumer's dispatcher is made here)
                state, app = f.targets[i]
                slots[i] = state.dispatcher(app)._slot
            taken, keys, left = take_fresh_held(ledger, _TargetDispatchers(f.targets), f.runs, f.rows, now_us,
                                                spilled, slots)
            if taken:
                pushes.append((None, SharedPush([f.runs[n] for n in taken], [f.rows[n] for n in taken], keys)))
            for n, message in zip(left, spilled_messages(f.runs, f.rows, left)):
                rest.setdefault(f.targets[n], []).append(message)
        if not rest:
            return targets
        for key, messages in targets.items():   # (later seqs than the rest: `_express`)
            rest.setdefault(key, []).extend(messages)
        return rest

    def _put_rows(self, table: DeltaTable, seqs: list[int]) -> pa.Table:
        """PUT-log rows by seq (the delivery log has no payloads). The seq
        range prunes files by their statistics before the exact match."""
        if not seqs:
            return _columns_of(tables.PUTS_SCHEMA, MESSAGE_COLUMNS).empty_table()
        wanted = pa.array(sorted(set(seqs)), pa.int64())
        condition = ((pc.field("seq") >= wanted[0]) & (pc.field("seq") <= wanted[-1])
                     & pc.field("seq").isin(wanted))
        rows = table.to_pyarrow_dataset().to_table(columns=MESSAGE_COLUMNS, filter=condition)
        return deltars.without_views(rows).sort_by("seq")

    def _judged_bound(self, after_version: int, latest: int) -> int | None:
        """The highest PUT seq the pipeline has judged, from the newest
        delivery commit after `after_version`, up to `latest` (the version of
        the rows in hand), that records its PUT version (`pipelines/dedup.py`);
        None when none does. A commit past `latest` must not count: its rows
        are not in hand, and they would pass for judged and routed."""
        assert self._delivery_tail is not None
        for version in range(latest, after_version, -1):
            info = deltars.commit_info(self._delivery_tail.table, version)
            meta = (info or {}).get("userMetadata")
            if not meta:
                continue
            try:
                value = json.loads(meta).get(tables.DELIVERY_PUTS_VERSION_KEY)
            except (ValueError, AttributeError):
                continue
            if isinstance(value, int):  # the pipeline's judged PUT version only grows
                self._judged_puts_version = value
                return self._seq_at(value)
        return None

    def _puts_log_needed_from(self) -> int | None:
        """The oldest PUT-log version a reader may still read, for trimming
        the log (`Compactor`): the dedup stream resumes at its last committed
        offset and records the version before it as judged, and this
        primary reads the PUT log at a judged version it has not committed
        itself (`_seq_at`). None while the stream's progress is unknown."""
        resume = tables.stream_resume_version(self.paths.dedup_checkpoint)
        if resume is None:
            return None
        judged = self._judged_puts_version
        needed = resume - 1 if judged is None else min(resume - 1, judged)
        # Each federation link reads on from the version after its progress.
        return min([needed, *(forwarder.needed_version for forwarder in self.links)])

    def express_held(self) -> tuple[int, int, int]:
        """What the express lane holds in memory: the GUIDs of its dedup
        window and the bytes they take, and the decisions waiting for the
        pipeline's delivery rows."""
        with self._decisions_lock:
            return len(self._history), self._history.nbytes, len(self._reconciler)

    def delivery_versions_read(self) -> tuple[int, int]:
        """The delivery log's versions this primary's tail has read: from
        their commit files, and through delta-rs's change feed."""
        tail = self._delivery_tail
        return (0, 0) if tail is None else (tail.read_directly, tail.read_by_delta_rs)

    def oldest_unjudged_commit(self) -> float | None:
        """When this primary's oldest commit the pipeline has not judged yet
        was made (wall clock), or None."""
        with self._decisions_lock:
            judged = self._judged_seq
            for _, last_seq, made in self._commit_seqs:
                if last_seq > judged:
                    return made
        return None

    def _seq_at(self, puts_version: int) -> int:
        """The last seq committed at or before a PUT-log version: this
        primary's own commits are remembered (under `_decisions_lock`); older
        ones are read from the log's file statistics at that version."""
        with self._decisions_lock:
            commits = self._commit_seqs
            if commits and commits[0][0] <= puts_version:
                i = bisect.bisect_right(commits, (puts_version, float("inf"), 0.0)) - 1
                seq = commits[i][1]
                for _ in range(i):  # the pipeline moves forward: drop what it has passed
                    commits.popleft()
                return seq
        try:
            return _max_stat(DeltaTable(self.paths.puts, version=puts_version), "seq")
        except Exception:
            log.warning("partition %d: PUT log version %d not readable; judged seq unknown for now",
                        self.index, puts_version, exc_info=True)
            return self._judged_seq

    def _record(self, disagreements: list[Disagreement]) -> None:
        """Log each disagreement with both decisions and write them to the
        partition's disagreements table (`taproot_disagreements`)."""
        self.disagreements_total += len(disagreements)
        for d in disagreements[:DISAGREEMENTS_LOGGED_MAX]:
            state = d.key
            log.warning("partition %d: express lane and pipeline disagree (%s) on taproot://%s/%s %s",
                        self.index, d.kind, state.uri.domain, state.uri.queue, d.describe())
        if len(disagreements) > DISAGREEMENTS_LOGGED_MAX:
            log.warning("partition %d: %d more disagreements (see taproot_disagreements)", self.index,
                        len(disagreements) - DISAGREEMENTS_LOGGED_MAX)
        now = datetime.now(timezone.utc)

        def apps(values: Iterable[Any]) -> pa.Array:
            return pa.array([None if v is None else list(v) for v in values], pa.list_(pa.string()))
        batch = pa.table({
            "domain": pa.array([d.key.uri.domain for d in disagreements], pa.string()),
            "queue": pa.array([d.key.uri.queue for d in disagreements], pa.string()),
            "guid": pa.array([d.guid for d in disagreements], pa.binary()),
            "seq": pa.array([d.seq for d in disagreements], pa.int64()),
            "express_apps": apps(d.express_apps for d in disagreements),
            "pipeline_apps": apps(d.pipeline_apps for d in disagreements),
            "late_apps": apps(d.late_apps for d in disagreements),
            "kind": pa.array([d.kind for d in disagreements], pa.string()),
            "epoch": pa.array([self.epoch] * len(disagreements), pa.int64()),
            "detected_time": pa.array([now] * len(disagreements), tables.TIMESTAMP),
        }, schema=tables.DISAGREEMENTS_SCHEMA)
        self._append_or_log(self._disagreements, batch, "disagreement")


def _add_targets(targets: Targets, state: QueueState, message: StoredMessage, apps: tuple[str, ...]) -> None:
    """Count the message against its quota until `apps` are done, and queue
    it for each app (one StoredMessage per app, sharing payload and properties)."""
    state.delivered(message, apps)
    for n, app in enumerate(apps):
        targets.setdefault((state, app), []).append(message if n == 0 else message.for_app())


class _TargetDispatchers(Sequence[QueueDispatcher]):
    """The dispatcher of each (queue, app) target, looked up when asked (the
    caller holds the partition's lock): `take_fresh_held` asks only for
    the rows the ledger does not take."""

    __slots__ = ("_targets",)

    def __init__(self, targets: list[tuple[QueueState, str]]):
        self._targets = targets

    def __len__(self) -> int:
        return len(self._targets)

    @overload
    def __getitem__(self, i: int) -> QueueDispatcher: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[QueueDispatcher]: ...

    def __getitem__(self, i: int | slice) -> QueueDispatcher | Sequence[QueueDispatcher]:
        if isinstance(i, slice):
            return [state.dispatcher(app) for state, app in self._targets[i]]
        state, app = self._targets[i]
        return state.dispatcher(app)


class _Fresh:
    """Rows of one committed PUT frame spanning queues for `take_fresh`: per
    (row, app) the row of the frame, its run (`run`: the frame's rows as one
    MessageRun per expiry, sharing its columns) and the queue and app it
    goes to, in seq order. No StoredMessage is made for a row: its queue's
    consumer holds it as (run, row)."""

    __slots__ = ("table", "first_seq", "guids", "rows", "runs", "targets", "slots", "_runs")

    def __init__(self, table: pa.Table, first_seq: int, guids: list[bytes]):
        self.table, self.first_seq, self.guids = table, first_seq, guids   # (first_seq: the seq of row 0)
        self.rows: list[int] = []
        self.runs: list[MessageRun] = []
        self.targets: list[tuple[QueueState, str]] = []
        self.slots: list[int] = []   # each target's dispatcher's ledger slot, if known (else -1)
        self._runs: dict[int, FrameRun] = {}

    def run(self, expires_us: int) -> FrameRun:
        """The frame's rows as a run delivered once, expiring at `expires_us`."""
        run = self._runs.get(expires_us)
        if run is None:
            if self._runs:
                run = next(iter(self._runs.values())).sharing(expires_us)
            else:
                table = self.table
                seqs = list(range(self.first_seq, self.first_seq + table.num_rows))
                run = FrameRun(_run_columns(table, seqs), self.guids, seqs,
                               pc.binary_length(table["payload"]).to_pylist(), 1, expires_us, wall_time_us())
            self._runs[expires_us] = run
        return run

    def add(self, row: int, state: QueueState, run: MessageRun, apps: tuple[str, ...]) -> None:
        """Row `row` for each of `apps`, counted against the quota as
        `_add_targets` counts a message."""
        state.delivered_rows([run.guids[row]], [run.sizes[row]], apps)
        for app in apps:
            self.rows.append(row)
            self.runs.append(run)
            self.targets.append((state, app))
            self.slots.append(-1)


class _Decisions:
    """Express decisions of rows in seq order, handed to the reconciler in
    one call (`Reconciler.decided_rows`); flushed before any other decision
    of the commit is recorded, so the reconciler sees every row in order."""

    __slots__ = ("seqs", "keys", "guids", "apps")

    def __init__(self) -> None:
        self.seqs: list[int] = []
        self.keys: list[QueueState] = []
        self.guids: list[bytes] = []
        self.apps: list[tuple[str, ...] | None] = []

    def flush(self, reconciler: Reconciler) -> None:
        """To the reconciler, and cleared in place (the lists stay the
        caller's: the reconciler keeps copies)."""
        if self.seqs:
            reconciler.decided_rows(self.seqs, self.keys, self.guids, self.apps)
            for rows in (self.seqs, self.keys, self.guids, self.apps):
                rows.clear()


class _MessageBuilder:
    """StoredMessages from rows' columns: PUT-log rows (`MESSAGE_COLUMNS`,
    `of_log`), or a PUT frame's rows just committed (`of_frame`: their seqs
    and commit time are the commit's, not columns)."""

    def __init__(self, guid: list[Any], payload: list[Any], values: list[Any], types: list[Any],
                 compression: list[Any], producer: list[Any], seq: list[Any] | None = None,
                 put_time: list[Any] | None = None):
        self.guid, self.payload, self.values, self.types = guid, payload, values, types
        self.compression, self.producer, self.seq, self.put_time = compression, producer, seq, put_time

    @classmethod
    def of_log(cls, rows: pa.Table) -> "_MessageBuilder":
        guid, payload, values, types, compression, seq = (
            rows[c].to_pylist() for c in ("guid", "payload", "properties", "property_types", "compression", "seq"))
        return cls(guid, payload, values, types, compression, rows["producer_time"].cast(pa.int64()).to_pylist(),
                   seq, rows["put_time"].cast(pa.int64()).to_pylist())

    @classmethod
    def of_frame(cls, table: pa.Table) -> "_MessageBuilder":
        guid, payload, values, types, compression = (
            table[c].to_pylist() for c in ("guid", "payload", "properties", "property_types", "compression"))
        producer = table[PUT_TIME].to_pylist() if PUT_TIME in table.column_names else [None] * table.num_rows
        return cls(guid, payload, values, types, compression, producer)

    def message(self, i: int, ttl_ms: int) -> StoredMessage:
        """Row `i` of PUT-log rows, expiring `ttl_ms` after its commit."""
        assert self.seq is not None and self.put_time is not None
        return self.stored(i, self.seq[i], self.put_time[i] + ttl_ms * 1000 if ttl_ms else 0)

    def stored(self, i: int, seq: int, expires_us: int) -> StoredMessage:
        return StoredMessage(self.guid[i], seq, self.payload[i], None, self.producer[i] or 0, expires_us=expires_us,
                             compression=COMPRESSION_CODES.get(self.compression[i] or "", 0),
                             maps=(self.values[i], self.types[i]) if self.values[i] else None)


def _columns_of(schema: pa.Schema, names: list[str]) -> pa.Schema:
    return pa.schema([schema.field(n) for n in names])


def _max_of(values: pa.ChunkedArray) -> int:
    value = pc.max(values).as_py() if len(values) else None
    return -1 if value is None else int(value)


def _per_app(targets: pa.Table, domains: Mapping[str, DomainConfig]) -> pa.Table:
    """(domain, queue, guid, seq, apps) -> one row per (message, app). A null
    `apps` (a row from before fanout existed) means every app of its domain."""
    apps = targets["apps"]
    if apps.null_count:
        filled = [a if a is not None else list(domains[d].apps) if d in domains else [""]
                  for d, a in zip(targets["domain"].to_pylist(), apps.to_pylist())]
        apps = pa.chunked_array([pa.array(filled, pa.list_(pa.string()))])
    flat = apps.combine_chunks() if isinstance(apps, pa.ChunkedArray) else apps
    exploded = targets.select(["domain", "queue", "guid", "seq"]).take(pc.list_parent_indices(flat))
    return exploded.append_column("app_id", pc.list_flatten(flat))


def _unfinished(per_app: pa.Table, done: list[pa.Table]) -> pa.Table:
    """`per_app` minus every (guid, app_id) in `done` (confirms, dead letters): an Arrow anti-join."""
    for table in done:
        if table.num_rows and per_app.num_rows:
            per_app = per_app.join(deltars.without_views(table), keys=["guid", "app_id"], join_type="left anti")
    return per_app.sort_by("seq")


def _expire(dispatcher: QueueDispatcher) -> list[Push]:
    dispatcher.expire()
    return []


def _compression_codes(names: "pa.Array | pa.ChunkedArray") -> pa.Array:
    """The tables' compression names as the wire's codes (int8; null: none)."""
    if names.null_count == len(names):
        return pa.array(np.zeros(len(names), np.int8))
    return pa.array([COMPRESSION_CODES.get(n or "", 0) for n in names.to_pylist()], pa.int8())


def _max_stat(table: DeltaTable, column: str) -> int:
    """Max of an int64/timestamp column from file statistics (no data read); -1 when empty."""
    actions = pa.table(table.get_add_actions(flatten=True))
    name = f"max.{column}"
    if actions.num_rows == 0 or name not in actions.column_names:
        return -1
    values = actions[name]
    if pa.types.is_timestamp(values.type):
        values = values.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
    value = pc.max(values).as_py()
    return -1 if value is None else int(value)


def _on_a_thread(task: Callable[[], None]) -> Callable[[], None]:
    """Run `task` (a GUID history's generation build) on a daemon thread of
    its own; returns the wait for it. A failure is logged: the history then
    keeps the young tables it was building from."""
    def run() -> None:
        try:
            task()
        except Exception:
            log.exception("building a GUID history generation failed; its young tables stay in use")

    thread = threading.Thread(target=run, name="guid-history-freeze", daemon=True)
    thread.start()
    return thread.join


def queue_runs(queues: Iterable[Q]) -> list[tuple[Q, int]]:
    """Rows' queues (states, or ids) as runs: each queue and how many of the
    rows come next. (A plain loop: `itertools.groupby` makes a group a run,
    most of the cost when a frame holds a row of each of many queues.)"""
    runs: list[list[Any]] = []
    last: Any = _NONE
    for queue in queues:
        if queue == last:
            runs[-1][1] += 1
        else:
            runs.append([queue, 1])
            last = queue
    return [(queue, count) for queue, count in runs]


def id_runs(ids: Sequence[int]) -> list[tuple[int, int]]:
    """`queue_runs` of queue ids, with numpy: a frame spanning thousands of
    queues has a run (often a row) of each."""
    a = np.asarray(ids, np.int64)
    if not len(a):
        return []
    starts = np.flatnonzero(np.concatenate(([True], a[1:] != a[:-1])))
    counts = np.diff(np.append(starts, len(a)))
    return list(zip(a[starts].tolist(), counts.tolist()))


def _repeated(values: list[str], counts: list[int]) -> pa.Array:
    """Each value `count` times, in order, as a string column (an Arrow take:
    a CONFIRM commit of thousands of queues has an item or two per queue)."""
    if len(values) == 1:
        return pa.repeat(pa.scalar(values[0], pa.string()), counts[0])   # a frame of one queue
    column = pa.array(values, pa.string())
    times = np.asarray(counts, np.int64)
    if (times == 1).all():
        return column
    return column.take(np.repeat(np.arange(len(times)), times))


def _message_columns(items: "list[DeadLetter]") -> dict[str, pa.Array]:
    """Which message, for which app (the dead-letter log's first columns)."""
    return {
        "domain": pa.array([i.queue.uri.domain for i in items], pa.string()),
        "queue": pa.array([i.queue.uri.queue for i in items], pa.string()),
        "app_id": pa.array([i.app_id for i in items], pa.string()),
        "guid": pa.array([i.message.guid for i in items], pa.binary()),
        "seq": pa.array([i.message.seq for i in items], pa.int64()),
    }
