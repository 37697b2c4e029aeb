"""`taproot proxy`: an edge node relaying client sessions to a cluster node."""

from __future__ import annotations

import logging
import queue
import threading

import grpc

from protocol import pb, pb_grpc
from protocol.stream import CLOSE, GRPC_OPTIONS, Link, drain, serve_broker, serve_session
from replicas.relay import UPSTREAM, Relay

log = logging.getLogger(__name__)


class Proxy:
    def __init__(self, upstream_address: str, reconnect_interval_s: float = 0.5):
        self.upstream_address = upstream_address
        self.reconnect_interval_s = reconnect_interval_s
        self.relay = Relay()
        self.relay.connected = False
        self._lock = threading.Lock()
        self._links: set[Link] = set()
        self._up_out: "queue.SimpleQueue[object]" = queue.SimpleQueue()
        self._stop = threading.Event()
        self._connected = threading.Event()
        self._thread = threading.Thread(target=self._upstream_loop, name="proxy-upstream", daemon=True)

    def start(self, connect_timeout_s: float = 30.0) -> None:
        self._thread.start()
        if not self._connected.wait(connect_timeout_s):
            log.warning("proxy: upstream %s not reachable yet; retrying in the background",
                        self.upstream_address)

    def stop(self) -> None:
        self._stop.set()
        self._up_out.put(CLOSE)
        self._thread.join(5)

    # -- downstream ---------------------------------------------------------
    def open_link(self, link: Link) -> None:
        with self._lock:
            self._links.add(link)

    def on_frame(self, link: Link, frame: pb.Frame) -> None:
        with self._lock:
            out = self.relay.from_downstream(link, frame)
            self._send(out)

    def close_link(self, link: Link) -> None:
        with self._lock:
            self._links.discard(link)
            self._send(self.relay.downstream_closed(link))

    def _send(self, out) -> None:
        # Called with the lock held: upstream order must match relay order.
        for destination, frame in out:
            if destination == UPSTREAM:
                self._up_out.put(frame)
            else:
                destination.send(frame)

    # -- upstream -----------------------------------------------------------
    def _upstream_loop(self) -> None:
        while not self._stop.is_set():
            channel = grpc.insecure_channel(self.upstream_address, options=GRPC_OPTIONS)
            try:
                grpc.channel_ready_future(channel).result(timeout=self.reconnect_interval_s * 4)
            except grpc.FutureTimeoutError:
                channel.close()
                self._stop.wait(self.reconnect_interval_s)
                continue
            with self._lock:
                self._up_out = queue.SimpleQueue()
                self.relay = Relay()
            responses = pb_grpc.BrokerStub(channel).Session(drain(self._up_out))
            log.info("proxy: connected upstream to %s", self.upstream_address)
            self._connected.set()
            reason = "upstream stream ended"
            try:
                for frame in responses:
                    with self._lock:
                        self._send(self.relay.from_upstream(frame))
            except grpc.RpcError as exc:
                reason = f"upstream lost: {exc.code().name}"
            self._connected.clear()
            with self._lock:
                self._send(self.relay.upstream_lost(reason))
                links, self._links = list(self._links), set()
            for link in links:
                link.close()  # clients see the session end and reconnect
            self._up_out.put(CLOSE)
            channel.close()
            if not self._stop.is_set():
                log.warning("proxy: %s; reconnecting", reason)
                self._stop.wait(self.reconnect_interval_s)


class ProxyServicer(pb_grpc.BrokerServicer):
    def __init__(self, proxy: Proxy):
        self.proxy = proxy

    def Session(self, request_iterator, context):  # noqa: N802
        return serve_session(request_iterator, context, self.proxy.open_link, self.proxy.on_frame,
                             self.proxy.close_link)


def serve(host: str, port: int, upstream_address: str, *, ready_file: str | None = None,
          stop_event: threading.Event | None = None) -> None:
    proxy = Proxy(upstream_address)
    proxy.start()
    log.info("proxy: upstream %s", upstream_address)
    try:
        serve_broker(ProxyServicer(proxy), "proxy", host, port, ready_file=ready_file, stop_event=stop_event)
    finally:
        proxy.stop()
