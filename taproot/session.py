"""Sessions and queues: the producer/consumer API.

    with Session(hosts=["127.0.0.1:30115"]) as session:
        with session.open_queue("taproot://demo/orders", write=True) as queue:
            ack = queue.post(b"hello", properties={"region": "EU"}).result()
        with session.open_queue("taproot://demo/orders", read=True) as queue:
            for message in queue.messages(timeout_s=5):
                queue.confirm(message)

Thread safety: every public method may be called from any thread. One session
is one gRPC stream; PUTs and CONFIRMs are batched on it (`BatchPolicy`). Each
PUT's future is resolved by its ACK: with an `Ack` on success, with `AckError`
otherwise. If the link drops, every PUT still waiting completes with
`AckError(UNKNOWN)`: the message may or may not have been persisted.
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
from taproot import errors
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
        self.options = pb.QueueOptions()  # the consumer options in force (read queues)
        self._on_message = on_message
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
            if not self._session._lost:
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
    """A connection to a Taproot proxy or node. Use as a context manager."""

    def __init__(self, hosts: Sequence[str] = ("127.0.0.1:30115",), *, batch: BatchPolicy | None = None,
                 connect_timeout_s: float = 10.0, request_timeout_s: float = 30.0,
                 max_pending_puts: int = 100_000):
        if not hosts:
            raise ValueError("hosts must name at least one host:port")
        self.hosts = list(hosts)
        self.batch_policy = batch or BatchPolicy()
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self.max_pending_puts = max_pending_puts
        self.host: str | None = None
        self._guids = GuidGenerator()
        self._clock = MonotonicClock()
        self._lock = threading.Condition()
        self._puts = Batcher(self.batch_policy)
        self._confirms: list[pb.ConfirmMessage] = []
        self._pending: dict[bytes, _PendingPut] = {}
        self._pending_columns: dict[bytes, Future] = {}  # the frame's GUIDs -> future
        self._requests: dict[int, Future] = {}
        self._queues: dict[int, Queue] = {}
        self._queue_ids = itertools.count(1)
        self._request_ids = itertools.count(1)
        self._out: "_queue.SimpleQueue[object]" = _queue.SimpleQueue()
        self._channel: grpc.Channel | None = None
        self._lost: str | None = None
        self._stopping = False
        self._threads: list[threading.Thread] = []

    # -- lifecycle ----------------------------------------------------------
    def __enter__(self) -> "Session":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        failures = []
        for host in self.hosts:
            channel = grpc.insecure_channel(host, options=GRPC_OPTIONS)
            try:
                grpc.channel_ready_future(channel).result(timeout=self.connect_timeout_s)
            except grpc.FutureTimeoutError:
                channel.close()
                failures.append(host)
                continue
            self._channel, self.host = channel, host
            break
        else:
            raise errors.ConnectionError(f"no host reachable within {self.connect_timeout_s}s: {failures}")
        stub = pb_grpc.BrokerStub(self._channel)
        responses = stub.Session(drain(self._out))
        for target, name in ((lambda: self._receive(responses), "receiver"), (self._flusher, "flusher")):
            thread = threading.Thread(target=target, name=f"taproot-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

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
        self._stopping = True
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
        self._queues[queue_id] = q
        open_queue = pb.OpenQueue(queue_id=queue_id, uri=uri, read=read, write=write)
        if read:
            options = self._options(max_unconfirmed_messages, max_unconfirmed_bytes, consumer_priority)
            options.subscriptions.extend(_subscriptions(subscription))
            q.options = options
            if any(v is not None for v in (max_unconfirmed_messages, max_unconfirmed_bytes, consumer_priority,
                                           subscription)):
                open_queue.options.CopyFrom(options)
        try:
            response = self._request(pb.Frame(open_queue=open_queue), "open_queue", timeout_s)
        except BaseException:
            self._queues.pop(queue_id, None)
            raise
        q.max_payload_bytes = response.max_payload_bytes
        if read and response.HasField("options"):
            q.options = response.options  # the domain's defaults filled in
        return q

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
        request_id = next(self._request_ids)
        getattr(frame, kind).request_id = request_id
        future: Future = Future()
        with self._lock:
            self._requests[request_id] = future
        self._out.put(frame)
        timeout = self.request_timeout_s if timeout_s is None else timeout_s
        try:
            response = future.result(timeout=timeout)
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
            while len(self._pending) >= self.max_pending_puts and self._lost is None and not self._stopping:
                self._lock.wait(0.1)  # bounded buffer: block the producer, never drop
            self._check_live()
            self._pending[guid] = _PendingPut(future, q, time.perf_counter_ns())
            full = self._puts.add(message, len(payload), self._clock.now_ms())
            if full:
                self._send_puts_locked()
            elif len(self._puts.items) == 1:
                self._lock.notify_all()  # wake the flusher for the linger deadline
        return future

    def _post_columns(self, q: Queue, guids: bytes, data: bytes) -> Future:
        future: Future = Future()
        with self._lock:
            self._check_live()
            self._pending_columns[guids] = future
            self._send_puts_locked()  # keep PUT order: batched single PUTs go first
        self._out.put(pb.Frame(put_columns=pb.PutColumns(queue_id=q.queue_id, arrow_ipc=data)))
        return future

    def _confirm(self, q: Queue, guids: list[bytes]) -> None:
        self._check_live()
        with self._lock:
            self._confirms.extend(pb.ConfirmMessage(queue_id=q.queue_id, guid=g) for g in guids)
            if len(self._confirms) >= self.batch_policy.max_messages:
                self._send_confirms_locked()
            else:
                self._lock.notify_all()

    def _send_puts_locked(self) -> None:
        items = self._puts.take()
        if items:
            self._out.put(pb.Frame(put=pb.PutBatch(messages=items)))

    def _send_confirms_locked(self) -> None:
        if self._confirms:
            items, self._confirms = self._confirms, []
            self._out.put(pb.Frame(confirm=pb.ConfirmBatch(messages=items)))

    def _flush(self) -> None:
        with self._lock:
            self._send_puts_locked()
            self._send_confirms_locked()

    def _flusher(self) -> None:
        linger_s = self.batch_policy.linger_ms / 1000
        with self._lock:
            while not self._stopping and self._lost is None:
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

    def _receive(self, responses) -> None:
        reason = "stream ended"
        try:
            for frame in responses:
                self._on_frame(frame)
        except grpc.RpcError as exc:
            reason = f"{exc.code().name}: {exc.details()}"
        except Exception as exc:  # pragma: no cover - defensive
            log.exception("session receiver failed")
            reason = f"receiver failed: {exc}"
        if not self._stopping:
            self._lost = f"connection to {self.host} lost ({reason})"
            self._fail_all(self._lost, ResultCode.UNKNOWN)

    def _fail_all(self, reason: str, code: ResultCode) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
            columns, self._pending_columns = self._pending_columns, {}
            requests, self._requests = self._requests, {}
            self._lock.notify_all()
        for guid, put in pending.items():
            put.future.set_exception(errors.AckError(code, reason, guid))
        for guids, future in columns.items():
            future.set_exception(errors.AckError(code, reason, guids[:16]))
        for future in requests.values():
            if not future.done():
                future.set_exception(errors.ConnectionError(reason))
        for q in list(self._queues.values()):
            q._inbox.put(_CLOSE)

    def _on_frame(self, frame: pb.Frame) -> None:
        kind = frame.WhichOneof("body")
        if kind == "ack":
            self._on_acks(frame.ack.messages)
        elif kind == "ack_columns":
            ack = frame.ack_columns
            guids = ack.guids  # one copy: each access of a protobuf bytes field copies it
            with self._lock:
                future = self._pending_columns.pop(guids, None)
                self._lock.notify_all()
            if future is not None:
                if ack.code == ResultCode.SUCCESS:
                    future.set_result([guids[i:i + 16] for i in range(0, len(guids), 16)])
                else:
                    code = ResultCode(ack.code) if ack.code in ResultCode._value2member_map_ else ResultCode.UNKNOWN
                    future.set_exception(errors.AckError(code, ack.message, guids[:16]))
        elif kind == "push":
            for m in frame.push.messages:
                q = self._queues.get(m.queue_id)
                if q is None:
                    continue  # queue closed meanwhile: the broker redelivers elsewhere
                payload = m.payload
                if m.compression:
                    try:
                        payload = decompress(m.payload, m.compression)
                    except ValueError as exc:
                        # Delivered as received, so the application can see and dead-letter it.
                        log.error("%s: message %s: %s", q.uri, m.guid.hex(), exc)
                q._deliver(Message(m.guid, payload, from_wire(m.properties), q.uri, m.delivery_count,
                                   m.sequence, m.put_time_us, COMPRESSION_NAMES.get(m.compression), q))
        elif kind in ("open_queue_response", "configure_queue_response", "close_queue_response",
                      "stop_response"):
            body = getattr(frame, kind)
            with self._lock:
                future = self._requests.get(body.request_id)
            if future is not None and not future.done():
                future.set_result(body)
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
                if put is not None:
                    done.append((ack, put))
            self._lock.notify_all()
        for ack, put in done:
            if ack.code == ResultCode.SUCCESS:
                put.future.set_result(Ack(ack.guid, put.queue.uri))
            else:
                code = ResultCode(ack.code) if ack.code in ResultCode._value2member_map_ else ResultCode.UNKNOWN
                put.future.set_exception(errors.AckError(code, ack.message, ack.guid))
