"""The session's core, sans I/O: what the SDK does with frames, whatever
carries them.

`SessionCore` holds a session's state: its connection state, its open queues,
the retransmission buffer (`protocol.retransmit`, the one every relay hop
keeps), the PUT and CONFIRM batches and the requests waiting for an answer.
Calls come in (a post, a frame from the broker, a connection made or lost, the
time); what to do goes out in `Effects`: frames to send on the current stream,
PUTs answered, requests answered, pushes to deliver, queues that ended and
events to report. No threads, no sockets, no clock: times come in as `now_ms`.
Not thread safe: `taproot.session.Session` (the thread and gRPC shell)
serialises calls under its lock and carries the effects out.

Tokens are the shell's: whatever it wants back when a PUT or a request is
answered (its futures). The core never looks inside them.
"""

from __future__ import annotations

import enum
import itertools
import logging
from dataclasses import dataclass, field
from typing import Any, Iterable, NamedTuple, Sequence

from protocol import ResultCode, columns, pb
from protocol.frames import frame_of, wrapped
from protocol.limits import CONFIRM_FRAME_MESSAGES_MAX, PUT_FRAME_MESSAGES_MAX
from protocol.retransmit import Held, RetransmissionBuffer, RetransmissionLimits, put_frames
from protocol.seqs import confirm_columns
from protocol.seqs import ranges as seq_ranges
from taproot import events
from taproot.batching import Batcher, BatchPolicy
from taproot.errors import AckError, ConnectionError, TaprootError

log = logging.getLogger(__name__)

EXPIRY_INTERVAL_MS = 500.0      # how often the buffer's time bound is checked


class ConnectionState(enum.Enum):
    """Where a session stands with its broker.

    | state        | PUTs                         | requests | CONFIRMs | next                        |
    |--------------|------------------------------|----------|----------|-----------------------------|
    | DISCONNECTED | buffered; refused past a bound | wait   | dropped  | CONNECTED, LOST, STOPPED    |
    | CONNECTED    | sent; a full buffer blocks   | sent     | sent     | HELD, DISCONNECTED, LOST,   |
    |              |                              |          |          | STOPPED                     |
    | HELD         | buffered for the next host   | sent     | sent     | DISCONNECTED, LOST, STOPPED |
    | LOST         | failed UNKNOWN               | fail     | fail     | (final)                     |
    | STOPPED      | failed CANCELED              | fail     | fail     | (final)                     |

    DISCONNECTED is also where a session starts (not started yet) and where
    it waits between hosts. HELD: the host sent StopRequest (it is stopping).
    LOST: the connection went and the session does not reconnect.
    """
    DISCONNECTED = "disconnected"
    CONNECTED = "connected"
    HELD = "held"
    LOST = "lost"
    STOPPED = "stopped"

    linked: bool   # a stream is up (frames can be sent): CONNECTED, HELD
    final: bool    # LOST, STOPPED

    def __init__(self, value: str) -> None:
        # Plain attributes, not properties: `linked` is asked at every PUT
        # and CONFIRM, and a property cost half the time of the rest of a
        # CONFIRM's check.
        self.linked = value in ("connected", "held")
        self.final = value in ("lost", "stopped")


class Ack(NamedTuple):
    """A PUT's ACK: its GUID, durable in `queue_uri`. Immutable. A named
    tuple, not a frozen dataclass: a producer gets one per message, and a
    frozen dataclass's constructor sets each field through
    `object.__setattr__` (0.32 us a message against 0.13)."""
    guid: bytes
    queue_uri: str

    @property
    def guid_hex(self) -> str:
        """The GUID as Taproot writes it everywhere (uppercase hex, as
        `taproot.guid.guid_hex`, which this pure core may not import)."""
        return self.guid.hex().upper()

    def __repr__(self) -> str:
        return f"Ack(guid={self.guid_hex}, queue_uri={self.queue_uri!r})"


# `Ack(guid, uri)` as `_new_tuple(Ack, (guid, uri))`, for a frame's rows: the
# named tuple's own `__new__` is Python code (0.23 us against 0.13).
_new_tuple = tuple.__new__


@dataclass
class QueueRecord:
    """What the core knows of an open queue (the shell's `Queue` wraps it)."""
    queue_id: int
    uri: str
    read: bool
    write: bool
    open_request: pb.OpenQueue = field(default_factory=pb.OpenQueue)  # what reopens it
    options: pb.QueueOptions = field(default_factory=pb.QueueOptions)  # consumer options in force
    max_payload_bytes: int = 0
    timeout_ms: float = 0.0          # retransmission bound: min(the session's, the domain's dedup window)
    open: bool = False               # open on the current stream: its PUTs may go
    broadcast: bool = False          # broadcast mode: PUSHes are not confirmed
    partition: int = 0               # its storage partition: a PUT frame spans queues of one


@dataclass
class _Pending:
    """One entry of the retransmission buffer: a PutColumns frame, sent (or
    to be sent) as it is and answered as a whole, or one PutMessage (a
    queue's few PUTs of a batch travel as PutMessages)."""
    token: Any                       # a post_columns frame's or a PutMessage's future (None: `tokens`)
    queue: QueueRecord               # (a frame spanning queues: its first row's)
    frame: pb.PutColumns | pb.PutMessage
    guids: bytes                     # the frame's GUIDs, 16 bytes each (the buffer's key)
    tokens: Sequence[Any] | None = None  # a frame of single PUTs (`post()`): each row's future
    row_queues: list[QueueRecord] | None = None   # a frame spanning queues: each row's queue

    @property
    def spanned(self) -> list[QueueRecord]:
        """The queues it is for, each once."""
        if self.row_queues is None:
            return [self.queue]
        return list({id(q): q for q in self.row_queues}.values())

    def group(self) -> int | list[int]:
        """What it waits for on a new stream: its queue's reopen, or all of theirs."""
        return self.queue.queue_id if self.row_queues is None else [q.queue_id for q in self.spanned]


@dataclass
class _Request:
    token: Any                       # None: the core's own reopen, or an open nobody waits for
    kind: str
    queue_id: int


@dataclass
class Effects:
    """What the shell must carry out after a call, in this order. `take()`
    hands back `NO_EFFECTS` when a call had none (most posts): the shell
    reads it and may empty its `frames`, never adds to it."""
    frames: list[pb.Frame] = field(default_factory=list)               # send, in order, on the current stream
    answered: list[tuple[Any, Any]] = field(default_factory=list)      # (PUT token, Ack | [guids] | AckError)
    responses: list[tuple[Any, Any]] = field(default_factory=list)     # (request token, response | TaprootError)
    pushes: list[pb.PushMessage] = field(default_factory=list)
    push_frames: list[pb.PushColumns] = field(default_factory=list)   # columnar PUSHes, decoded by the shell
    closed: list[int] = field(default_factory=list)                    # queue ids that ended
    events: list[events.SessionEvent] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.frames or self.answered or self.responses or self.pushes or self.push_frames
                    or self.closed or self.events)


# What `SessionCore.confirm` leaves the shell to do.
CONFIRM_HELD, CONFIRM_LINGERS, CONFIRM_SENT = 0, 1, 2

NO_EFFECTS = Effects()   # what `take()` returns when there is nothing to do: no seven new lists per post


class Put:
    """One `post()` PUT from the shell until it is sealed into a frame.
    Most travel as rows of a PutColumns frame, so none pays for a
    `pb.PutMessage` (0.7 us to build) unless it goes as one (`message`).
    The core takes a `pb.PutMessage` as well: both have these fields."""

    __slots__ = ("guid", "payload", "properties", "put_time_us", "compression")

    def __init__(self, guid: bytes, payload: bytes, properties: list[pb.Property], put_time_us: int,
                 compression: int):
        self.guid, self.payload, self.properties = guid, payload, properties
        self.put_time_us, self.compression = put_time_us, compression

    def message(self, queue_id: int) -> pb.PutMessage:
        return pb.PutMessage(queue_id=queue_id, guid=self.guid, payload=self.payload,
                             properties=self.properties,
                             put_time_us=self.put_time_us, compression=self.compression)  # type: ignore[arg-type]


def confirm_frames(confirms: dict[int, list[int]],
                   frame_max: int = CONFIRM_FRAME_MESSAGES_MAX) -> list[pb.Frame]:
    """CONFIRMs ({queue id: seqs}) as ConfirmColumns frames of seq ranges,
    each naming at most `frame_max` messages. The queues share frames: a
    frame of one queue names it in `queue_id`, a frame of several names each
    range's queue in `queue_ids` (a session consuming thousands of queues
    sends one frame, not one per queue)."""
    frames: list[pb.Frame] = []
    part: dict[int, tuple[list[int], list[int]]] = {}
    room = frame_max
    for queue_id, seqs in confirms.items():
        for start, count in zip(*seq_ranges(seqs)):
            while count:
                n = min(count, room)
                starts, counts = part.setdefault(queue_id, ([], []))
                starts.append(start)
                counts.append(n)
                start, count, room = start + n, count - n, room - n
                if not room:
                    frames.append(pb.Frame(confirm_columns=confirm_columns(part)))
                    part, room = {}, frame_max
    if part:
        frames.append(pb.Frame(confirm_columns=confirm_columns(part)))
    return frames


class SessionCore:
    def __init__(self, *, batch: BatchPolicy | None = None, limits: RetransmissionLimits | None = None,
                 reconnect: bool = True):
        self.batch_policy = batch or BatchPolicy()
        self.limits = limits or RetransmissionLimits()
        self.reconnect = reconnect
        self.state = ConnectionState.DISCONNECTED
        self.lost_reason: str | None = None
        self.host: str | None = None
        self.connections = 0
        self.queues: dict[int, QueueRecord] = {}
        self.buffer: RetransmissionBuffer[bytes, _Pending] = RetransmissionBuffer(self.limits)
        self._puts = Batcher(self.batch_policy)
        self._batch_queue: QueueRecord | None = None   # the batch's one queue; None when it spans several
        self._confirms: dict[int, list[int]] = {}     # queue id -> seqs to confirm, in order
        self._confirm_count = 0
        self._confirms_since_ms = 0.0
        self._requests: dict[int, _Request] = {}
        self._reopens: dict[int, int] = {}            # reopen request id -> queue id
        # Queues closed by a refused reopen: why (a PUT the application posts
        # before its shell learns the queue is gone gets that code, not CANCELED).
        self._refused: dict[int, tuple[ResultCode, str]] = {}
        self._restored: list[str] = []                # queues reopened on this connection
        self._not_restored: list[str] = []
        self._request_ids = itertools.count(1)
        self._next_expiry_ms = 0.0
        self._effects = Effects()

    # -- effects --------------------------------------------------------------
    def take(self) -> Effects:
        effects = self._effects
        if not effects:
            return NO_EFFECTS
        self._effects = Effects()
        return effects

    def _send(self, frame: pb.Frame) -> None:
        self._effects.frames.append(frame)

    @property
    def batched(self) -> int:
        """PUTs in the batch waiting for its linger time."""
        return len(self._puts.items)

    @property
    def sending(self) -> bool:
        """PUTs go out now (rather than wait in the buffer for a host)."""
        return self.state is ConnectionState.CONNECTED

    def failure(self) -> TaprootError | None:
        """Why nothing more can be done, once the session is LOST or STOPPED."""
        if self.state is ConnectionState.LOST:
            return ConnectionError(self.lost_reason or "connection lost")
        if self.state is ConnectionState.STOPPED:
            return ConnectionError("session is stopped")
        return None

    # -- the connection ---------------------------------------------------------
    def connected(self, host: str, now_ms: float) -> None:
        """A stream to `host` is up. After the first: abandon the requests of
        the lost stream and reopen every queue; as each reopen succeeds, resend
        that queue's unacknowledged PUTs in PUT order (a node may take a while
        to answer an open during a failover: PUTs sent ahead of it would find
        no open queue)."""
        assert not self.state.final, self.state
        first = self.connections == 0
        self.connections += 1
        self.host = host
        self.state = ConnectionState.CONNECTED
        if first:
            self._effects.events.append(events.Connected(host))
            return
        stale, self._requests, self._reopens = self._requests, {}, {}
        # An open the application still waits for is carried over: the queue
        # is reopened below like every other, and that reopen's answer is its
        # answer. Failing it while reopening it would leave a consumer on the
        # broker that the application never got (messages held by nobody).
        carried = {r.queue_id: r.token for r in stale.values()
                   if r.kind == "open_queue" and r.token is not None and r.queue_id in self.queues}
        for request in stale.values():
            if request.token is not None and not (request.kind == "open_queue" and request.queue_id in carried):
                self._effects.responses.append((request.token, ConnectionError("connection lost; request abandoned")))
        self._restored, self._not_restored = [], []
        for q in self.queues.values():
            q.open = False
            request = pb.OpenQueue()
            request.CopyFrom(q.open_request)
            if q.read:
                request.options.CopyFrom(q.options)
            request.request_id = next(self._request_ids)
            self._requests[request.request_id] = _Request(carried.get(q.queue_id), "open_queue", q.queue_id)
            self._reopens[request.request_id] = q.queue_id
            self._send(pb.Frame(open_queue=request))
        self._seal()  # batched PUTs become frames, held (no queue is open on this stream yet)
        self.buffer.defer_all(lambda _, held: held.item.group())  # each goes with its queue's reopen
        self._effects.events.append(events.Reconnected(host, self.buffer.messages))
        if not self._reopens:
            self._effects.events.append(events.StateRestored(host, 0, ()))

    def _resend(self, queue_id: int) -> int:
        """The buffered frames of one queue not sent on this stream, as they
        were, in PUT order; then what was batched meanwhile (newer)."""
        held = self.buffer.take_deferred(queue_id, self._queue_open)
        self._effects.frames.extend(put_frames((h.item.frame for h in held), PUT_FRAME_MESSAGES_MAX))
        self._seal()
        return sum(h.count for h in held)

    def _queue_open(self, queue_id: Any) -> bool:
        q = self.queues.get(queue_id)
        return q is not None and q.open

    def connection_lost(self, reason: str) -> None:
        """The stream ended. With `reconnect`, everything waits for the next
        host (the shell dials it and calls `connected`); without, every PUT
        and request fails UNKNOWN."""
        if not self.state.linked:
            return
        host = self.host or "?"
        if not self.reconnect:
            self.lost_reason = f"connection to {host} lost ({reason})"
            self._end(ConnectionState.LOST, ResultCode.UNKNOWN, self.lost_reason)
            return
        self.state = ConnectionState.DISCONNECTED
        self._effects.events.append(events.ConnectionLost(host, reason, self.pending))

    def stop(self) -> None:
        """The application stopped the session: every PUT still waiting fails CANCELED."""
        if not self.state.final:
            self._end(ConnectionState.STOPPED, ResultCode.CANCELED, "session stopped")

    def _end(self, state: ConnectionState, code: ResultCode, reason: str) -> None:
        self.state = state
        self._seal()   # not sent (the state is final): answered below with the rest
        self._confirms, self._confirm_count = {}, 0
        for _, held in self.buffer.clear():
            self._answer(held, code, reason)
        requests, self._requests, self._reopens = self._requests, {}, {}
        for request in requests.values():
            if request.token is not None:
                self._effects.responses.append((request.token, ConnectionError(reason)))
        self._effects.closed.extend(self.queues)

    # -- requests (open, configure, close) ---------------------------------------
    def request(self, frame: pb.Frame, kind: str, token: Any) -> int:
        """Send a request (the state must be linked); its answer comes back as
        `(token, response)` in `Effects.responses`. Returns its request id."""
        assert self.state.linked, self.state
        request_id = next(self._request_ids)
        body = getattr(frame, kind)
        body.request_id = request_id
        self._requests[request_id] = _Request(token, kind, body.queue_id)
        self._send(frame)
        return request_id

    def forget(self, request_id: int) -> None:
        """The shell stopped waiting for this request (its timeout). An open
        stays known without its token: if it succeeds after all, its queue is
        closed on the broker (`_respond`)."""
        request = self._requests.get(request_id)
        if request is not None and request.kind == "open_queue":
            request.token = None
        else:
            self._requests.pop(request_id, None)

    def add_queue(self, record: QueueRecord) -> None:
        """Known from before its open is answered: PUSHes may follow the answer at once."""
        record.timeout_ms = self.limits.timeout_ms
        self.queues[record.queue_id] = record

    def opened(self, queue_id: int, response: pb.OpenQueueResponse) -> None:
        """Apply a successful open's answer: the payload limit, the time bound
        of the retransmission buffer, the consumer options in force."""
        q = self.queues.get(queue_id)
        if q is None:
            return
        was_open, q.open = q.open, True
        q.max_payload_bytes = response.max_payload_bytes
        q.broadcast = response.broadcast
        q.partition = response.partition
        window = response.dedup_history_window_ms
        q.timeout_ms = min(self.limits.timeout_ms, window) if window > 0 else self.limits.timeout_ms
        if q.read and response.HasField("options"):
            q.options = response.options  # the domain's defaults filled in
        if not was_open and self.sending:
            self._resend(queue_id)  # what waited in the buffer for it (a reopen after failover)

    def remove_queue(self, queue_id: int) -> None:
        """The application closed the queue. Its PUTs held but not sent on
        this stream never will be: they fail CANCELED now, rather than wait
        for the time bound (and a frame it shares with other queues no
        longer holds their later PUTs back)."""
        if self.queues.pop(queue_id, None) is None:
            return
        for key in self.buffer.forget_deferred(queue_id):
            held = self.buffer.release(key)
            if held is not None:
                self._answer(held, ResultCode.CANCELED, "the queue was closed before this PUT was sent")

    # -- producing -----------------------------------------------------------------
    @property
    def pending(self) -> int:
        """PUTs not answered yet: held in the buffer, or batched."""
        return self.buffer.messages + len(self._puts.items)

    def refusal(self, nbytes: int, count: int = 1) -> tuple[ResultCode, str] | None:
        """Why `count` more PUTs of `nbytes` would not fit the retransmission
        buffer, counting those batched (not made into a frame yet), or None."""
        return self.buffer.refusal(nbytes + self._puts.nbytes, count + len(self._puts.items))

    def _gone(self, queue_id: int, guid: bytes) -> AckError:
        """The answer to a PUT for a queue no longer open: the code of the
        reopen that closed it, or CANCELED (the application closed it)."""
        code, text = self._refused.get(queue_id, (ResultCode.CANCELED, "the queue was closed"))
        return AckError(code, text, guid)

    def post(self, queue_id: int, message: Put | pb.PutMessage, token: Any, now_ms: float) -> AckError | None:
        """Batch one PUT. Once the batch is full or its linger time is up
        (`tick`), its PUTs become frames (`_seal`), one entry each in the
        retransmission buffer. The refusal, if it does not fit the buffer
        (the shell waits first while connected)."""
        q = self.queues.get(queue_id)
        if q is None:
            return self._gone(queue_id, message.guid)
        nbytes = len(message.payload)
        refused = self.refusal(nbytes)
        if refused is not None:
            return AckError(refused[0], f"{refused[1]} while disconnected", message.guid)
        puts = self._puts
        if not puts.items:
            self._batch_queue = q
        elif q is not self._batch_queue:
            self._batch_queue = None
        if puts.add((q, message, token), nbytes, now_ms):
            self._seal()
        return None

    def post_columns(self, queue_id: int, frame: pb.PutColumns, guids: bytes, count: int, token: Any,
                     now_ms: float) -> AckError | None:
        q = self.queues.get(queue_id)
        if q is None:
            return self._gone(queue_id, guids[:16])
        nbytes = len(frame.arrow_ipc)
        refused = self.refusal(nbytes, count)
        if refused is not None:
            return AckError(refused[0], f"{refused[1]} while disconnected", guids[:16])
        self._seal()   # keep PUT order: batched single PUTs go first
        if self._hold(_Pending(token, q, frame, guids), nbytes, count, now_ms):
            self._send(wrapped("put_columns", frame))
        return None

    def confirm(self, queue_id: int, seqs: Iterable[int], now_ms: float) -> int:
        """CONFIRM messages by seq (`PushMessage.sequence`); they go as seq
        ranges (ConfirmColumns). CONFIRMs made while no stream is up are
        dropped: those messages come again. A broadcast queue's are not sent
        (nothing is kept to confirm). Returns what the shell has to do:
        CONFIRM_SENT, the batch was full and its frames are in `take()`;
        CONFIRM_LINGERS, these began a batch, so `tick` has a new deadline
        for the shell's flusher; CONFIRM_HELD, nothing (no effects either)."""
        if not self.state.linked:
            return CONFIRM_HELD
        q = self.queues.get(queue_id)
        if q is not None and q.broadcast:
            return CONFIRM_HELD
        began = not self._confirm_count
        if began:
            self._confirms_since_ms = now_ms
        held = self._confirms.get(queue_id)
        if held is None:
            held = self._confirms[queue_id] = []
        before = len(held)
        held.extend(seqs)
        self._confirm_count += len(held) - before
        if self._confirm_count >= self.batch_policy.max_messages:
            self._send_confirms()
            return CONFIRM_SENT
        return CONFIRM_LINGERS if began and self._confirm_count else CONFIRM_HELD

    def flush(self) -> None:
        self._seal()
        self._send_confirms()

    def flush_puts(self) -> None:
        """The batched PUTs as frames now, without waiting out the linger:
        for a producer that cannot post more until ACKs make room, so no
        PUT can join the batch while it waits."""
        self._seal()

    def _seal(self) -> None:
        """The batched single PUTs as PutColumns frames, each held as one
        entry of the retransmission buffer since the batch's first PUT:
        resent as it is, answered by one ACK frame (every hop and the primary
        check and answer its rows one by one). The PUTs to the queues of one
        partition share one frame (`PutColumns.queue_ids`, the rows queue by
        queue) when they are of several queues and there are `spanning_min`
        of them; otherwise a queue with at least `columns_min` PUTs in the
        batch gets a frame of its own and the others go as PutMessages, each
        its own entry. Each queue's PUTs keep their order."""
        now_ms = self._puts.first_ms
        one_queue = self._batch_queue
        items = self._puts.take()
        if not items:
            return
        singles: list[pb.PutMessage | None] = []
        if one_queue is not None:   # the usual batch: one queue's, taken whole (no run per queue to make)
            _, messages, tokens = zip(*items)
            self._seal_run(one_queue, messages, tokens, now_ms, singles)
        else:
            self._seal_runs(items, now_ms, singles)
        sent = [m for m in singles if m is not None]
        if sent:
            self._send(pb.Frame(put=pb.PutBatch(messages=sent)))

    def _seal_runs(self, items: list[tuple[QueueRecord, Put | pb.PutMessage, Any]], now_ms: float,
                   singles: list[pb.PutMessage | None]) -> None:
        """`_seal` of a batch of several queues' PUTs: queue by queue, the
        queues of a partition sharing a frame (`_seal`'s docstring)."""
        runs: dict[int, list[tuple[QueueRecord, Put | pb.PutMessage, Any]]] = {}
        for q, m, t in items:
            run = runs.get(id(q))
            if run is None:
                run = runs[id(q)] = []
            run.append((q, m, t))
        by_partition: dict[int, list[list[tuple[QueueRecord, Put | pb.PutMessage, Any]]]] = {}
        for run in runs.values():
            q = run[0][0]
            # A closed queue's PUTs fail; a broadcast queue's are taken at once
            # by the primary, never committed: not in a frame with other queues.
            if self.queues.get(q.queue_id) is not q or q.broadcast:
                self._seal_run(q, [m for _, m, _ in run], [t for _, _, t in run], now_ms, singles)
            else:
                by_partition.setdefault(q.partition, []).append(run)
        for partition_runs in by_partition.values():
            if len(partition_runs) > 1 and sum(map(len, partition_runs)) >= self.batch_policy.spanning_min:
                rows = [row for run in partition_runs for row in run]
                self._frame([q for q, _, _ in rows], [m for _, m, _ in rows], [t for _, _, t in rows], now_ms)
                continue
            for run in partition_runs:
                self._seal_run(run[0][0], [m for _, m, _ in run], [t for _, _, t in run], now_ms, singles)

    def _seal_run(self, q: QueueRecord, messages: Sequence[Put | pb.PutMessage], tokens: Sequence[Any],
                  now_ms: float, singles: list[pb.PutMessage | None]) -> None:
        """One queue's PUTs of a batch: failed CANCELED if the queue was
        closed meanwhile, a frame of their own from `columns_min` on, else
        PutMessages added to `singles` (the batch's PutBatch frame)."""
        if self.queues.get(q.queue_id) is not q:
            self._effects.answered.extend((t, AckError(ResultCode.CANCELED, "the queue was closed", m.guid))
                                          for m, t in zip(messages, tokens))
        elif len(messages) >= self.batch_policy.columns_min:
            self._frame([q], messages, tokens, now_ms)
        else:
            singles.extend(self._single(q, m, t, now_ms) for m, t in zip(messages, tokens))

    def _single(self, q: QueueRecord, put: Put | pb.PutMessage, token: Any, now_ms: float) -> pb.PutMessage | None:
        """One PUT as a PutMessage, its own entry: the message if it may go now."""
        m = put.message(q.queue_id) if isinstance(put, Put) else put
        return m if self._hold(_Pending(token, q, m, m.guid), len(m.payload), 1, now_ms) else None

    def _frame(self, queues: list[QueueRecord], messages: Sequence[Put | pb.PutMessage], tokens: Sequence[Any],
               now_ms: float) -> None:
        """Single PUTs as one PutColumns frame: of one queue (`queues` holds
        it), or spanning the queues of one partition (`queues` per row)."""
        body, guids, nbytes = columns.encode_put_rows(messages)
        if len(queues) == 1:
            q, row_queues = queues[0], None
            out = frame_of("put_columns", queue_id=q.queue_id, arrow_ipc=body, per_message=True, guids=guids)
        else:
            q, row_queues = queues[0], queues
            out = frame_of("put_columns", arrow_ipc=body, per_message=True, guids=guids,
                           queue_ids=[r.queue_id for r in queues])
        # The retransmission buffer holds the frame's body (a part of `out`).
        if self._hold(_Pending(None, q, out.put_columns, guids, tokens, row_queues), nbytes, len(messages), now_ms):
            self._send(out)

    def _hold(self, pending: _Pending, nbytes: int, count: int, now_ms: float) -> bool:
        """Keep an entry until its ACK. True: it may go now (the caller
        sends it); False: it is deferred until its queues are open on a
        stream and none of their earlier PUTs waits."""
        queues = pending.spanned
        timeout = min(q.timeout_ms for q in queues) if len(queues) > 1 else queues[0].timeout_ms
        self.buffer.hold(pending.guids, pending, nbytes, count, now_ms, timeout)
        if self.sending and all(q.open and not self.buffer.blocked(q.queue_id) for q in queues):
            return True
        if len(queues) == 1:
            self.buffer.defer(queues[0].queue_id, pending.guids)
        else:
            self.buffer.defer_many([q.queue_id for q in queues], pending.guids)
        return False

    def _send_confirms(self) -> None:
        if self._confirm_count:
            items, self._confirms, self._confirm_count = self._confirms, {}, 0
            if self.state.linked:
                self._effects.frames.extend(confirm_frames(items))

    def tick(self, now_ms: float) -> float:
        """Send the batches whose linger time is up and fail the PUTs held past
        their time bound (TIMEOUT). Returns when to call again."""
        deadline = self._puts.deadline_ms()
        if deadline is not None and now_ms >= deadline:
            self._seal()
        if self._confirm_count and now_ms >= self._confirms_since_ms + self.batch_policy.linger_ms:
            self._send_confirms()
        if now_ms >= self._next_expiry_ms:
            self._next_expiry_ms = now_ms + EXPIRY_INTERVAL_MS
            for _, held in self.buffer.expire(now_ms):
                self._answer(held, ResultCode.TIMEOUT, f"no ACK within {held.timeout_ms / 1000:.0f} s")
        wake = self._next_expiry_ms
        if self._puts.items:
            wake = min(wake, self._puts.deadline_ms() or wake)
        if self._confirm_count:
            wake = min(wake, self._confirms_since_ms + self.batch_policy.linger_ms)
        return wake

    def _answer(self, held: Held[_Pending], code: ResultCode, text: str) -> None:
        """Every PUT of a held frame fails with `code`."""
        pending = held.item
        if pending.tokens is None:
            self._effects.answered.append((pending.token, AckError(code, text, pending.guids[:16])))
            return
        guids = pending.guids
        self._effects.answered.extend((token, AckError(code, text, guids[16 * i:16 * i + 16]))
                                      for i, token in enumerate(pending.tokens))

    # -- frames from the broker ------------------------------------------------------
    def on_frame(self, frame: pb.Frame) -> None:
        kind = frame.WhichOneof("body")
        if kind == "ack":   # single ACKs: a frame of one PUT each
            for ack in frame.ack.messages:
                held = self.buffer.release(ack.guid)
                if held is None:
                    continue  # a retransmitted PUT's second ACK, or one already answered
                self._answer_rows(held, ack.guid, ResultCode.of(ack.code), ack.message, {})
        elif kind == "ack_columns":
            ack = frame.ack_columns
            guids = ack.guids  # one copy: each access of a protobuf bytes field copies it
            held = self.buffer.release(guids)
            if held is None:
                return   # a retransmitted frame's second ACK, or one already answered
            refused = {row: (ResultCode.of(c), text) for row, c, text in zip(
                ack.refused_rows, ack.refused_codes, ack.refused_messages)} if ack.refused_rows else {}
            self._answer_rows(held, guids, ResultCode.of(ack.code), ack.message, refused)
        elif kind == "push":
            self._effects.pushes.extend(frame.push.messages)
        elif kind == "push_columns":
            self._effects.push_frames.append(frame.push_columns)
        elif kind in ("open_queue_response", "configure_queue_response", "close_queue_response",
                      "stop_response"):
            body = getattr(frame, kind)
            self._respond(body.request_id, body)
        elif kind == "stop_request":
            # The host is stopping: send it no more PUTs (they wait in the
            # buffer for the next host); ACKs and CONFIRMs keep flowing.
            if self.state is ConnectionState.CONNECTED:
                self.state = ConnectionState.HELD
            self._send(pb.Frame(stop_response=pb.StopResponse(request_id=frame.stop_request.request_id)))
            self._effects.events.append(events.StopRequested(self.host or "?"))
        elif kind == "error":
            error = frame.error
            if error.request_id in self._requests:
                self._respond(error.request_id, pb.OpenQueueResponse(status=error.status))
            else:
                log.warning("broker rejected a frame: %s: %s", ResultCode.of(error.status.code).name,
                            error.status.message)

    def _answer_rows(self, held: Held[_Pending], guids: bytes, code: ResultCode, text: str,
                     refused: dict[int, tuple[ResultCode, str]]) -> None:
        """The answer to a held frame: a post_columns frame's, all or
        nothing; a frame of single PUTs, one per PUT: the frame's code or,
        for a row refused on its own, its own."""
        pending = held.item
        answered = self._effects.answered
        if isinstance(pending.frame, pb.PutMessage):
            answered.append((pending.token, Ack(guids, pending.queue.uri) if code is ResultCode.SUCCESS
                             else AckError(code, text, guids)))
            return
        if pending.tokens is None:
            if code is ResultCode.SUCCESS:
                answered.append((pending.token, [guids[i:i + 16] for i in range(0, len(guids), 16)]))
            else:
                self._answer(held, code, text)
            return
        uri = pending.queue.uri
        row_queues = pending.row_queues
        if code is ResultCode.SUCCESS and not refused and row_queues is None:   # the common case, in one pass
            acks = [_new_tuple(Ack, (guids[i:i + 16], uri)) for i in range(0, len(guids), 16)]
            answered.extend(zip(pending.tokens, acks))
            return
        for i, token in enumerate(pending.tokens):
            guid = guids[16 * i:16 * i + 16]
            row_code, row_text = refused.get(i, (code, text)) if refused else (code, text)
            answered.append((token, Ack(guid, row_queues[i].uri if row_queues else uri)
                             if row_code is ResultCode.SUCCESS else AckError(row_code, row_text, guid)))

    def _respond(self, request_id: int, body: Any) -> None:
        request = self._requests.pop(request_id, None)
        if request is None:
            return
        succeeded = ResultCode.of(body.status.code) is ResultCode.SUCCESS
        if request.kind == "open_queue" and succeeded and request.queue_id not in self.queues:
            # Opened on the broker for a queue the application gave up on (its
            # open timed out): close it there, or a consumer nobody reads
            # would hold messages until the session ends.
            self._send(pb.Frame(close_queue=pb.CloseQueue(request_id=next(self._request_ids),
                                                          queue_id=request.queue_id)))
        if request.token is not None:  # an application's request, or its open carried over to a reopen
            self._effects.responses.append((request.token, body))
        queue_id = self._reopens.pop(request_id, None)
        if queue_id is None:
            return
        q = self.queues.get(queue_id)
        if q is not None:
            if ResultCode.of(body.status.code) is ResultCode.SUCCESS:
                self.opened(queue_id, body)
                self._restored.append(q.uri)
            else:
                log.warning("%s: reopen refused: %s", q.uri, body.status.message)
                self._not_restored.append(q.uri)
                self._seal()   # its batched PUTs too are answered below
                self.queues.pop(queue_id, None)
                self.buffer.forget_deferred(queue_id)
                self._effects.closed.append(queue_id)
                code = ResultCode.of(body.status.code)
                why = self._refused[queue_id] = (code, f"queue could not be reopened: {body.status.message}")
                for key, held in self.buffer.items():
                    if any(r is q for r in held.item.spanned):
                        self.buffer.release(key)
                        self._answer(held, *why)
        if not self._reopens:
            self._effects.events.append(events.StateRestored(self.host or "?", len(self._restored),
                                                             tuple(self._not_restored)))
