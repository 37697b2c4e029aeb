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
"""

from __future__ import annotations

import itertools
import logging
import queue as _queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Mapping, Sequence

import grpc

from protocol import ResultCode, parse_queue_uri, pb, pb_grpc
from protocol.expression import ExpressionError, compile_expression
from protocol.properties import PropertyValue, from_wire, to_wire
from protocol.stream import CLOSE as _CLOSE
from protocol.stream import GRPC_OPTIONS, drain
from taproot import errors, events
from taproot.batching import BatchPolicy, Batcher
from taproot.clock import MonotonicClock, wall_time_us
from taproot.compression import NAMES as COMPRESSION_NAMES
from taproot.compression import compress, decompress
from taproot.guid import GUID_LENGTH, GuidGenerator

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Ack:
    guid: bytes
    queue_uri: str


@dataclass(frozen=True)
class Message:
    guid: bytes
    payload: bytes
    properties: Mapping[str, PropertyValue]
    queue_uri: str
    delivery_count: int
    sequence: int
    put_time_us: int
    compression: str | None = None    # how the payload travelled; `payload` is always decompressed
    _queue: "Queue | None" = field(default=None, repr=False, compare=False)

    @property
    def redelivered(self) -> bool:
        return self.delivery_count > 1

    def confirm(self) -> None:
        assert self._queue is not None, "message not attached to a queue"
        self._queue.confirm(self)


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


class PutFuture(Future):
    """The future of one PUT; `guid` is known as soon as `post` returns."""

    def __init__(self, guid: bytes):
        super().__init__()
        self.guid = guid


@dataclass
class _PendingPut:
    future: PutFuture
    queue: "Queue"
    posted_ns: int
    message: pb.PutMessage       # kept for retransmission
    deadline_s: float            # monotonic time after which it fails with TIMEOUT


@dataclass
class _PendingColumns:
    future: Future
    queue: "Queue"
    frame: pb.PutColumns
    nbytes: int
    deadline_s: float


class Queue:
    """An open queue. Use `Session.open_queue`; close with `close()` or `with`."""

    def __init__(self, session: "Session", queue_id: int, uri: str, read: bool, write: bool,
                 on_message: Callable[[Message], None] | None):
        self._session = session
        self.queue_id = queue_id
        self.uri = uri
        self.read = read
        self.write = write
        self.max_payload_bytes = 0
        self.retransmission_timeout_s = session.retransmission_timeout_s
        self.options = pb.QueueOptions()  # the consumer options in force (read queues)
        self._on_message = on_message
        self._open_request = pb.OpenQueue()  # what reopens it after a reconnection
        self._inbox: "_queue.SimpleQueue[object]" = _queue.SimpleQueue()
        self._closed = False

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
        if not self.write:
            raise errors.PostError(f"{self.uri} is not open for writing")
        if self._closed:
            raise errors.PostError(f"{self.uri} is closed")
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise errors.PostError(f"payload must be bytes, got {type(payload).__name__}")
        try:
            wire_payload, codec = compress(bytes(payload), compression)
            wire_properties = to_wire(properties)
        except ValueError as exc:
            raise errors.PostError(str(exc)) from exc
        if self.max_payload_bytes and len(wire_payload) > self.max_payload_bytes:
            raise errors.PostError(f"payload of {len(wire_payload)} bytes exceeds the domain's "
                                   f"max_payload_bytes {self.max_payload_bytes}")
        return self._session._post(self, wire_payload, wire_properties, on_ack, codec)

    def post_columns(self, table: "pa.Table", compression: str | None = None) -> Future:
        """Post many messages in one columnar frame (bulk producers, replay).

        `table` has a `payload` (binary) column and optionally `properties` and
        `property_types` (map<string,string>, the tables' form) and
        `compression` (the codec a payload is already compressed with). Each
        message gets a new GUID. The broker checks the frame as a whole; the
        future resolves to the list of GUIDs once every message is durable, or
        raises `AckError` with the code that refused them all."""
        import pyarrow as pa

        from protocol import columns

        if not self.write:
            raise errors.PostError(f"{self.uri} is not open for writing")
        if self._closed:
            raise errors.PostError(f"{self.uri} is closed")
        n = table.num_rows
        if n == 0:
            raise errors.PostError("no rows to post")
        guids = self._session._guids.next_many(n)
        empty = pa.array([[]] * n, columns.PROPERTY_MAP)
        full = pa.table({
            "guid": columns.fixed_width_binary(guids, GUID_LENGTH),
            "payload": table["payload"],
            "properties": table["properties"] if "properties" in table.column_names else empty,
            "property_types": table["property_types"] if "property_types" in table.column_names else empty,
            "compression": (table["compression"] if "compression" in table.column_names
                            else pa.nulls(n, pa.string())),
        })
        try:
            data = columns.encode(full)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise errors.PostError(f"columns do not fit the PutColumns schema: {exc}") from exc
        return self._session._post_columns(self, guids, data)

    def flush(self) -> None:
        """Send any batched PUTs and CONFIRMs now instead of after the linger time."""
        self._session._flush()

    # -- consuming ----------------------------------------------------------
    def get(self, timeout_s: float | None = None) -> Message | None:
        """The next pushed message, or None after `timeout_s`."""
        try:
            item = self._inbox.get(timeout=timeout_s)
        except _queue.Empty:
            return None
        if item is _CLOSE:
            self._inbox.put(_CLOSE)  # keep later callers from blocking
            if self._session._lost is not None:
                raise errors.ConnectionError(self._session._lost)
            return None
        return item  # type: ignore[return-value]

    def messages(self, timeout_s: float | None = None) -> Iterator[Message]:
        """Yield pushed messages until none arrives for `timeout_s` (forever if None)."""
        while True:
            message = self.get(timeout_s)
            if message is None:
                return
            yield message

    def confirm(self, messages: Message | Iterable[Message]) -> None:
        items = [messages] if isinstance(messages, Message) else list(messages)
        self._session._confirm(self, [m.guid for m in items])

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
        self.options = options

    def close(self, timeout_s: float | None = None) -> None:
        if self._closed:
            return
        self._session._flush()
        self._closed = True
        try:
            if not self._session._lost and self._session._connected:
                # Disconnected: it completes here (BlazingMQ does the same);
                # the reopen after reconnection skips it.
                self._session._request(pb.Frame(close_queue=pb.CloseQueue(queue_id=self.queue_id)),
                                       "close_queue", timeout_s)
        finally:
            self._session._queues.pop(self.queue_id, None)
            self._inbox.put(_CLOSE)

    def _deliver(self, message: Message) -> None:
        if self._on_message is not None:
            try:
                self._on_message(message)
            except Exception:
                log.exception("%s: on_message callback raised; the message stays unconfirmed", self.uri)
        else:
            self._inbox.put(message)


class Session:
    """A connection to a Taproot proxy or node. Use as a context manager.

    `hosts` are tried in turn, at start and after a lost connection."""

    def __init__(self, hosts: Sequence[str] = ("127.0.0.1:30115",), *, batch: BatchPolicy | None = None,
                 connect_timeout_s: float = 10.0, request_timeout_s: float = 30.0,
                 max_pending_puts: int = 100_000, max_pending_bytes: int = 1 << 30,
                 retransmission_timeout_s: float = 300.0, reconnect: bool = True,
                 reconnect_interval_s: float = 0.2,
                 on_event: Callable[[events.SessionEvent], None] | None = None):
        if not hosts:
            raise ValueError("hosts must name at least one host:port")
        self.hosts = list(hosts)
        self.batch_policy = batch or BatchPolicy()
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self.max_pending_puts = max_pending_puts
        self.max_pending_bytes = max_pending_bytes
        self.retransmission_timeout_s = retransmission_timeout_s
        self.reconnect = reconnect
        self.reconnect_interval_s = reconnect_interval_s
        self.on_event = on_event
        self.host: str | None = None
        self.reconnects = 0
        self._guids = GuidGenerator()
        self._clock = MonotonicClock()
        self._lock = threading.Condition()
        self._puts = Batcher(self.batch_policy)
        self._confirms: list[pb.ConfirmMessage] = []
        self._pending: dict[bytes, _PendingPut] = {}              # in PUT order
        self._pending_columns: dict[bytes, _PendingColumns] = {}  # the frame's GUIDs -> entry
        self._pending_bytes = 0
        self._requests: dict[int, Future] = {}
        self._queues: dict[int, Queue] = {}
        self._queue_ids = itertools.count(1)
        self._request_ids = itertools.count(1)
        self._out: "_queue.SimpleQueue[object]" = _queue.SimpleQueue()
        self._channel: grpc.Channel | None = None
        self._connected = False      # a stream is up
        self._held = False           # the host sent StopRequest: keep PUTs until the next host
        self._lost: str | None = None
        self._stopping = False
        self._threads: list[threading.Thread] = []
        self._next_host = 0

    # -- lifecycle ----------------------------------------------------------
    def __enter__(self) -> "Session":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _emit(self, event: events.SessionEvent) -> None:
        log.info("session: %s", event)
        if self.on_event is not None:
            try:
                self.on_event(event)
            except Exception:
                log.exception("on_event callback raised")

    def _dial(self, timeout_s: float) -> tuple[grpc.Channel, str] | None:
        for i in range(len(self.hosts)):
            host = self.hosts[(self._next_host + i) % len(self.hosts)]
            channel = grpc.insecure_channel(host, options=GRPC_OPTIONS)
            try:
                grpc.channel_ready_future(channel).result(timeout=timeout_s)
            except grpc.FutureTimeoutError:
                channel.close()
                continue
            self._next_host = (self._next_host + i) % len(self.hosts)
            return channel, host
        return None

    def start(self) -> None:
        dialled = self._dial(self.connect_timeout_s)
        if dialled is None:
            raise errors.ConnectionError(f"no host reachable within {self.connect_timeout_s}s: {self.hosts}")
        with self._lock:
            self._attach(*dialled)
        thread = threading.Thread(target=self._flusher, name="taproot-flusher", daemon=True)
        thread.start()
        self._threads.append(thread)
        self._emit(events.Connected(dialled[1]))

    def _attach(self, channel: grpc.Channel, host: str) -> None:
        """A new stream on `channel` (lock held); its receiver thread starts."""
        self._channel, self.host = channel, host
        self._out = _queue.SimpleQueue()
        self._connected, self._held = True, False
        responses = pb_grpc.BrokerStub(channel).Session(drain(self._out))
        thread = threading.Thread(target=self._receive, args=(responses, self._out, channel),
                                  name="taproot-receiver", daemon=True)
        thread.start()
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        self._lock.notify_all()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Flush, wait up to `timeout_s` for outstanding ACKs, close every queue."""
        if self._stopping:
            return
        self._flush()
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while (self._pending or self._pending_columns) and self._lost is None and time.monotonic() < deadline:
                self._lock.wait(0.05)
        for q in list(self._queues.values()):
            try:
                q.close(timeout_s=max(0.1, deadline - time.monotonic()))
            except errors.TaprootError:
                pass
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        self._out.put(_CLOSE)
        self._fail_all("session stopped", ResultCode.CANCELED)
        if self._channel is not None:
            self._channel.close()
        for thread in self._threads:
            thread.join(2)

    def open_queue(self, uri: str, *, read: bool = False, write: bool = False,
                   max_unconfirmed_messages: int | None = None, max_unconfirmed_bytes: int | None = None,
                   consumer_priority: int | None = None, subscription: str | Sequence[str] | None = None,
                   on_message: Callable[[Message], None] | None = None,
                   timeout_s: float | None = None) -> Queue:
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
        q = Queue(self, queue_id, str(parsed), read, write, on_message)
        open_queue = pb.OpenQueue(queue_id=queue_id, uri=uri, read=read, write=write)
        if read:
            options = self._options(max_unconfirmed_messages, max_unconfirmed_bytes, consumer_priority)
            options.subscriptions.extend(_subscriptions(subscription))
            q.options = options
            if any(v is not None for v in (max_unconfirmed_messages, max_unconfirmed_bytes, consumer_priority,
                                           subscription)):
                open_queue.options.CopyFrom(options)
        q._open_request = open_queue
        self._queues[queue_id] = q  # before the request: PUSHes may follow its response at once
        try:
            response = self._request(pb.Frame(open_queue=open_queue), "open_queue", timeout_s)
        except BaseException:
            self._queues.pop(queue_id, None)
            raise
        self._opened(q, response)
        return q

    def _opened(self, q: Queue, response: pb.OpenQueueResponse) -> None:
        q.max_payload_bytes = response.max_payload_bytes
        if response.dedup_history_window_ms > 0:
            q.retransmission_timeout_s = min(self.retransmission_timeout_s, response.dedup_history_window_ms / 1000)
        if q.read and response.HasField("options"):
            q.options = response.options  # the domain's defaults filled in

    # -- internals ----------------------------------------------------------
    @staticmethod
    def _options(messages: int | None, nbytes: int | None, priority: int | None) -> pb.QueueOptions:
        return pb.QueueOptions(
            max_unconfirmed_messages=1000 if messages is None else messages,
            max_unconfirmed_bytes=32 * 1024 * 1024 if nbytes is None else nbytes,
            consumer_priority=priority or 0)

    def _check_live(self) -> None:
        if self._lost is not None:
            raise errors.ConnectionError(self._lost)
        if self._stopping or self._channel is None:
            raise errors.ConnectionError("session is not started")

    def _request(self, frame: pb.Frame, kind: str, timeout_s: float | None):
        self._check_live()
        timeout = self.request_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        request_id = next(self._request_ids)
        getattr(frame, kind).request_id = request_id
        future: Future = Future()
        with self._lock:
            # While reconnecting, a request waits for the next connection.
            while not self._connected and not self._stopping and self._lost is None \
                    and time.monotonic() < deadline:
                self._lock.wait(0.05)
            self._check_live()
            if not self._connected:
                raise errors.TimeoutError(ResultCode.TIMEOUT, f"not connected within {timeout}s")
            self._requests[request_id] = future
            self._out.put(frame)
        try:
            response = future.result(timeout=max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            raise errors.TimeoutError(ResultCode.TIMEOUT, f"no {kind} response within {timeout}s") from None
        finally:
            with self._lock:
                self._requests.pop(request_id, None)
        if response.status.code != ResultCode.SUCCESS:
            raise errors.request_error(response.status.code, response.status.message)
        return response

    def _post(self, q: Queue, payload: bytes, properties: list, on_ack, compression: int = 0) -> PutFuture:
        guid = self._guids.next()
        future = PutFuture(guid)
        if on_ack is not None:
            future.add_done_callback(on_ack)
        message = pb.PutMessage(queue_id=q.queue_id, guid=guid, payload=payload, properties=properties,
                                put_time_us=wall_time_us(), compression=compression)  # type: ignore[arg-type]
        with self._lock:
            while (len(self._pending) >= self.max_pending_puts or self._pending_bytes >= self.max_pending_bytes) \
                    and self._lost is None and not self._stopping and self._connected:
                self._lock.wait(0.1)  # connected: block the producer (flow control), never drop
            self._check_live()
            refused = self._buffer_full(len(payload))
            if refused is not None:
                future.set_exception(errors.AckError(refused[0], refused[1], guid))
                return future
            self._pending[guid] = _PendingPut(future, q, time.perf_counter_ns(), message,
                                              time.monotonic() + q.retransmission_timeout_s)
            self._pending_bytes += len(payload)
            if not self._sending:
                return future  # goes with the retransmission once connected
            full = self._puts.add(message, len(payload), self._clock.now_ms())
            if full:
                self._send_puts_locked()
            elif len(self._puts.items) == 1:
                self._lock.notify_all()  # wake the flusher for the linger deadline
        return future

    def _buffer_full(self, nbytes: int) -> tuple[ResultCode, str] | None:
        """While disconnected nothing drains the buffer: refuse beyond its bounds."""
        if len(self._pending) >= self.max_pending_puts:
            return ResultCode.LIMIT_MESSAGES, (f"retransmission buffer holds {len(self._pending)} PUTs "
                                               f"(max_pending_puts {self.max_pending_puts}) while disconnected")
        if self._pending_bytes + nbytes > self.max_pending_bytes:
            return ResultCode.LIMIT_BYTES, (f"retransmission buffer holds {self._pending_bytes} bytes "
                                            f"(max_pending_bytes {self.max_pending_bytes}) while disconnected")
        return None

    @property
    def _sending(self) -> bool:
        return self._connected and not self._held

    def _post_columns(self, q: Queue, guids: bytes, data: bytes) -> Future:
        future: Future = Future()
        frame = pb.PutColumns(queue_id=q.queue_id, arrow_ipc=data)
        with self._lock:
            self._check_live()
            refused = self._buffer_full(len(data))
            if refused is not None:
                future.set_exception(errors.AckError(refused[0], refused[1], guids[:16]))
                return future
            self._pending_columns[guids] = _PendingColumns(future, q, frame, len(data),
                                                           time.monotonic() + q.retransmission_timeout_s)
            self._pending_bytes += len(data)
            if self._sending:
                self._send_puts_locked()  # keep PUT order: batched single PUTs go first
                self._out.put(pb.Frame(put_columns=frame))
        return future

    def _confirm(self, q: Queue, guids: list[bytes]) -> None:
        if self._stopping:
            raise errors.ConnectionError("session is stopped")
        with self._lock:
            if not self._connected:
                return  # not buffered: the cluster delivers these messages again
            self._confirms.extend(pb.ConfirmMessage(queue_id=q.queue_id, guid=g) for g in guids)
            if len(self._confirms) >= self.batch_policy.max_messages:
                self._send_confirms_locked()
            else:
                self._lock.notify_all()

    def _send_puts_locked(self) -> None:
        items = self._puts.take()
        if items and self._sending:
            self._out.put(pb.Frame(put=pb.PutBatch(messages=items)))
        # Not sending: they stay in _pending and go with the retransmission.

    def _send_confirms_locked(self) -> None:
        if self._confirms:
            items, self._confirms = self._confirms, []
            if self._connected:
                self._out.put(pb.Frame(confirm=pb.ConfirmBatch(messages=items)))

    def _flush(self) -> None:
        with self._lock:
            self._send_puts_locked()
            self._send_confirms_locked()

    def _flusher(self) -> None:
        linger_s = self.batch_policy.linger_ms / 1000
        next_expiry = time.monotonic() + 0.5
        with self._lock:
            while not self._stopping and self._lost is None:
                if time.monotonic() >= next_expiry:
                    self._expire_locked()
                    next_expiry = time.monotonic() + 0.5
                deadline = self._puts.deadline_ms()
                if deadline is None and not self._confirms:
                    self._lock.wait(0.5)
                    continue
                now = self._clock.now_ms()
                if deadline is not None and now < deadline:
                    self._lock.wait((deadline - now) / 1000)
                    continue
                if self._confirms and deadline is None:
                    self._lock.wait(linger_s)  # let confirms gather for one linger period
                self._send_puts_locked()
                self._send_confirms_locked()

    def _expire_locked(self) -> None:
        """Fail PUTs buffered beyond their time bound (TIMEOUT)."""
        now = time.monotonic()
        expired = [guid for guid, put in self._pending.items() if put.deadline_s <= now]
        expired_columns = [guids for guids, entry in self._pending_columns.items() if entry.deadline_s <= now]
        if not expired and not expired_columns:
            return
        failures: list[tuple[Future, Exception]] = []
        for guid in expired:
            put = self._pending.pop(guid)
            self._pending_bytes -= len(put.message.payload)
            failures.append((put.future, errors.AckError(
                ResultCode.TIMEOUT, f"no ACK within {put.queue.retransmission_timeout_s:.0f} s", guid)))
        for guids in expired_columns:
            entry = self._pending_columns.pop(guids)
            self._pending_bytes -= entry.nbytes
            failures.append((entry.future, errors.AckError(
                ResultCode.TIMEOUT, f"no ACK within {entry.queue.retransmission_timeout_s:.0f} s", guids[:16])))
        self._lock.notify_all()
        # Resolve outside the lock: callbacks may post.
        def fail() -> None:
            for future, exc in failures:
                future.set_exception(exc)
        threading.Thread(target=fail, daemon=True).start()

    def _receive(self, responses, out: "_queue.SimpleQueue[object]", channel: grpc.Channel) -> None:
        reason = "stream ended"
        try:
            for frame in responses:
                self._on_frame(frame, out)
        except grpc.RpcError as exc:
            reason = f"{exc.code().name}: {exc.details()}"
        except Exception as exc:  # pragma: no cover - defensive
            log.exception("session receiver failed")
            reason = f"receiver failed: {exc}"
        with self._lock:
            if self._stopping or out is not self._out:
                return
            self._connected = False
            self._lock.notify_all()
            lost_host = self.host or "?"
            unacked = len(self._pending) + len(self._pending_columns)
        out.put(_CLOSE)
        channel.close()
        if not self.reconnect:
            self._lost = f"connection to {lost_host} lost ({reason})"
            self._fail_all(self._lost, ResultCode.UNKNOWN)
            return
        # Requests in flight on the lost stream: opens and configures are sent
        # again after reconnection by the reopen; the rest are answered now.
        self._emit(events.ConnectionLost(lost_host, reason, unacked))
        self._reconnect(lost_host)

    def _reconnect(self, lost_host: str) -> None:
        self._next_host += 1  # start with the next host: the lost one probably went away
        while True:
            with self._lock:
                if self._stopping:
                    return
            dialled = self._dial(min(self.connect_timeout_s, 1.0))
            if dialled is None:
                time.sleep(self.reconnect_interval_s)
                continue
            channel, host = dialled
            with self._lock:
                if self._stopping:
                    channel.close()
                    return
                self.reconnects += 1
                # Abandon requests of the lost stream: their callers retry or fail.
                stale, self._requests = self._requests, {}
                self._attach(channel, host)
                reopens = self._reopen_locked()
                retransmitted = self._retransmit_locked()
            for future in stale.values():
                if not future.done():
                    future.set_exception(errors.ConnectionError(f"connection to {lost_host} lost"))
            self._emit(events.Reconnected(host, retransmitted))
            threading.Thread(target=self._await_reopens, args=(host, reopens), daemon=True,
                             name="taproot-reopen").start()
            return

    def _reopen_locked(self) -> list[tuple[Queue, Future]]:
        """Open every queue again on the new stream (same queue ids, current
        options), ahead of any PUT."""
        reopens = []
        for q in self._queues.values():
            request = pb.OpenQueue()
            request.CopyFrom(q._open_request)
            if q.read:
                request.options.CopyFrom(q.options)
            request.request_id = next(self._request_ids)
            future: Future = Future()
            self._requests[request.request_id] = future
            self._out.put(pb.Frame(open_queue=request))
            reopens.append((q, future))
        return reopens

    def _retransmit_locked(self) -> int:
        """Every unacknowledged PUT, in the order posted (single and columnar)."""
        batch: list[pb.PutMessage] = []
        pending_columns = list(self._pending_columns.values())
        self._puts.take()  # what the batcher held is in _pending too
        for put in self._pending.values():
            batch.append(put.message)
            if len(batch) >= self.batch_policy.max_messages:
                self._out.put(pb.Frame(put=pb.PutBatch(messages=batch)))
                batch = []
        if batch:
            self._out.put(pb.Frame(put=pb.PutBatch(messages=batch)))
        for entry in pending_columns:
            self._out.put(pb.Frame(put_columns=entry.frame))
        return len(self._pending) + sum(1 for _ in pending_columns)

    def _await_reopens(self, host: str, reopens: list[tuple[Queue, Future]]) -> None:
        failed = []
        for q, future in reopens:
            try:
                response = future.result(timeout=self.request_timeout_s)
            except Exception as exc:
                log.warning("%s: not reopened after reconnection: %s", q.uri, exc)
                failed.append(q.uri)
                continue
            if response.status.code != ResultCode.SUCCESS:
                log.warning("%s: reopen refused: %s", q.uri, response.status.message)
                failed.append(q.uri)
                q._closed = True
                self._queues.pop(q.queue_id, None)
                q._inbox.put(_CLOSE)
                continue
            self._opened(q, response)
        self._emit(events.StateRestored(host, len(reopens) - len(failed), tuple(failed)))

    def _fail_all(self, reason: str, code: ResultCode) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
            columns, self._pending_columns = self._pending_columns, {}
            requests, self._requests = self._requests, {}
            self._pending_bytes = 0
            self._lock.notify_all()
        for guid, put in pending.items():
            put.future.set_exception(errors.AckError(code, reason, guid))
        for guids, entry in columns.items():
            entry.future.set_exception(errors.AckError(code, reason, guids[:16]))
        for future in requests.values():
            if not future.done():
                future.set_exception(errors.ConnectionError(reason))
        for q in list(self._queues.values()):
            q._inbox.put(_CLOSE)

    def _on_frame(self, frame: pb.Frame, out: "_queue.SimpleQueue[object]") -> None:
        kind = frame.WhichOneof("body")
        if kind == "ack":
            self._on_acks(frame.ack.messages)
        elif kind == "ack_columns":
            ack = frame.ack_columns
            guids = ack.guids  # one copy: each access of a protobuf bytes field copies it
            with self._lock:
                entry = self._pending_columns.pop(guids, None)
                if entry is not None:
                    self._pending_bytes -= entry.nbytes
                self._lock.notify_all()
            if entry is not None:
                if ack.code == ResultCode.SUCCESS:
                    entry.future.set_result([guids[i:i + 16] for i in range(0, len(guids), 16)])
                else:
                    code = ResultCode(ack.code) if ack.code in ResultCode._value2member_map_ else ResultCode.UNKNOWN
                    entry.future.set_exception(errors.AckError(code, ack.message, guids[:16]))
        elif kind == "push":
            for m in frame.push.messages:
                # One copy for several queues of this session (fanout apps, broadcast).
                targets = [q for q in (self._queues.get(i) for i in (m.queue_ids or [m.queue_id])) if q is not None]
                if not targets:
                    continue  # queue closed meanwhile: the broker redelivers elsewhere
                payload = m.payload
                if m.compression:
                    try:
                        payload = decompress(m.payload, m.compression)
                    except ValueError as exc:
                        # Delivered as received, so the application can see and dead-letter it.
                        log.error("%s: message %s: %s", targets[0].uri, m.guid.hex(), exc)
                properties = from_wire(m.properties)
                for n, q in enumerate(targets):
                    q._deliver(Message(m.guid, payload, properties if n == 0 else dict(properties), q.uri,
                                       m.delivery_count, m.sequence, m.put_time_us,
                                       COMPRESSION_NAMES.get(m.compression), q))
        elif kind in ("open_queue_response", "configure_queue_response", "close_queue_response",
                      "stop_response"):
            body = getattr(frame, kind)
            with self._lock:
                future = self._requests.get(body.request_id)
            if future is not None and not future.done():
                future.set_result(body)
        elif kind == "stop_request":
            # The host is stopping: send it no more PUTs (they wait in the
            # buffer for the next host); ACKs and CONFIRMs keep flowing.
            with self._lock:
                self._held = True
            out.put(pb.Frame(stop_response=pb.StopResponse(request_id=frame.stop_request.request_id)))
            self._emit(events.StopRequested(self.host or "?"))
        elif kind == "error":
            with self._lock:
                future = self._requests.get(frame.error.request_id)
            if future is not None and not future.done():
                future.set_result(pb.OpenQueueResponse(status=frame.error.status))
            else:
                log.warning("broker rejected a frame: %s: %s", ResultCode(frame.error.status.code).name,
                            frame.error.status.message)

    def _on_acks(self, acks: Iterable[pb.AckMessage]) -> None:
        done = []
        with self._lock:
            for ack in acks:
                put = self._pending.pop(ack.guid, None)
                if put is not None:  # None: a retransmitted PUT's second ACK, or one already failed
                    self._pending_bytes -= len(put.message.payload)
                    done.append((ack, put))
            self._lock.notify_all()
        for ack, put in done:
            if ack.code == ResultCode.SUCCESS:
                put.future.set_result(Ack(ack.guid, put.queue.uri))
            else:
                code = ResultCode(ack.code) if ack.code in ResultCode._value2member_map_ else ResultCode.UNKNOWN
                put.future.set_exception(errors.AckError(code, ack.message, ack.guid))
