"""Server-side plumbing for `Broker.Session` streams, shared by every role.

A `Link` is one session stream seen from the server: frames go out through
`send` (thread safe, never blocks), and `serve_session` runs the stream: a
reader thread hands each inbound frame to `on_frame`, the gRPC worker thread
yields outbound frames, and `on_close` runs once when either side ends.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import queue
import signal
import threading
from concurrent import futures
from typing import Callable, Iterator

import grpc

from protocol import taproot_pb2 as pb
from protocol import taproot_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
_ids = itertools.count(1)
CLOSE = object()  # put on a frame queue to end the stream that drains it


def drain(frames: "queue.SimpleQueue[object]") -> Iterator[pb.Frame]:
    """Yield frames from `frames` until CLOSE: the request or response iterator
    of a gRPC stream fed by other threads."""
    while True:
        frame = frames.get()
        if frame is CLOSE:
            return
        yield frame  # type: ignore[misc]

# Batches of 1 KiB messages run to megabytes; 64 MiB payloads must fit too.
_SIZES = [
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
    ("grpc.max_send_message_length", 256 * 1024 * 1024),
]
# Clients ping every 10 s so a dead peer is noticed within ~15 s even when idle.
GRPC_OPTIONS = _SIZES + [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]
# Servers must accept those pings (gRPC's default answers them with GOAWAY).
SERVER_GRPC_OPTIONS = _SIZES + [
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_ping_strikes", 0),
]


class Link:
    def __init__(self, peer: str):
        self.id = next(_ids)
        self.peer = peer
        self.columnar: set[int] = set()   # queue ids whose consumer takes PushColumns frames
        self._out: "queue.SimpleQueue[object]" = queue.SimpleQueue()
        self._closed = threading.Event()

    def __repr__(self) -> str:
        return f"Link({self.id}, {self.peer})"

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def send(self, frame: pb.Frame) -> None:
        if not self._closed.is_set():
            self._out.put(frame)

    def close(self) -> None:
        if not self._closed.is_set():
            self._closed.set()
            self._out.put(CLOSE)

    def frames(self) -> Iterator[pb.Frame]:
        return drain(self._out)


def serve_session(request_iterator: Iterator[pb.Frame], context: grpc.ServicerContext,
                  on_open: Callable[[Link], None], on_frame: Callable[[Link, pb.Frame], None],
                  on_close: Callable[[Link], None]) -> Iterator[pb.Frame]:
    link = Link(context.peer())

    def read() -> None:
        try:
            for frame in request_iterator:
                try:
                    on_frame(link, frame)
                except Exception as exc:
                    # A bug in a handler must not take the server down or
                    # leave the peer waiting: answer with an error frame.
                    log.exception("%r: frame handler failed", link)
                    link.send(pb.Frame(error=pb.FrameError(status=pb.Status(
                        code=pb.UNKNOWN, message=f"internal error: {exc}"))))
        except grpc.RpcError:
            pass  # peer went away or sent an undecodable frame: only this link ends
        except Exception:
            log.exception("%r: reader failed", link)
        finally:
            # on_close runs here, on the reader thread, after the last frame was
            # handled, so a frame handler and the close never race (a queue
            # opened by a frame still in flight would otherwise outlive the link).
            link.close()
            try:
                on_close(link)
            except Exception:
                log.exception("%r: close handler failed", link)

    on_open(link)
    # When the RPC ends, stop the response side; the request iterator then ends
    # too, and the reader closes the link.
    context.add_callback(link.close)
    threading.Thread(target=read, name=f"link-{link.id}", daemon=True).start()
    yield from link.frames()


def serve_broker(servicer: object, role: str, host: str, port: int, *, ready_file: str | None = None,
                 stop_event: threading.Event | None = None,
                 on_started: Callable[[int], None] | None = None,
                 before_stop: Callable[[], None] | None = None) -> None:
    """Serve `servicer` (a BrokerServicer) on host:port until SIGINT/SIGTERM or
    `stop_event`; write the ready file (with the bound port) once serving.
    `on_started(port)` runs once bound, before the ready file; `before_stop`
    runs while the server still serves (a graceful drain). Returns after the
    server has stopped; the caller then stops its role."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=256, thread_name_prefix="grpc"),
                         options=SERVER_GRPC_OPTIONS)
    pb_grpc.add_BrokerServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise SystemExit(f"{role}: cannot bind {host}:{port}")
    server.start()
    log.info("%s serving on %s:%d", role, host, bound)
    stop = stop_event or threading.Event()
    if stop_event is None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    if on_started is not None:
        on_started(bound)
    write_ready_file(ready_file, port=bound, host=host)
    # With a timeout: the kernel may deliver SIGTERM to any thread (gRPC's,
    # delta-rs's), and Python runs the handler only when the main thread next
    # wakes. A bare wait() then slept through it until the launcher's SIGKILL.
    while not stop.wait(0.2):
        pass
    log.info("%s stopping", role)
    if before_stop is not None:
        try:
            before_stop()
        except Exception:
            log.exception("%s: graceful stop failed; stopping anyway", role)
    # Bounded: grpcio's shutdown event sometimes never fires after a client
    # sent a corrupt frame (seen in tests: the process then waited for its
    # launcher's SIGKILL). The role has stopped by now, so leaving is safe.
    if not server.stop(grace=2).wait(3):
        log.warning("%s: gRPC server shutdown did not finish in 3 s; exiting anyway", role)


def write_ready_file(path: str | None, **info: object) -> None:
    """Tell a launcher we are serving (atomically: write then rename)."""
    if not path:
        return
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump({"pid": os.getpid(), **info}, fh)
    os.replace(tmp, path)
