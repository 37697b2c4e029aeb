"""`taproot proxy`: an edge node relaying client sessions to the cluster.

The proxy keeps one upstream session to a cluster node (the first reachable of
its host list) and a retransmission buffer for every PUT until its ACK. If the
node goes, the proxy connects to the next one, reopens every queue and resends
what is unacknowledged; clients stay connected and see a pause, not an error
(`replicas/upstream.py`, `replicas/relay.py`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, AsyncIterator, Iterator, Sequence

import grpc
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from protocol import columns, pb, status_page
from protocol import taproot_pb2_grpc as pb_grpc
from protocol.admin import AdminServicer, stop_after_answer
from protocol.auth import Authenticator
from protocol.metrics import HttpServer, registry_for
from protocol.retransmit import RetransmissionLimits
from protocol.stream import serve_broker, serve_session
from protocol.tls import ClientTls, ServerTls
from replicas.upstream import STOP_FLUSH_S, Upstream

log = logging.getLogger(__name__)


class Proxy(Upstream):
    def __init__(self, upstream_addresses: str | Sequence[str], limits: RetransmissionLimits | None = None,
                 reconnect_interval_s: float = 0.2, tls: ClientTls | None = None, token: str | None = None):
        addresses = [upstream_addresses] if isinstance(upstream_addresses, str) else list(upstream_addresses)
        super().__init__(lambda: addresses, name="proxy", limits=limits, reconnect_interval_s=reconnect_interval_s,
                         tls=tls, token=token)
        self.upstream_addresses = addresses


def collect(proxy: Proxy) -> Iterator[Metric]:
    """A proxy's metrics (`protocol.metrics`)."""
    yield from proxy.frames.families()
    messages, nbytes = proxy.buffered()
    yield GaugeMetricFamily("taproot_retransmission_buffer_messages", "PUTs held for resending until their ACK",
                            value=messages)
    yield GaugeMetricFamily("taproot_retransmission_buffer_bytes", "their payload bytes", value=nbytes)
    yield GaugeMetricFamily("taproot_sessions", "sessions connected from below (clients, relays)",
                            value=proxy.session_count)
    yield GaugeMetricFamily("taproot_upstream_connected", "1 while connected to a node", value=int(
        proxy.connected.is_set()))
    yield CounterMetricFamily("taproot_upstream_failovers", "connections to a node after the first (a node "
                              "lost, the next one taken)", value=max(0, proxy.connects - 1))


class ProxyServicer(pb_grpc.BrokerServicer):
    def __init__(self, proxy: Proxy, max_outbound_bytes: int | None = None, auth: Authenticator | None = None):
        self.proxy = proxy
        self.max_outbound_bytes = max_outbound_bytes
        self.auth = auth

    async def Session(self, request_iterator: AsyncIterator[pb.Frame],  # noqa: N802 (gRPC naming)
                      context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        # Inline: a proxy's handlers take its lock, rewrite headers and queue
        # frames; they never wait on a peer.
        async for frame in serve_session(request_iterator, context, self.proxy.open_link, self.proxy.on_frame,
                                         self.proxy.close_link, self.max_outbound_bytes, inline=True,
                                         auth=self.auth):
            yield frame


def serve(host: str, port: int, upstream_addresses: str | Sequence[str], *, ready_file: str | None = None,
          stop_event: threading.Event | None = None, limits: RetransmissionLimits | None = None,
          stop_timeout_ms: int = 10_000, max_outbound_bytes: int | None = None,
          http_port: int | None = None, tls: ServerTls | None = None,
          upstream_tls: ClientTls | None = None, auth: Authenticator | None = None,
          upstream_token: str | None = None) -> None:
    """`http_port`: metrics served there (0: any free port), None: none.
    `tls`: clients connect with TLS; `upstream_tls`: how the proxy connects to
    its nodes (None: plaintext). `auth`: clients' tokens are checked here
    (`protocol.auth`); `upstream_token`: the cluster token the proxy presents
    to its nodes."""
    columns.warm_up()   # pyarrow's first-call import, before any frame waits on it
    proxy = Proxy(upstream_addresses, limits, tls=upstream_tls, token=upstream_token)
    started = time.time()

    def status(_: pb.AdminRequest | None = None) -> dict[str, Any]:
        messages, nbytes = proxy.buffered()
        return {"role": "proxy", "name": "", "pid": os.getpid(), "started": started,
                "uptime_s": round(time.time() - started, 1), "upstream": proxy.address or "",
                "upstream_hosts": proxy.upstream_addresses, "connected": proxy.connected.is_set(),
                "sessions": proxy.session_count, "failovers": max(0, proxy.connects - 1),
                "retransmission_buffer": {"messages": messages, "bytes": nbytes}}

    def stop(_: pb.AdminRequest) -> dict[str, Any]:
        stop_after_answer()
        return {"role": "proxy", "stopping": True}

    http = None if http_port is None else HttpServer(
        "proxy", host, http_port, registry_for(lambda: collect(proxy), auth),
        status_page.routes(lambda: {"time": time.time(), "status": status()})).start()
    proxy.start(connect_timeout_s=30.0)
    log.info("proxy: upstream hosts %s", ", ".join(proxy.upstream_addresses))

    def drain() -> None:  # SIGTERM: StopRequest to every client, drain, then go (clients move on)
        proxy.drain(stop_timeout_ms / 1000)

    try:
        serve_broker(ProxyServicer(proxy, max_outbound_bytes, auth), "proxy", host, port, ready_file=ready_file,
                     stop_event=stop_event, before_stop=drain, ready_info={"http_port": http.port if http else None},
                     admin=AdminServicer("proxy", {"status": status, "stop": stop}, auth), tls=tls)
    finally:
        proxy.stop(flush_s=STOP_FLUSH_S)   # the drain's last CONFIRMs reach the node before the stream ends
        if http is not None:
            http.stop()
