"""`taproot proxy`: an edge node relaying client sessions to the cluster.

The proxy keeps one upstream session to a cluster node (the first reachable of
its host list) and a retransmission buffer for every PUT until its ACK. If the
node goes, the proxy connects to the next one, reopens every queue and resends
what is unacknowledged; clients stay connected and see a pause, not an error
(`replicas/upstream.py`, `replicas/relay.py`).
"""

from __future__ import annotations

import logging
import threading
from typing import AsyncIterator, Sequence

import grpc

from protocol import columns, pb
from protocol import taproot_pb2_grpc as pb_grpc
from protocol.retransmit import RetransmissionLimits
from protocol.stream import serve_broker, serve_session
from replicas.upstream import Upstream

log = logging.getLogger(__name__)


class Proxy(Upstream):
    def __init__(self, upstream_addresses: str | Sequence[str], limits: RetransmissionLimits | None = None,
                 reconnect_interval_s: float = 0.2):
        addresses = [upstream_addresses] if isinstance(upstream_addresses, str) else list(upstream_addresses)
        super().__init__(lambda: addresses, name="proxy", limits=limits, reconnect_interval_s=reconnect_interval_s)
        self.upstream_addresses = addresses


class ProxyServicer(pb_grpc.BrokerServicer):
    def __init__(self, proxy: Proxy, max_outbound_bytes: int | None = None):
        self.proxy = proxy
        self.max_outbound_bytes = max_outbound_bytes

    async def Session(self, request_iterator: AsyncIterator[pb.Frame],  # noqa: N802 (gRPC naming)
                      context: grpc.aio.ServicerContext) -> AsyncIterator[pb.Frame]:
        # Inline: a proxy's handlers take its lock, rewrite headers and queue
        # frames; they never wait on a peer.
        async for frame in serve_session(request_iterator, context, self.proxy.open_link, self.proxy.on_frame,
                                         self.proxy.close_link, self.max_outbound_bytes, inline=True):
            yield frame


def serve(host: str, port: int, upstream_addresses: str | Sequence[str], *, ready_file: str | None = None,
          stop_event: threading.Event | None = None, limits: RetransmissionLimits | None = None,
          stop_timeout_ms: int = 10_000, max_outbound_bytes: int | None = None) -> None:
    columns.warm_up()   # pyarrow's first-call import, before any frame waits on it
    proxy = Proxy(upstream_addresses, limits)
    proxy.start(connect_timeout_s=30.0)
    log.info("proxy: upstream hosts %s", ", ".join(proxy.upstream_addresses))

    def drain() -> None:  # SIGTERM: StopRequest to every client, drain, then go (clients move on)
        proxy.drain(stop_timeout_ms / 1000)

    try:
        serve_broker(ProxyServicer(proxy, max_outbound_bytes), "proxy", host, port, ready_file=ready_file,
                     stop_event=stop_event, before_stop=drain)
    finally:
        proxy.stop()
