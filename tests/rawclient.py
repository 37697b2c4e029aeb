"""A protocol-level client for tests: send any frame (or raw bytes), read frames."""

from __future__ import annotations

import queue
import threading

import grpc

from protocol import pb, pb_grpc
from protocol.auth import metadata as auth_metadata
from protocol.auth import token_from_env
from protocol.tls import ClientTls
from protocol.tls import channel as tls_channel

_CLOSE = object()


class RawSession:
    """With `tls` (or, without, the TAPROOT_TLS_* environment: `ClientTls.from_env`) over TLS; presenting
    the token of TAPROOT_TOKEN(_FILE) if set (`protocol.auth`)."""

    def __init__(self, address: str, tls: ClientTls | None = None):
        self.channel = tls_channel(address, tls or ClientTls.from_env())
        grpc.channel_ready_future(self.channel).result(timeout=10)
        self._out: queue.SimpleQueue = queue.SimpleQueue()
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.error: grpc.RpcError | None = None
        responses = pb_grpc.BrokerStub(self.channel).Session(self._frames(), metadata=auth_metadata(token_from_env()))
        threading.Thread(target=self._read, args=(responses,), daemon=True).start()

    def _frames(self):
        while True:
            item = self._out.get()
            if item is _CLOSE:
                return
            yield item

    def _read(self, responses) -> None:
        try:
            for frame in responses:
                self.inbox.put(frame)
        except grpc.RpcError as exc:
            self.error = exc

    def send(self, frame: pb.Frame) -> None:
        self._out.put(frame)

    def recv(self, kind: str, timeout_s: float = 10.0) -> pb.Frame:
        """The next frame of `kind` (others are dropped)."""
        import time
        deadline = time.monotonic() + timeout_s
        while True:
            frame = self.inbox.get(timeout=max(0.01, deadline - time.monotonic()))
            if frame.WhichOneof("body") == kind:
                return frame

    def open(self, queue_id: int, uri: str, read: bool = False, write: bool = True) -> pb.OpenQueueResponse:
        self.send(pb.Frame(open_queue=pb.OpenQueue(request_id=queue_id, queue_id=queue_id, uri=uri,
                                                   read=read, write=write)))
        return self.recv("open_queue_response").open_queue_response

    def close(self) -> None:
        self._out.put(_CLOSE)
        self.channel.close()


def send_garbage(address: str, payload: bytes) -> grpc.RpcError | None:
    """Open a Session stream and send bytes that are not a Frame."""
    channel = tls_channel(address, ClientTls.from_env())
    call = channel.stream_stream("/taproot.v1.Broker/Session", request_serializer=None,
                                 response_deserializer=None)
    try:
        list(call(iter([payload]), timeout=10))  # read until the server ends the stream
    except grpc.RpcError as exc:
        return exc
    finally:
        channel.close()
    return None
