"""Sessions and queues: the producer/consumer API.

    with Session(hosts=["127.0.0.1:30115"]) as session:
        with session.open_queue("taproot://demo/orders", write=True) as queue:
            ack = queue.post(b"hello", properties={"region": "EU"}).result()
        with session.open_queue("taproot://demo/orders", read=True) as queue:
            for message in queue.messages(timeout_s=5):
                queue.confirm(message)

Thread safety: every public method may be called from any thread. One session
is one gRPC stream at a time; PUTs and CONFIRMs are batched on it
(`BatchPolicy`). Each PUT's future is resolved by its ACK: with an `Ack` on
success, with `AckError` otherwise.

High availability (BlazingMQ's SDK behaviour): every PUT stays in a
retransmission buffer until its ACK. If the connection drops, the session tries
its hosts in turn, reopens every queue and resends the unacknowledged PUTs in
order; duplicates are dropped by GUID in the cluster, and each PUT's future
completes once. Opens and configures wait for the connection; CONFIRMs made
while disconnected are dropped (those messages come again). The buffer is
bounded by count, bytes and time (the smaller of `retransmission_timeout_s`
and the queue's dedup history window): a PUT beyond a bound fails with
LIMIT_MESSAGES / LIMIT_BYTES / TIMEOUT, never silently. `on_event` receives
`taproot.events` (Connected, ConnectionLost, Reconnected, StateRestored).
With `reconnect=False` a lost connection fails every waiting PUT with UNKNOWN.

Layout: `taproot.core.SessionCore` decides everything above (sans I/O); this
module is its shell: the gRPC stream, the receiver and flusher threads, the
futures and the application's callbacks and inboxes.
"""

from __future__ import annotations

import itertools
import logging
import queue as _queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import grpc
import pyarrow as pa

from protocol import ResultCode, bundles, parse_queue_uri, pb
from protocol.auth import metadata as auth_metadata
from protocol.auth import token_from_env
from protocol.clock import Clock, MonotonicClock, wall_time_us
from protocol.expression import ExpressionError, compile_expression
from protocol.limits import (
    GUID_LENGTH,
    HEARTBEAT_INTERVAL_MS,
    MAX_UNCONFIRMED_BYTES,
    MAX_UNCONFIRMED_MESSAGES,
    SESSION_MAX_PENDING_PUTS,
)
from protocol.liveness import Due, Liveness, heartbeat
from protocol.properties import PropertyValue, from_wire, to_wire
from protocol.retransmit import RetransmissionLimits
from protocol.stream import CLOSE as _CLOSE
from protocol.stream import GRPC_OPTIONS, drain, session_stream
from protocol.tls import ClientTls, connect
from taproot import errors, events
from taproot.batching import BatchPolicy
from taproot.compression import NAMES as COMPRESSION_NAMES
from taproot.compression import compress
from taproot.core import CONFIRM_LINGERS, CONFIRM_SENT, Ack, ConnectionState, Effects, Put, QueueRecord, SessionCore
from taproot.futures import PutFuture, settle
from taproot.guid import GuidGenerator
from taproot.message import (
    Message,
    MessageBatch,
    Rows,
    TableRows,
    decompressed,
    messages_table,
    received_table,
    table_messages,
)

__all__ = ["Ack", "Message", "MessageBatch", "PutFuture", "Queue", "Session"]

log = logging.getLogger(__name__)

DIAL_PAUSE_S = 0.1   # between rounds over the hosts while none answers
DIAL_ATTEMPT_MIN_S = 0.5   # the shortest wait for one host that accepted the TCP connect


def _subscriptions(subscription: str | Sequence[str] | None) -> list[str]:
    """Check subscription expressions here, so a typo fails at the call."""
    if subscription is None or subscription == "":
        return []
    items = [subscription] if isinstance(subscription, str) else list(subscription)
    for text in items:
        try:
            compile_expression(text)
        except ExpressionError as exc:
            raise errors.InvalidArgumentError(ResultCode.INVALID_ARGUMENT, f"subscription {text!r}: {exc}") from None
    return items


class Queue:
    """An open queue. Use `Session.open_queue`; close with `close()` or `with`."""

    def __init__(self, session: "Session", record: QueueRecord, on_message: Callable[[Message], None] | None):
        self._session = session
        self._record = record
        self.queue_id = record.queue_id
        self.uri = record.uri
        self.read = record.read
        self.write = record.write
        self._on_message = on_message
        self._inbox: "_queue.SimpleQueue[object]" = _queue.SimpleQueue()
        # What was taken from the inbox and not handed out yet (the rest of a
        # frame cut by max_messages, or exploded into Messages), in order.
        self._head: deque[Message | Rows] = deque()
        self._closed = False

    @property
    def max_payload_bytes(self) -> int:
        """The domain's payload limit (0 until the open is answered)."""
        return self._record.max_payload_bytes

    @property
    def retransmission_timeout_s(self) -> float:
        """How long a PUT may wait for its ACK: the smaller of the session's
        bound and the domain's dedup history window."""
        return self._record.timeout_ms / 1000

    @property
    def options(self) -> pb.QueueOptions:
        """The consumer options in force (read queues)."""
        return self._record.options

    def __enter__(self) -> "Queue":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- producing ----------------------------------------------------------
    def post(self, payload: bytes, properties: Mapping[str, PropertyValue] | None = None,
             on_ack: Callable[[PutFuture], None] | None = None, *,
             compression: str | None = None) -> PutFuture:
        """Send one PUT; the returned future resolves when its ACK arrives.

        `compression` ("zlib" or "zstd") is a hint: payloads under 1 KiB, and
        payloads it would not shrink, go as they are. The domain's payload
        limit applies to the bytes sent."""
        if properties is None and compression is None and type(payload) is bytes:
            # Nothing to convert (most PUTs): the checks of `_wire_put`, inline.
            if not self.write or self._closed:
                self._check_writable()
            self._check_size(len(payload))
            return self._session._post(self, payload, [], on_ack, 0)
        wire_payload, wire_properties, codec = self._wire_put(payload, properties, compression)
        return self._session._post(self, wire_payload, wire_properties, on_ack, codec)

    def _wire_put(self, payload: bytes, properties: Mapping[str, PropertyValue] | None,
                  compression: str | None) -> tuple[bytes, list[Any], int]:
        """A PUT checked and made ready to send: (payload, properties, codec)."""
        self._check_writable()
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise errors.PostError(f"payload must be bytes, got {type(payload).__name__}")
        try:
            wire_payload, codec = compress(bytes(payload), compression)
            wire_properties = to_wire(properties)
        except ValueError as exc:
            raise errors.PostError(str(exc)) from exc
        self._check_size(len(wire_payload))
        return wire_payload, wire_properties, codec

    def _check_size(self, nbytes: int) -> None:
        """The domain's payload limit, on the bytes sent."""
        limit = self._record.max_payload_bytes
        if limit and nbytes > limit:
            raise errors.PostError(f"payload of {nbytes} bytes exceeds the domain's max_payload_bytes {limit}")

    def _check_writable(self) -> None:
        if not self.write:
            raise errors.PostError(f"{self.uri} is not open for writing")
        if self._closed:
            raise errors.PostError(f"{self.uri} is closed")

    def post_columns(self, table: "pa.Table", compression: str | None = None) -> "Future[list[bytes]]":
        """Post many messages in one columnar frame (bulk producers, replay).

        `table` has a `payload` (binary) column and optionally `properties` and
        `property_types` (map<string,string>, the tables' form) and
        `compression` (the codec a payload is already compressed with). Each
        message gets a new GUID, unless `table` has a `guid` column (16 bytes
        a row): a message forwarded with its identity (a federation link; the
        dedup window drops a GUID the cluster has seen). The broker checks the
        frame as a whole; the future resolves to the list of GUIDs once every
        message is durable, or raises `AckError` with the code that refused
        them all."""
        guids, data = self._wire_columns(table)
        future = self._session._post_columns(self, guids, data)
        assert future is not None   # it waits for room
        return future

    def _guids_of(self, table: "pa.Table") -> bytes:
        """The GUIDs of a post_columns frame: its `guid` column's, or new ones."""
        if "guid" not in table.column_names:
            return self._session._guids.next_many(table.num_rows)
        values = table["guid"].to_pylist()
        if not all(isinstance(g, bytes) and len(g) == GUID_LENGTH for g in values):
            raise errors.PostError(f"the guid column must hold {GUID_LENGTH} bytes in every row")
        return b"".join(values)

    def _wire_columns(self, table: "pa.Table") -> tuple[bytes, bytes]:
        """A post_columns frame checked and made ready to send: its GUIDs
        (16 bytes a row, `_guids_of`) and its Arrow IPC body."""
        import pyarrow as pa

        from protocol import columns

        self._check_writable()
        n = table.num_rows
        if n == 0:
            raise errors.PostError("no rows to post")
        guids = self._guids_of(table)
        empty = pa.array([[]] * n, columns.PROPERTY_MAP)
        full = pa.table({
            "guid": columns.fixed_width_binary(guids, GUID_LENGTH),
            "payload": table["payload"],
            "properties": table["properties"] if "properties" in table.column_names else empty,
            "property_types": table["property_types"] if "property_types" in table.column_names else empty,
            "compression": (table["compression"] if "compression" in table.column_names
                            else pa.nulls(n, pa.string())),
            # The producer's clock, for latency stats (PUSH put_time_us, the
            # brokers' PUT->ACK and PUT->PUSH): the post's, unless given.
            columns.PUT_TIME: (table[columns.PUT_TIME] if columns.PUT_TIME in table.column_names
                               else pa.repeat(pa.scalar(wall_time_us(), pa.int64()), n)),
        })
        try:
            return guids, columns.encode(full)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise errors.PostError(f"columns do not fit the PutColumns schema: {exc}") from exc

    def flush(self) -> None:
        """Send any batched PUTs and CONFIRMs now instead of after the linger time."""
        self._session._flush()

    # -- consuming ----------------------------------------------------------
    # One reader per queue keeps push order; several readers may take from it.
    def _next(self, timeout_s: float | None, wait: bool = True) -> Message | Rows | None:
        """The next item of the inbox: a Message, a frame's Rows, or None
        (nothing within `timeout_s`, or the queue closed: raises if the
        session was lost)."""
        if self._head:
            try:
                return self._head.popleft()
            except IndexError:
                pass   # another reader took it
        try:
            item = self._inbox.get(timeout=timeout_s) if wait else self._inbox.get_nowait()
        except _queue.Empty:
            return None
        if item is _CLOSE:
            self._inbox.put(_CLOSE)  # keep later callers from blocking
            if wait:
                failure = self._session._core.failure()
                if failure is not None and self._session._core.state is ConnectionState.LOST:
                    raise failure
            return None
        return item  # type: ignore[return-value]

    def get(self, timeout_s: float | None = None) -> Message | None:
        """The next pushed message, or None after `timeout_s`."""
        item = self._next(timeout_s)
        if isinstance(item, Rows):
            messages = table_messages(item.table.slice(item.offset), self)
            self._head.extendleft(reversed(messages[1:]))
            return messages[0]
        return item

    def messages(self, timeout_s: float | None = None) -> Iterator[Message]:
        """Yield pushed messages until none arrives for `timeout_s` (forever if None)."""
        while True:
            message = self.get(timeout_s)
            if message is None:
                return
            yield message

    def get_batch(self, max_messages: int = 1000, timeout_s: float | None = None) -> list[Message]:
        """Up to `max_messages` pushed messages, in push order: waits up to
        `timeout_s` for the first, then takes only what has already arrived.
        Empty after `timeout_s` (or once the queue is closed). Confirm the
        lot with one `confirm(batch)`: one CONFIRM frame for all of them."""
        if max_messages < 1:
            raise ValueError("max_messages must be at least 1")
        batch: list[Message] = []
        item = self._next(timeout_s)
        while item is not None:
            if isinstance(item, Rows):
                table, rest = item.take(max_messages - len(batch))
                if rest is not None:
                    self._head.appendleft(rest)
                batch.extend(table_messages(table, self))
            else:
                batch.append(item)
            if len(batch) >= max_messages:
                break
            item = self._next(0, wait=False)
        return batch

    def batches(self, max_messages: int = 1000, timeout_s: float | None = None) -> Iterator[list[Message]]:
        """Yield `get_batch` results until none arrives for `timeout_s` (forever if None)."""
        while True:
            batch = self.get_batch(max_messages, timeout_s)
            if not batch:
                return
            yield batch

    def get_columns(self, max_messages: int = 10_000, timeout_s: float | None = None) -> MessageBatch | None:
        """Up to `max_messages` pushed messages as one Arrow table
        (`MessageBatch`, columns `taproot.message.BATCH_SCHEMA`), in push
        order: waits up to `timeout_s` for the first, then takes only what
        has already arrived. None after `timeout_s` (or once the queue is
        closed). PUSH frames are handed over as the Arrow batches they came
        in, with no Python object per message; `batch.confirm()` confirms
        them all with one CONFIRM frame."""
        if max_messages < 1:
            raise ValueError("max_messages must be at least 1")
        tables: list[pa.Table] = []
        singles: list[Message] = []   # messages that came one by one, kept in order with the frames
        count = 0
        item = self._next(timeout_s)
        while item is not None:
            if isinstance(item, Rows):
                if singles:
                    tables.append(messages_table(singles))
                    singles = []
                table, rest = item.take(max_messages - count)
                if rest is not None:
                    self._head.appendleft(rest)
                tables.append(table)
                count += table.num_rows
            else:
                singles.append(item)
                count += 1
            if count >= max_messages:
                break
            item = self._next(0, wait=False)
        if singles:
            tables.append(messages_table(singles))
        if not tables:
            return None
        return MessageBatch(tables[0] if len(tables) == 1 else pa.concat_tables(tables), self)

    def column_batches(self, max_messages: int = 10_000, timeout_s: float | None = None) -> Iterator[MessageBatch]:
        """Yield `get_columns` results until none arrives for `timeout_s` (forever if None)."""
        while True:
            batch = self.get_columns(max_messages, timeout_s)
            if batch is None:
                return
            yield batch

    def confirm(self, messages: Message | MessageBatch | Iterable[Message]) -> None:
        """Confirm messages (by their seqs): a Message, a batch, or many."""
        if isinstance(messages, Message):
            self._session._confirm(self, (messages.sequence,))
        elif isinstance(messages, MessageBatch):
            messages.confirm()
        else:
            self._session._confirm(self, [m.sequence for m in messages])

    def _confirm_seqs(self, seqs: "Sequence[int]") -> None:
        self._session._confirm(self, seqs)

    def configure(self, *, max_unconfirmed_messages: int | None = None,
                  max_unconfirmed_bytes: int | None = None, consumer_priority: int | None = None,
                  subscription: str | Sequence[str] | None = None, timeout_s: float | None = None) -> None:
        """Change consumer options at runtime; an option left as None keeps its
        current value. `subscription=[]` (or "") removes the subscription."""
        options = pb.QueueOptions()
        options.CopyFrom(self.options)
        if max_unconfirmed_messages is not None:
            options.max_unconfirmed_messages = max_unconfirmed_messages
        if max_unconfirmed_bytes is not None:
            options.max_unconfirmed_bytes = max_unconfirmed_bytes
        if consumer_priority is not None:
            options.consumer_priority = consumer_priority
        if subscription is not None:
            del options.subscriptions[:]
            options.subscriptions.extend(_subscriptions(subscription))
        self._session._request(pb.Frame(configure_queue=pb.ConfigureQueue(
            queue_id=self.queue_id, options=options)), "configure_queue", timeout_s)
        self._record.options = options

    def close(self, timeout_s: float | None = None) -> None:
        if self._closed:
            return
        self._session._flush()
        self._closed = True
        try:
            if self._session._core.state.linked:
                # Disconnected: it completes here (BlazingMQ does the same);
                # the reopen after reconnection skips it.
                self._session._request(pb.Frame(close_queue=pb.CloseQueue(queue_id=self.queue_id)),
                                       "close_queue", timeout_s)
        finally:
            self._session._forget_queue(self.queue_id)
            self._inbox.put(_CLOSE)

    def _deliver(self, message: Message) -> None:
        if self._on_message is not None:
            try:
                self._on_message(message)
            except Exception:
                log.exception("%s: on_message callback raised; the message stays unconfirmed", self.uri)
        else:
            self._inbox.put(message)


_arrow_warm_up: list[threading.Thread] = []
_arrow_warm_up_lock = threading.Lock()


def _warm_up_arrow_in_background() -> None:
    """`protocol.columns.warm_up` once per process, on a thread of its own: a
    session starts it before it dials, so pyarrow's first-call import
    overlaps the connection instead of delaying the first frame. A `pa.array`
    meanwhile waits on the import lock, as it would have."""
    with _arrow_warm_up_lock:
        if _arrow_warm_up:
            return
        thread = threading.Thread(target=_warm_up_arrow, name="taproot-arrow-warm-up", daemon=True)
        _arrow_warm_up.append(thread)
    thread.start()


def _warm_up_arrow() -> None:
    from protocol import columns
    try:
        columns.warm_up()
    except BaseException:   # an interpreter shutting down under a daemon thread: nothing left to warm
        pass


class Session:
    """A connection to a Taproot proxy or node. Use as a context manager.

    `hosts` are tried in turn, at start and after a lost connection."""

    def __init__(self, hosts: Sequence[str] = ("127.0.0.1:30115",), *, batch: BatchPolicy | None = None,
                 connect_timeout_s: float | None = 10.0, request_timeout_s: float = 30.0,
                 max_pending_puts: int = SESSION_MAX_PENDING_PUTS,
                 max_pending_bytes: int = RetransmissionLimits.max_bytes,
                 retransmission_timeout_s: float = RetransmissionLimits.timeout_ms / 1000, reconnect: bool = True,
                 reconnect_interval_s: float = 0.2,
                 on_event: Callable[[events.SessionEvent], None] | None = None, clock: Clock | None = None,
                 tls: ClientTls | None = None, token: str | None = None):
        if not hosts:
            raise ValueError("hosts must name at least one host:port")
        self.hosts = list(hosts)
        # A cluster with TLS on: `ClientTls.from_files(ca_file[, cert_file, key_file])`; without it, the
        # TAPROOT_TLS_* environment variables say (`ClientTls.from_env`), else plaintext.
        self.tls = tls if tls is not None else ClientTls.from_env()
        # A cluster with [auth] on: the token it gave this client; without it, TAPROOT_TOKEN (or the file
        # TAPROOT_TOKEN_FILE names). Sent in each stream's metadata, never logged.
        self._metadata = auth_metadata(token if token is not None else token_from_env()) + bundles.BUNDLES_METADATA
        self.batch_policy = batch or BatchPolicy()
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self.reconnect_interval_s = reconnect_interval_s
        self.on_event = on_event
        self._core = SessionCore(batch=self.batch_policy, reconnect=reconnect, limits=RetransmissionLimits(
            max_pending_puts, max_pending_bytes, max(1, round(retransmission_timeout_s * 1000))))
        self._guids = GuidGenerator()
        self._clock: Clock = clock or MonotonicClock()
        # The session's state is under `_lock`; `_changed` is signalled when
        # it changes in a way a waiter waits for (room in the buffer, an
        # answer, the end). Entered directly, not through the Condition:
        # `Condition.__enter__` is Python code around the same lock, about
        # 0.1 us more on every post.
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._queues: dict[int, Queue] = {}
        self._queue_ids = itertools.count(1)
        self._out: "_queue.SimpleQueue[object]" = _queue.SimpleQueue()
        self._channel: grpc.Channel | None = None
        self._threads: list[threading.Thread] = []
        self._next_host = 0
        self._liveness = Liveness()   # heartbeats up, and when to give the host up

    # -- what the core knows --------------------------------------------------
    @property
    def state(self) -> ConnectionState:
        return self._core.state

    @property
    def host(self) -> str | None:
        return self._core.host

    @property
    def reconnects(self) -> int:
        return max(0, self._core.connections - 1)

    @property
    def max_pending_puts(self) -> int:
        return self._core.limits.max_messages

    @property
    def max_pending_bytes(self) -> int:
        return self._core.limits.max_bytes

    @property
    def retransmission_timeout_s(self) -> float:
        return self._core.limits.timeout_ms / 1000

    @property
    def reconnect(self) -> bool:
        return self._core.reconnect

    # -- lifecycle ----------------------------------------------------------
    def __enter__(self) -> "Session":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _now_ms(self) -> float:
        return self._clock.now_ms()

    def _emit(self, event: events.SessionEvent) -> None:
        log.info("session: %s", event)
        if self.on_event is not None:
            try:
                self.on_event(event)
            except Exception:
                log.exception("on_event callback raised")

    def _dial_until_answered(self) -> tuple[grpc.Channel, str] | None:
        """Dial the hosts round after round until one answers or the session
        is stopped; say every ten seconds that it is still waiting."""
        started = said = self._clock.now_ms()
        while not self._core.state.final:
            dialled = self._dial(1.0)
            if dialled is not None:
                return dialled
            now = self._clock.now_ms()
            if now - said >= 10_000:
                said = now
                log.warning("session: no host answers yet among %s (waiting %.0f s); still trying",
                            ", ".join(self.hosts), (now - started) / 1000)
            with self._lock:
                self._changed.wait(self.reconnect_interval_s)
        return None

    def _dial(self, timeout_s: float) -> tuple[grpc.Channel, str] | None:
        """The first host that answers within `timeout_s`, each tried in
        turn (one that refuses is left at once for the next) until then."""
        deadline = time.monotonic() + timeout_s
        while True:
            for i in range(len(self.hosts)):
                host = self.hosts[(self._next_host + i) % len(self.hosts)]
                # Never a sliver of a wait: a channel closed just after it was
                # made races gRPC's own watch of it (an exception in its thread).
                wait_s = max(deadline - time.monotonic(), min(timeout_s, DIAL_ATTEMPT_MIN_S))
                channel = connect(host, self.tls, GRPC_OPTIONS, wait_s)
                if channel is not None:
                    self._next_host = (self._next_host + i) % len(self.hosts)
                    return channel, host
            left = deadline - time.monotonic()
            if left <= 0 or self._core.state.final:
                return None
            time.sleep(min(DIAL_PAUSE_S, left))

    def start(self) -> None:
        """Connect to the first of `hosts` that answers. Raises ConnectionError
        if none does within `connect_timeout_s`; with `connect_timeout_s=None`
        it waits as long as it takes (or until `stop()`), so a client may start
        before the cluster does."""
        _warm_up_arrow_in_background()
        dialled = self._dial_until_answered() if self.connect_timeout_s is None else self._dial(self.connect_timeout_s)
        if dialled is None and self.connect_timeout_s is not None:
            raise errors.ConnectionError(f"no host reachable within {self.connect_timeout_s}s: {self.hosts}")
        with self._lock:
            if dialled is None or self._core.state.final:      # stopped while waiting
                if dialled is not None:
                    dialled[0].close()
                raise errors.ConnectionError("session stopped before a host answered")
            self._attach(*dialled)
            effects = self._core.take()
        thread = threading.Thread(target=self._flusher, name="taproot-flusher", daemon=True)
        thread.start()
        self._threads.append(thread)
        self._carry_out(effects)

    def _attach(self, channel: grpc.Channel, host: str) -> None:
        """A new stream on `channel` (lock held); its receiver thread starts."""
        self._channel = channel
        self._out = _queue.SimpleQueue()
        self._liveness.connected(self._now_ms())
        self._core.connected(host, self._now_ms())
        # Several frames a message once the server says it reads them
        # (`protocol.bundles`); until then, and with an older server, one.
        bundled = threading.Event()
        responses = session_stream(channel)(drain(self._out, bundled.is_set), metadata=self._metadata)
        thread = threading.Thread(target=self._receive, args=(responses, self._out, channel, bundled),
                                  name="taproot-receiver", daemon=True)
        thread.start()
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        self._changed.notify_all()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Flush, wait up to `timeout_s` for outstanding ACKs, close every queue."""
        if self._core.state is ConnectionState.STOPPED:
            return
        self._flush()
        deadline = self._now_ms() + timeout_s * 1000
        with self._lock:
            while self._core.pending and not self._core.state.final and self._now_ms() < deadline:
                self._changed.wait(0.05)
        for q in list(self._queues.values()):
            try:
                q.close(timeout_s=max(0.1, (deadline - self._now_ms()) / 1000))
            except errors.TaprootError:
                pass
        with self._lock:
            self._core.stop()
            self._changed.notify_all()
            effects = self._core.take()
        self._out.put(_CLOSE)
        self._carry_out(effects)
        if self._channel is not None:
            self._channel.close()
        for thread in self._threads:
            thread.join(2)

    def open_queue(self, uri: str, *, read: bool = False, write: bool = False,
                   max_unconfirmed_messages: int | None = None, max_unconfirmed_bytes: int | None = None,
                   consumer_priority: int | None = None, subscription: str | Sequence[str] | None = None,
                   on_message: Callable[[Message], None] | None = None,
                   timeout_s: float | None = None, _link: str = "") -> Queue:
        """Open a queue. Consumers (`read=True`) may set flow control (defaults
        1000 messages / 32 MiB; 0/0 pauses), a priority (only the highest-
        priority consumers receive), and a subscription: a filter expression
        over message properties, or a list of them (OR), such as
        "region = 'EU' && amount > 100". Messages it does not match stay for
        other consumers. Fanout consumers open `taproot://domain/queue?id=<app>`."""
        parsed = parse_queue_uri(uri)
        if isinstance(parsed, str):
            raise errors.InvalidArgumentError(ResultCode.INVALID_ARGUMENT, parsed)
        if not (read or write):
            raise errors.InvalidArgumentError(ResultCode.INVALID_ARGUMENT, "open for read, write or both")
        queue_id = next(self._queue_ids)
        record = QueueRecord(queue_id, str(parsed), read, write)
        # `_link`: a federation pull link of that cluster opens it (primary/links.py).
        open_queue = pb.OpenQueue(queue_id=queue_id, uri=uri, read=read, write=write, columnar_push=read, link=_link)
        if read:
            options = self._options(max_unconfirmed_messages, max_unconfirmed_bytes, consumer_priority)
            options.subscriptions.extend(_subscriptions(subscription))
            record.options = options
            if any(v is not None for v in (max_unconfirmed_messages, max_unconfirmed_bytes, consumer_priority,
                                           subscription)):
                open_queue.options.CopyFrom(options)
        record.open_request = open_queue
        q = Queue(self, record, on_message)
        with self._lock:  # known before the request: PUSHes may follow its response at once
            self._queues[queue_id] = q
            self._core.add_queue(record)
        try:
            response = self._request(pb.Frame(open_queue=open_queue), "open_queue", timeout_s)
        except BaseException:
            self._forget_queue(queue_id)
            raise
        with self._lock:
            self._core.opened(queue_id, response)
        return q

    def _forget_queue(self, queue_id: int) -> None:
        with self._lock:
            self._queues.pop(queue_id, None)
            self._core.remove_queue(queue_id)
            self._send_effects_locked()   # its PUTs that will never be sent are answered

    # -- internals ----------------------------------------------------------
    @staticmethod
    def _options(messages: int | None, nbytes: int | None, priority: int | None) -> pb.QueueOptions:
        return pb.QueueOptions(
            max_unconfirmed_messages=MAX_UNCONFIRMED_MESSAGES if messages is None else messages,
            max_unconfirmed_bytes=MAX_UNCONFIRMED_BYTES if nbytes is None else nbytes,
            consumer_priority=priority or 0)

    def _check_live(self) -> None:
        failure = self._core.failure()
        if failure is not None:
            raise failure
        if self._channel is None:
            raise errors.ConnectionError("session is not started")

    def _request(self, frame: pb.Frame, kind: str, timeout_s: float | None) -> Any:
        self._check_live()
        timeout = self.request_timeout_s if timeout_s is None else timeout_s
        deadline = self._now_ms() + timeout * 1000
        future: Future[Any] = Future()
        with self._lock:
            # While reconnecting, a request waits for the next connection.
            while not self._core.state.linked and not self._core.state.final and self._now_ms() < deadline:
                self._changed.wait(0.05)
            self._check_live()
            if not self._core.state.linked:
                raise errors.TimeoutError(ResultCode.TIMEOUT, f"not connected within {timeout}s")
            request_id = self._core.request(frame, kind, future)
            self._send_effects_locked()
        try:
            response = future.result(timeout=max(0.0, (deadline - self._now_ms()) / 1000))
        except TimeoutError:
            raise errors.TimeoutError(ResultCode.TIMEOUT, f"no {kind} response within {timeout}s") from None
        finally:
            with self._lock:
                self._core.forget(request_id)
        if response.status.code != ResultCode.SUCCESS:
            raise errors.request_error(response.status.code, response.status.message)
        return response

    def _post(self, q: Queue, payload: bytes, properties: list[Any], on_ack: Callable[[PutFuture], None] | None,
              compression: int = 0) -> PutFuture:
        future = self._put(q, payload, properties, on_ack, compression, self._guids.next(), wait=True)
        assert future is not None
        return future

    def _put(self, q: Queue, payload: bytes, properties: list[Any], on_ack: Callable[[PutFuture], None] | None,
             compression: int, guid: bytes, wait: bool) -> PutFuture | None:
        """One PUT with its GUID. `wait=False` (a mirrored PUT, `taproot.mirror`):
        None at once, and nothing kept, when it would have waited for room."""
        nbytes = len(payload)
        message = Put(guid, payload, properties, wall_time_us(), compression)
        with self._lock:
            core = self._core
            # `_room_locked`, with its first test inline: no PUT is pending,
            # or there is room (most PUTs), and nothing waits.
            if core.pending and core.refusal(nbytes) is not None and not self._room_locked(nbytes, 1, wait):
                return None
            self._check_live()
            future = PutFuture(guid, on_ack)
            refused = core.post(q.queue_id, message, future, self._now_ms())
            if refused is None:
                batched = core.batched
                if batched == 0:   # the batch was full: sealed into frames, which go now
                    self._send_effects_locked()
                elif batched == 1:
                    self._changed.notify_all()  # wake the flusher for the linger deadline
        if refused is not None:
            future.set_exception(refused)
        return future

    def _post_columns(self, q: Queue, guids: bytes, data: bytes, wait: bool = True) -> "Future[list[bytes]] | None":
        """A post_columns frame; `wait=False` as in `_put`."""
        frame = pb.PutColumns(queue_id=q.queue_id, arrow_ipc=data, guids=guids)
        count = len(guids) // GUID_LENGTH
        with self._lock:
            if not self._room_locked(len(data), count, wait):
                return None
            self._check_live()
            future: Future[list[bytes]] = Future()
            refused = self._core.post_columns(q.queue_id, frame, guids, count, future, self._now_ms())
            self._send_effects_locked()
        if refused is not None:
            future.set_exception(refused)
        return future

    def _room_locked(self, nbytes: int, count: int, wait: bool) -> bool:
        """Whether a PUT may go to the core now (which refuses it if it cannot
        fit even an empty buffer, or it must wait while disconnected and the
        buffer is full). Waits for room while connected, unless `wait` is False."""
        if wait:
            self._wait_for_room_locked(nbytes, count)
            return True
        return not self._no_room_locked(nbytes, count)

    def _no_room_locked(self, nbytes: int, count: int) -> bool:
        """Connected, PUTs that would not fit the retransmission buffer wait
        (flow control: the ACKs make room). Disconnected, or larger than the
        empty buffer, they are refused, not waited for."""
        core = self._core
        return bool(core.pending and core.refusal(nbytes, count) is not None and core.state.linked)

    def _wait_for_room_locked(self, nbytes: int, count: int) -> None:
        """A producer waits while its PUTs have no room (`_no_room_locked`),
        never dropped. Its batched PUTs go out first: nothing can join them
        while it waits, and their ACKs are what make the room (a producer
        with a window of one would otherwise wait out the linger each PUT)."""
        while self._no_room_locked(nbytes, count):
            if self._core.batched:
                self._core.flush_puts()
                self._send_effects_locked()
                continue
            self._changed.wait(0.1)

    def _confirm(self, q: Queue, seqs: "Sequence[int]") -> None:
        if self._core.state is ConnectionState.STOPPED:
            raise errors.ConnectionError("session is stopped")
        with self._lock:
            outcome = self._core.confirm(q.queue_id, seqs, self._now_ms())
            if outcome == CONFIRM_SENT:
                self._send_effects_locked()
            elif outcome == CONFIRM_LINGERS:
                # Only the flusher waits on a CONFIRM, for the first one's
                # linger deadline; waking every waiter at each CONFIRM cost a
                # per-message consumer a thread switch a message.
                self._changed.notify_all()

    def _flush(self) -> None:
        with self._lock:
            self._core.flush()
            self._send_effects_locked()

    def _flusher(self) -> None:
        """Batches out on time and the buffer's time bound, until the session
        ends; a failure is logged and the next round goes on (a dead flusher
        would leave PUTs lingering and never time out)."""
        while True:
            try:
                silent = None
                with self._lock:
                    if self._core.state.final:
                        return
                    now = self._now_ms()
                    if self._core.state.linked:
                        silent = self._check_peer_locked(now)
                    wake = self._core.tick(now)
                    effects = self._core.take()
                    self._send_locked(effects)
                    if not effects and silent is None:
                        self._changed.wait(max(0.0, min(wake - now, HEARTBEAT_INTERVAL_MS / 2)) / 1000)
                        continue
                if silent is not None:
                    silent.close()  # the receiver sees the stream end and reconnects
                self._carry_out(effects)
            except Exception:
                log.exception("session flusher failed; carrying on")
                with self._lock:
                    self._changed.wait(0.1)

    def _check_peer_locked(self, now: float) -> grpc.Channel | None:
        """Heartbeat up when due; the channel to give up if the host has sent
        nothing at all for too long (frozen, or a link that stopped forwarding)."""
        due = self._liveness.due(now)
        if due is Due.HEARTBEAT:
            self._out.put(heartbeat(wall_time_us()))
        elif due is Due.LEAVE and self._channel is not None:
            log.warning("session: %s silent for over %.1f s; moving to the next host", self._core.host,
                        self._liveness.silence_max_ms / 1000)
            return self._channel
        return None

    def _send_effects_locked(self) -> None:
        """Frames go out now, in order (lock held); answers and events, which
        run the application's callbacks, go from a thread of their own."""
        effects = self._core.take()
        self._send_locked(effects)
        if effects:
            threading.Thread(target=self._carry_out, args=(effects,), daemon=True).start()

    def _send_locked(self, effects: Effects) -> None:
        if effects.frames:
            for frame in effects.frames:
                self._out.put(frame)
            effects.frames = []
        if effects.answered or effects.closed:
            self._changed.notify_all()  # room in the buffer, or nothing more to wait for

    def _carry_out(self, effects: Effects) -> None:
        """Everything but the frames (already sent): outside the lock, since
        callbacks may post."""
        for frame in effects.frames:
            self._out.put(frame)
        if effects.answered:
            settle(effects.answered)
        for token, response in effects.responses:
            if token.done():
                continue
            if isinstance(response, BaseException):
                token.set_exception(response)
            else:
                token.set_result(response)
        if effects.pushes:
            self._deliver(effects.pushes)
        for frame in effects.push_frames:
            self._deliver_columns(frame)
        for queue_id in effects.closed:
            with self._lock:
                ended = not self._core.state.final  # else the session ended: its queues stay, failing
                q = self._queues.pop(queue_id, None) if ended else self._queues.get(queue_id)
            if q is not None:
                q._closed = q._closed or ended  # a refused reopen: that queue is gone
                q._inbox.put(_CLOSE)
        for event in effects.events:
            self._emit(event)

    def _deliver(self, pushes: list[pb.PushMessage]) -> None:
        for m in pushes:
            # One copy for several queues of this session (fanout apps, broadcast).
            targets = [q for q in (self._queues.get(i) for i in (m.queue_ids or [m.queue_id])) if q is not None]
            if not targets:
                continue  # queue closed meanwhile: the broker redelivers elsewhere
            payload = decompressed(targets[0].uri, m.guid, m.payload, m.compression)
            properties = from_wire(m.properties)
            for n, q in enumerate(targets):
                q._deliver(Message(m.guid, payload, properties if n == 0 else dict(properties), q.uri,
                                   m.delivery_count, m.sequence, m.put_time_us,
                                   COMPRESSION_NAMES.get(m.compression), q))

    def _deliver_columns(self, frame: pb.PushColumns) -> None:
        """A columnar PUSH frame: one Arrow batch to each target queue's
        inbox as it is (`Rows`), or as `Message`s to a callback, in its order."""
        from protocol import columns

        if frame.range_queue_ids:
            return self._deliver_span(frame)
        # One copy for several queues of this session (broadcast consumers).
        targets = [q for q in (self._queues.get(i) for i in (frame.queue_ids or [frame.queue_id])) if q is not None]
        if not targets:
            return  # queue closed meanwhile: the broker redelivers elsewhere
        push = columns.decode_push(frame.arrow_ipc)
        if isinstance(push, str):
            log.error("%s: a PUSH frame of %d messages could not be read: %s", targets[0].uri, frame.count, push)
            return  # unconfirmed: redelivered once this consumer goes
        rows = TableRows(received_table(push, targets[0].uri))   # decompressed and listed once, whatever the targets
        for q in targets:
            self._deliver_rows(q, rows, 0, push.num_rows)

    def _deliver_span(self, frame: pb.PushColumns) -> None:
        """A columnar PUSH frame spanning queues of this session: seq range i
        is of queue `range_queue_ids[i]`; each queue's rows go to it in order
        (a range of a queue closed meanwhile is skipped: redelivered)."""
        from protocol import columns

        runs: list[tuple[Queue, int, int]] = []   # (queue, first row, rows)
        row = 0
        for queue_id, count in zip(frame.range_queue_ids, frame.seq_counts):
            q = self._queues.get(queue_id)
            if q is not None:
                if runs and runs[-1][0] is q and runs[-1][1] + runs[-1][2] == row:
                    runs[-1] = (q, runs[-1][1], runs[-1][2] + count)
                else:
                    runs.append((q, row, count))
            row += count
        if not runs:
            return
        push = columns.decode_push(frame.arrow_ipc)
        if isinstance(push, str) or push.num_rows != row:
            why = push if isinstance(push, str) else f"{push.num_rows} rows, its seq ranges name {row}"
            log.error("%s: a PUSH frame of %d messages could not be read: %s", runs[0][0].uri, frame.count, why)
            return  # unconfirmed: redelivered once this consumer goes
        rows = TableRows(received_table(push, runs[0][0].uri))
        # Queues read with `get` take their rows as slices of the table;
        # those with a callback get theirs as `Message`s made in one pass
        # over the frame (not a pass per range: a range is a row or two at
        # thousands of queues), each queue's in order.
        row_queues: list[Queue | None] | None = None
        for q, first, count in runs:
            if q._on_message is None:
                self._deliver_rows(q, rows, first, count)   # a slice of the table into its inbox
                continue
            if row_queues is None:
                row_queues = [None] * row
            if count == 1:
                row_queues[first] = q
            else:
                row_queues[first:first + count] = [q] * count
        if row_queues is not None:
            for message in rows.messages_of_rows(row_queues):
                message._queue._deliver(message)   # type: ignore[union-attr]

    @staticmethod
    def _deliver_rows(q: "Queue", rows: TableRows, first: int, count: int) -> None:
        """Rows `first` to `first + count` to `q`: into its inbox as a slice
        of the table, or to its callback one `Message` at a time."""
        if q._on_message is None:
            q._inbox.put(Rows(rows.table.slice(first, count)))
        else:
            for message in rows.messages(q, first, count):
                q._deliver(message)

    def _receive(self, responses: Any, out: "_queue.SimpleQueue[object]",
                 channel: grpc.Channel, bundled: threading.Event) -> None:
        reason = "stream ended"
        try:
            if bundles.offered(responses.initial_metadata()):
                bundled.set()
            for message in responses:
                with self._lock:
                    self._liveness.heard(self._now_ms())
                    for frame in bundles.unbundled(message):
                        self._core.on_frame(frame)
                    effects = self._core.take()
                    self._send_locked(effects)
                if effects:
                    self._carry_out(effects)
        except grpc.RpcError as exc:
            reason = f"{exc.code().name}: {exc.details()}"
        except Exception as exc:  # pragma: no cover - defensive
            log.exception("session receiver failed")
            reason = f"receiver failed: {exc}"
        with self._lock:
            if self._core.state.final or out is not self._out:
                return
            self._core.connection_lost(reason)
            self._changed.notify_all()
            effects = self._core.take()
        out.put(_CLOSE)
        channel.close()
        self._carry_out(effects)
        if self._core.state is ConnectionState.DISCONNECTED:
            self._reconnect()

    def _reconnect(self) -> None:
        self._next_host += 1  # start with the next host: the lost one probably went away
        while True:
            with self._lock:
                if self._core.state.final:
                    return
            dialled = self._dial(min(self.connect_timeout_s or 1.0, 1.0))
            if dialled is None:
                with self._lock:
                    self._changed.wait(self.reconnect_interval_s)
                continue
            with self._lock:
                if self._core.state.final:
                    dialled[0].close()
                    return
                self._attach(*dialled)
                effects = self._core.take()
                self._send_locked(effects)
            self._carry_out(effects)
            return
