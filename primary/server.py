"""`taproot node`: a cluster node process (gRPC server on loopback by default)."""

from __future__ import annotations

import logging
import signal
import threading
from concurrent import futures

import grpc

import conf
from primary.node import Node
from protocol import pb, pb_grpc
from protocol.stream import SERVER_GRPC_OPTIONS, serve_session, write_ready_file

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
          ready_file: str | None = None, stop_event: threading.Event | None = None) -> None:
    node_conf = config.node(node_name)
    node = Node(config, node_name)
    node.start()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=256, thread_name_prefix="grpc"),
                         options=SERVER_GRPC_OPTIONS)
    pb_grpc.add_BrokerServicer_to_server(BrokerServicer(node), server)
    bound = server.add_insecure_port(f"{node_conf.host}:{node_conf.port if port is None else port}")
    if bound == 0:
        raise SystemExit(f"node {node_name}: cannot bind {node_conf.host}:{node_conf.port}")
    server.start()
    log.info("node %s serving on %s:%d (data %s)", node_name, node_conf.host, bound, config.data_dir)
    write_ready_file(ready_file, port=bound, host=node_conf.host)
    stop = stop_event or threading.Event()
    if stop_event is None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    log.info("node %s stopping", node_name)
    server.stop(grace=2).wait()
    node.stop()
