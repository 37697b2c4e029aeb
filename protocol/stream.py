"""Server-side plumbing for `Broker.Session` streams, shared by every role.

A `Link` is one session stream seen from the server: frames go out through
`send` (thread safe, never blocks). The server is grpc.aio on the process's
event loop, a thread of its own (`event_loop`, `serve_broker`), so a session costs no thread: thousands of
clients below one node or proxy are served (the thread pool of the first
versions held one thread per session, and the 257th session hung).

`serve_session` runs a stream: inbound frames are handed to `on_frame` on a
shared pool of frame threads (`FRAME_THREADS`; the roles' handlers are
ordinary blocking Python), one frame of a link at a time and in order;
outbound frames are written by the event loop as `send` queues them;
`on_close` runs once, after the link's last frame was handled.

`send` serializes the frame on the sender's thread and queues its bytes: the
stream writes them as they are (`serialized`), and the outbound bound counts
their length. Asking the frame for its size instead (`ByteSize`) costs as
much as serializing it once more with the upb protobuf runtime, about 157 µs
for a 1.1 MB PUSH frame (`taproot_ops.bench.frame_cost`); and the event
loop, which every session of the server shares, no longer does the
serializing.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import queue
import signal
import threading
from concurrent import futures
from typing import Any, AsyncIterator, Callable, Iterator, Mapping, cast

import grpc

from protocol import bundles, gc_tuning, malloc_tuning
from protocol import taproot_pb2 as pb
from protocol import taproot_pb2_grpc as pb_grpc
from protocol.auth import Authenticator, LinkAuth, admit, presented
from protocol.tls import ServerTls, add_port

log = logging.getLogger(__name__)
_ids = itertools.count(1)
CLOSE = object()  # put on a frame queue to end the stream that drains it


def drain(frames: "queue.SimpleQueue[object]",
          bundled: Callable[[], bool] | None = None) -> "Iterator[pb.Frame | bytes]":
    """Yield frames from `frames` until CLOSE: the request or response iterator
    of a gRPC stream fed by other threads (written with `serialized`). Once
    `bundled()` says the peer reads bundles, whatever is queued when the
    stream writes goes as one message (`protocol.bundles`)."""
    while True:
        frame = frames.get()
        if frame is CLOSE:
            return
        if bundled is None or not bundled():
            yield frame  # type: ignore[misc]
            continue
        taken, closing = take_queued(frame, frames.get_nowait)
        yield from bundles.pack([serialized(f) for f in taken])  # type: ignore[arg-type]
        if closing:
            return


def take_queued(first: object, get_nowait: Callable[[], object]) -> tuple[list[object], bool]:
    """`first` and whatever else a stream's queue holds now (up to
    `bundles.TAKE_MAX_FRAMES`), to be written at once; and whether CLOSE
    came after them (the stream ends once they are written)."""
    taken = [first]
    while len(taken) < bundles.TAKE_MAX_FRAMES:
        try:
            more = get_nowait()
        except queue.Empty:
            break
        if more is CLOSE:
            return taken, True
        taken.append(more)
    return taken, False

# Batches of 1 KiB messages run to megabytes; 64 MiB payloads must fit too.
_SIZES = [
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
    ("grpc.max_send_message_length", 256 * 1024 * 1024),
]
# A peer that stops answering without closing anything (a frozen process, a
# link that stops forwarding) is noticed by HTTP/2 pings: clients ping after
# 1 s without a byte from the peer and give up on the connection when no
# answer comes within 2 s, so the SDK and the relays move to another host
# about 3 s after the last byte; the fault suite's failover bound is 5 s.
GRPC_OPTIONS = _SIZES + [
    ("grpc.keepalive_time_ms", 1_000),
    ("grpc.keepalive_timeout_ms", 2_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]
# Servers accept those pings (gRPC's default answers them with GOAWAY) and
# ping their own peers every 2 s, so a node lets go of a frozen proxy's
# consumers (their messages go to others) within about 4 s.
SERVER_GRPC_OPTIONS = _SIZES + [
    ("grpc.keepalive_time_ms", 2_000),
    ("grpc.keepalive_timeout_ms", 2_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 500),
    ("grpc.http2.max_ping_strikes", 0),
]


# Bytes a link may hold for a peer that does not read (a consumer with a vast
# window, a broadcast consumer, a stalled relay). Beyond it the link is
# dropped: its consumers' unconfirmed messages go to others, the peer sees
# its stream end and reconnects; nothing else on the server waits for it.
OUTBOUND_MAX_BYTES = 256 * 1024 * 1024


class Link:
    def __init__(self, peer: str, max_outbound_bytes: int | None = None):
        self.id = next(_ids)
        self.peer = peer
        self.columnar: set[int] = set()   # queue ids whose consumer takes PushColumns frames
        # Of those, each queue's OpenQueue.push_group (the session it ends at,
        # below a relay): one PushColumns frame spans queues of one group.
        self.push_groups: dict[int, int] = {}
        self.broadcast: set[int] = set()  # queue ids read in broadcast mode (no confirms, no seqs)
        # The peer reads several frames in one message (`protocol.bundles`):
        # the writer then sends whatever is queued at once as one.
        self.bundles = False
        self._out: "queue.SimpleQueue[object]" = queue.SimpleQueue()   # each frame's bytes, or CLOSE
        self._closed = threading.Event()
        # The event loop writing this link, woken when a frame is queued while
        # it waits (`aio_frames`); None for a link read with `frames()`.
        self._wake: Callable[[], object] | None = None
        self._waiting = False
        self.max_outbound_bytes = OUTBOUND_MAX_BYTES if max_outbound_bytes is None else max_outbound_bytes
        self.outbound_bytes = 0             # queued by `send`, not yet taken by the writer
        self._bytes_lock = threading.Lock()  # `send` runs on many threads, the writer on the loop's
        self.dropped: str | None = None     # why the link was dropped, if it was
        self.dropped_code = grpc.StatusCode.RESOURCE_EXHAUSTED
        self._abort: Callable[[], object] | None = None   # ends the stream now (set by `serve_session`)
        # Sees every frame queued for the peer (a role's metrics: `protocol.metrics.FrameCounts`).
        self.observer: Callable[[pb.Frame], None] | None = None

    def __repr__(self) -> str:
        return f"Link({self.id}, {self.peer})"

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def send(self, frame: pb.Frame) -> None:
        """Queue `frame` for the peer (serialized now: a change to it after
        this call does not reach the peer)."""
        if self._closed.is_set():
            return
        data = frame.SerializeToString()
        size = len(data)
        with self._bytes_lock:
            queued = self.outbound_bytes + size
            if queued <= self.max_outbound_bytes:
                self.outbound_bytes = queued
        if queued > self.max_outbound_bytes:
            self.drop(f"slow peer: {queued:,} bytes waiting to be sent (max {self.max_outbound_bytes:,})")
            return
        self._out.put(data)
        self._notify()
        if self.observer is not None:
            self.observer(frame)

    def drop(self, reason: str, code: grpc.StatusCode = grpc.StatusCode.RESOURCE_EXHAUSTED) -> None:
        """Give up on a peer that does not read (or whose token is no longer
        good, `code` UNAUTHENTICATED): what is queued for it is discarded, no
        more frames are taken from it, and the close handler runs now (its
        consumers' unconfirmed messages go to others). gRPC cannot end a
        stream whose write waits on the peer's flow control, so the peer
        learns why (`code`) when it reads again."""
        if self.dropped is not None:
            return
        self.dropped = reason
        self.dropped_code = code
        log.warning("%r: dropped: %s", self, reason)
        try:
            while True:
                self._taken(self._out.get_nowait())
        except queue.Empty:
            pass
        self.close()
        if self._abort is not None:
            self._abort()

    def close(self) -> None:
        if not self._closed.is_set():
            self._closed.set()
            self._out.put(CLOSE)
            self._notify()

    def _notify(self) -> None:
        # Only a writer that waits is woken: one call into the loop per idle
        # period, not per frame. The writer says it waits before it looks at
        # the queue a last time, so a frame queued meanwhile is never missed.
        if self._waiting and self._wake is not None:
            self._waiting = False
            self._wake()

    def _taken(self, item: object) -> object:
        """A queued item as the writer takes it: a frame's bytes, or CLOSE."""
        if item is CLOSE:
            return CLOSE
        data = cast(bytes, item)
        with self._bytes_lock:
            self.outbound_bytes -= len(data)
        return data

    def next_frame(self, timeout: float | None = None) -> pb.Frame:
        """The next queued frame, parsed (raises queue.Empty after
        `timeout`): for tests and tools that read a link in place of a stream."""
        data = self._taken(self._out.get(timeout=timeout))
        if data is CLOSE:
            raise queue.Empty("link closed")
        frame: pb.Frame = pb.Frame.FromString(cast(bytes, data))
        return frame

    async def aio_frames(self) -> AsyncIterator[bytes]:
        """The frames `send` queues, serialized, until `close`, on the running
        event loop (a stream writes them with `serialized`)."""
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        on_loop = threading.get_ident()

        def wake() -> None:
            # A sender on the loop's own thread (a relay's handler inline, an
            # upstream session's reader) sets the event directly: no write to
            # the loop's self-pipe and no wake-up of its selector.
            if threading.get_ident() == on_loop:
                ready.set()
            else:
                loop.call_soon_threadsafe(ready.set)

        self._wake = wake
        while True:
            try:
                data = self._taken(self._out.get_nowait())
            except queue.Empty:
                ready.clear()
                self._waiting = True
                if self._out.empty():
                    await ready.wait()
                self._waiting = False
                continue
            if data is CLOSE or self.dropped is not None:
                return
            taken, closing = (take_queued(data, lambda: self._taken(self._out.get_nowait())) if self.bundles
                              else ([data], False))
            bundles.STREAMS.frames_out += len(taken)
            for message in bundles.pack(cast(list[bytes], taken)):   # a frame alone goes as it is
                bundles.STREAMS.messages_out += 1
                yield message
            if closing:
                return


_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def event_loop() -> asyncio.AbstractEventLoop:
    """The process's one event loop for gRPC, running on a daemon thread of
    its own (started on first use): every grpc.aio server (`serve_broker`)
    and upstream session (`replicas.upstream`) of the process runs on it.
    One loop, because grpc.aio wakes every loop bound to its completion
    queue on each event (grpc/grpc#25364), and because a proxy relaying
    between its clients' streams and its upstream on one thread hands
    nothing between threads."""
    global _loop
    with _loop_lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="grpc-loop", daemon=True).start()
        return _loop


FRAME_THREADS = 16   # frame handlers running at once, over every session of a server
_frame_pool: futures.ThreadPoolExecutor | None = None
_frame_pool_lock = threading.Lock()


def frame_pool() -> futures.ThreadPoolExecutor:
    global _frame_pool
    with _frame_pool_lock:
        if _frame_pool is None:
            _frame_pool = futures.ThreadPoolExecutor(FRAME_THREADS, thread_name_prefix="frames")
        return _frame_pool


async def serve_session(request_iterator: AsyncIterator[pb.Frame], context: Any,
                        on_open: Callable[[Link], None], on_frame: Callable[[Link, pb.Frame], None],
                        on_close: Callable[[Link], None],
                        max_outbound_bytes: int | None = None,
                        inline: bool | Callable[[pb.Frame], bool] = False,
                        auth: Authenticator | None = None) -> AsyncIterator[bytes]:
    """One client stream: each frame goes to `on_frame` in order, the
    frames the link is sent go back. Handlers run on the frame pool's
    threads, or, `inline`, on the event loop's own thread: for handlers that
    never block (a relay's header rewrite and a queue put), which then save
    two thread hand-offs per frame. `inline` may also be a predicate: the
    frames it picks run on the loop, the others on the pool (after every
    frame before them: the order holds). With `auth` the stream's token is
    checked at each OpenQueue (`protocol.auth.admit`) before the role sees it."""
    pool = frame_pool()
    picks = inline if callable(inline) else None
    link = Link(context.peer(), max_outbound_bytes)
    last: list["futures.Future[None]"] = []
    called_with = context.invocation_metadata()
    token = LinkAuth(presented(called_with)) if auth is not None else None
    link.bundles = bundles.offered(called_with)

    def handle(frame: pb.Frame) -> None:
        if link.dropped is not None:
            return   # the rest of a bundle read before the link was dropped: as if never read
        try:
            if auth is not None and token is not None:
                verdict = admit(auth, token, frame)
                if isinstance(verdict, str):
                    link.drop(f"token: {verdict}", grpc.StatusCode.UNAUTHENTICATED)
                    return
                if verdict is not None:
                    link.send(verdict)
                    return
            on_frame(link, frame)
        except Exception as exc:
            # A bug in a handler must not take the server down or leave the
            # peer waiting: answer with an error frame.
            log.exception("%r: frame handler failed", link)
            link.send(pb.Frame(error=pb.FrameError(status=pb.Status(
                code=pb.UNKNOWN, message=f"internal error: {exc}"))))

    def closed() -> None:
        try:
            on_close(link)
        except Exception:
            log.exception("%r: close handler failed", link)

    failed: list[str] = []

    def handle_run(frames: list[pb.Frame]) -> None:
        for frame in frames:
            handle(frame)

    async def on_pool(frames: list[pb.Frame]) -> None:
        # A bundle's frames for the pool go in one hand-off, not one each.
        last[:] = [pool.submit(handle_run, frames)]
        await asyncio.wrap_future(last[0])

    async def read() -> None:
        try:
            async for message in request_iterator:
                run: list[pb.Frame] = []
                for frame in bundles.STREAMS.read(message):
                    if inline is True or (picks is not None and picks(frame)):
                        if run:
                            await on_pool(run)
                            run = []
                        handle(frame)
                    else:
                        run.append(frame)
                if run:
                    await on_pool(run)
        except (grpc.RpcError, asyncio.CancelledError):
            pass  # the peer went away: only this link ends
        except Exception as exc:
            # Bytes that are not a Frame: the stream ends with INVALID_ARGUMENT.
            log.warning("%r: unreadable frame, stream ended: %s", link, exc)
            failed.append(f"unreadable frame: {exc}")
        finally:
            # on_close runs after the last frame was handled, so a frame
            # handler and the close never race (a queue opened by a frame
            # still in flight would otherwise outlive the link).
            link.close()
            if last and not last[0].done():
                last[0].add_done_callback(lambda _: pool.submit(closed))
            else:
                pool.submit(closed)

    loop = asyncio.get_running_loop()
    # Tells the caller it may write several frames a message.
    await context.send_initial_metadata(bundles.BUNDLES_METADATA)
    if inline is True:
        on_open(link)
    else:
        await asyncio.wrap_future(pool.submit(on_open, link))
    # When the RPC ends, stop the response side; the request side then ends
    # too, and the reader closes the link.
    context.add_done_callback(lambda _: link.close())
    reader = asyncio.ensure_future(read())
    # A dropped link takes no more frames from its peer: the reader stops,
    # and the close handler runs once the frame in hand is handled.
    link._abort = lambda: loop.call_soon_threadsafe(reader.cancel)
    try:
        async for frame in link.aio_frames():
            yield frame
    finally:
        link.close()
        if not reader.done():
            reader.cancel()
    if link.dropped is not None:
        await context.abort(link.dropped_code, link.dropped)
    if failed:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, failed[0])


def serialized(frame: "pb.Frame | bytes") -> bytes:
    """A Session stream's outbound message on the wire: the bytes `Link.send`
    made, as they are, or a frame (a servicer that yields frames)."""
    return frame if isinstance(frame, bytes) else frame.SerializeToString()


SERVICE = "taproot.v1.Broker"
SESSION_METHOD = f"/{SERVICE}/Session"   # what a relay's upstream calls (`replicas.upstream`)


def session_stream(channel: Any) -> Any:
    """The Session method on `channel` (sync or grpc.aio), to call with the
    request iterator: requests written with `serialized` (a link's bytes as
    they are, or frames), responses read as frames (a bundle among them)."""
    return channel.stream_stream(SESSION_METHOD, request_serializer=serialized,
                                 response_deserializer=pb.Frame.FromString)


def add_broker(servicer: Any, server: Any) -> None:
    """`pb_grpc.add_BrokerServicer_to_server`, but the Session stream's
    responses go through `serialized`: a role's links yield bytes."""
    handlers = {
        "Session": grpc.stream_stream_rpc_method_handler(
            servicer.Session, request_deserializer=pb.Frame.FromString, response_serializer=serialized),
        "NotifyDelivery": grpc.unary_unary_rpc_method_handler(
            servicer.NotifyDelivery, request_deserializer=pb.DeliveryNotice.FromString,
            response_serializer=pb.NoticeAck.SerializeToString),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)


def serve_broker(servicer: object, role: str, host: str, port: int, *, ready_file: str | None = None,
                 stop_event: threading.Event | None = None,
                 on_started: Callable[[int], None] | None = None,
                 before_stop: Callable[[], None] | None = None,
                 ready_info: Mapping[str, object] | None = None, admin: object | None = None,
                 tls: ServerTls | None = None) -> None:
    """Serve `servicer` (a BrokerServicer whose methods are coroutines) on
    host:port until SIGINT/SIGTERM or `stop_event`; write the ready file (with
    the bound port) once serving. `on_started(port)` runs once bound, before
    the ready file; `before_stop` runs while the server still serves (a
    graceful drain). Returns after the server has stopped; the caller then
    stops its role. The server runs on the process's event loop (`event_loop`).
    `ready_info` goes into the ready file too (the HTTP port); `admin`, an
    AdminServicer, is served on the same port (`protocol.admin`); with `tls`
    the port takes TLS only (`protocol.tls`)."""
    loop = event_loop()

    async def start() -> tuple[Any, int]:
        server = grpc.aio.server(options=SERVER_GRPC_OPTIONS)
        add_broker(servicer, server)
        if admin is not None:
            pb_grpc.add_AdminServicer_to_server(admin, server)  # type: ignore[no-untyped-call]
        bound = add_port(server, f"{host}:{port}", tls)
        if bound:
            await server.start()
        return server, bound

    server, bound = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    if bound == 0:
        raise SystemExit(f"{role}: cannot bind {host}:{port}")
    log.info("%s serving on %s:%d", role, host, bound)
    stop = stop_event or threading.Event()
    if stop_event is None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    if on_started is not None:
        on_started(bound)
    # This server is the process (it took the signals): its garbage
    # collector and its C allocator are tuned for serving (`gc_tuning`,
    # `malloc_tuning`); in a test's process they are left alone.
    gc_watch = gc_tuning.settle_for_serving() if stop_event is None else None
    if stop_event is None:
        log.info("%s: %s", role, malloc_tuning.tune().describe())
    write_ready_file(ready_file, port=bound, host=host, **(ready_info or {}))
    # With a timeout: the kernel may deliver SIGTERM to any thread (gRPC's,
    # delta-rs's), and Python runs the handler only when the main thread next
    # wakes. A bare wait() then slept through it until the launcher's SIGKILL.
    while not stop.wait(0.2):
        pass
    log.info("%s stopping", role)
    if gc_watch is not None:
        log.info("%s: garbage collector while serving: %s", role, gc_watch.describe())
    if before_stop is not None:
        try:
            before_stop()
        except Exception:
            log.exception("%s: graceful stop failed; stopping anyway", role)
    # Bounded: the role has stopped by now, so leaving is safe.
    try:
        asyncio.run_coroutine_threadsafe(server.stop(grace=2), loop).result(3)
    except Exception:
        log.warning("%s: gRPC server shutdown did not finish in 3 s; exiting anyway", role)


def write_ready_file(path: str | None, **info: object) -> None:
    """Tell a launcher we are serving (atomically: write then rename)."""
    if not path:
        return
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump({"pid": os.getpid(), **info}, fh)
    os.replace(tmp, path)
