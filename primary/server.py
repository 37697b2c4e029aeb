"""`taproot node`: a cluster node process (gRPC server on loopback by default)."""

from __future__ import annotations

import logging
import threading

import conf
from primary.node import Node
from protocol import pb, pb_grpc
from protocol.stream import serve_broker, serve_session

log = logging.getLogger(__name__)


class BrokerServicer(pb_grpc.BrokerServicer):
    def __init__(self, node: Node):
        self.node = node

    def Session(self, request_iterator, context):  # noqa: N802 (gRPC naming)
        return serve_session(request_iterator, context, self.node.open_link, self.node.on_frame,
                             self.node.close_link)

    def NotifyDelivery(self, request, context):  # noqa: N802
        self.node.notify_delivery(request.partition)
        return pb.NoticeAck()


def serve(config: conf.ClusterConfig, node_name: str, *, port: int | None = None,
          ready_file: str | None = None, stop_event: threading.Event | None = None,
          cluster_file: str | None = None) -> None:
    node_conf = config.node(node_name)
    node = Node(config, node_name, domains_dir=conf.domains_dir(cluster_file))
    log.info("node %s: data in %s", node_name, config.data_dir)

    def started(bound: int) -> None:
        node.start(f"{node_conf.host}:{bound}")
        # Ready once every partition has a primary somewhere (this node or
        # another), so a client connecting now is served.
        if not node.wait_ready(60):
            log.warning("node %s: some partitions have no primary yet; serving anyway", node_name)

    def graceful() -> None:
        node.drain()
        node.stop(graceful=False)  # drained: release the leases, stop the partitions

    try:
        serve_broker(BrokerServicer(node), f"node {node_name}", node_conf.host,
                     node_conf.port if port is None else port, ready_file=ready_file, stop_event=stop_event,
                     on_started=started, before_stop=graceful)
    finally:
        node.stop(graceful=False)
