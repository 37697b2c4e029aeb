"""`taproot node`: a cluster node process (gRPC server on loopback by default)."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import AsyncIterator

import grpc

import conf
from primary import metrics as node_metrics
from primary.admin import NodeAdmin
from primary.node import Node
from protocol import columns, pb, status_page
from protocol import taproot_pb2_grpc as pb_grpc
from protocol.admin import AdminServicer
from protocol.auth import Authenticator, Denied, presented
from protocol.codes import ResultCode
from protocol.metrics import HttpServer, registry_for
from protocol.procstat import stat_fields
from protocol.stream import serve_broker, serve_session

log = logging.getLogger(__name__)


class BrokerServicer(pb_grpc.BrokerServicer):
    def __init__(self, node: Node, auth: Authenticator | None = None):
        self.node = node
        self.auth = auth

    async def Session(self, request_iterator: AsyncIterator[pb.Frame],  # noqa: N802 (gRPC naming)
                      context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        async for frame in serve_session(request_iterator, context, self.node.open_link, self.node.on_frame,
                                         self.node.close_link, self.node.config.ha.link_outbound_max_bytes,
                                         inline=Node.handled_inline, auth=self.auth):
            yield frame

    async def NotifyDelivery(self, request: pb.DeliveryNotice,  # noqa: N802
                             context: grpc.aio.ServicerContext) -> pb.NoticeAck:
        if self.auth is not None:   # only the cluster's own pipeline sends these
            entry = self.auth.entry(presented(context.invocation_metadata()))
            if not isinstance(entry, Denied) and not entry.cluster:
                entry = self.auth.refused(Denied(ResultCode.NOT_AUTHORIZED,
                                                 f"token {entry.name!r} is not the cluster's"))
            if isinstance(entry, Denied):
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, "NotifyDelivery takes the cluster token only")
        self.node.notify_delivery(request.partition)
        return pb.NoticeAck()


def serve(config: conf.ClusterConfig, node_name: str, *, port: int | None = None,
          ready_file: str | None = None, stop_event: threading.Event | None = None,
          cluster_file: str | None = None, http_port: int | None = None) -> None:
    """`http_port`: as `[[nodes]] http_port` (-1 none, 0 any free port);
    None: the config's."""
    columns.warm_up()   # pyarrow's first-call import, before any frame waits on it
    node_conf = config.node(node_name)
    tls = conf.server_tls(config)   # a file that cannot be used ends the start here, saying which
    auth = conf.authenticator(config)
    conf.link_tokens(config)        # a federation link's token file that cannot be read, too
    node = Node(config, node_name, domains_dir=conf.domains_dir(cluster_file))
    log.info("node %s: data in %s", node_name, config.data_dir)
    grpc_port = node_conf.port if port is None else port
    metrics_port = conf.http_port_of(node_conf.http_port if http_port is None else http_port, grpc_port)
    admin = NodeAdmin(node)
    http = None if metrics_port is None else HttpServer(
        f"node {node_name}", node_conf.host, metrics_port, registry_for(lambda: node_metrics.collect(node), auth),
        status_page.routes(admin.page_data)).start()

    pid_file = pid_path(config, node_name)

    def started(bound: int) -> None:
        node.start(f"{node_conf.host}:{bound}")
        pid_file.parent.mkdir(parents=True, exist_ok=True)
        pid_file.write_text(json.dumps({"pid": os.getpid(), "address": node.address}))
        # Ready once every partition has a primary somewhere (this node or
        # another), so a client connecting now is served.
        if not node.wait_ready(60):
            log.warning("node %s: some partitions have no primary yet; serving anyway", node_name)

    def graceful() -> None:
        node.drain()
        node.stop(graceful=False)  # drained: release the leases, stop the partitions

    try:
        serve_broker(BrokerServicer(node, auth), f"node {node_name}", node_conf.host, grpc_port,
                     ready_file=ready_file, stop_event=stop_event, on_started=started, before_stop=graceful,
                     ready_info={"http_port": http.port if http else None},
                     admin=AdminServicer(f"node {node_name}", admin.handlers(), auth), tls=tls)
    finally:
        node.stop(graceful=False)
        pid_file.unlink(missing_ok=True)
        if http is not None:
            http.stop()


def pid_path(config: conf.ClusterConfig, node_name: str) -> Path:
    """Where a running node says who it is: this machine's state directory."""
    return Path(config.local_dir) / "nodes" / f"{node_name}.json"


def _alive(pid: int) -> bool:
    """Running (an exited process its parent has not reaped yet is a zombie: gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    fields = stat_fields(pid)
    return fields is None or fields[0] != "Z"  # no /proc: kill() said it exists


def stop_node(config: conf.ClusterConfig, node_name: str) -> int:
    """`taproot node stop`: SIGTERM the node running on this machine, which
    drains (StopRequest) and hands its partitions over, and wait for it."""
    path = pid_path(config, node_name)
    try:
        pid = json.loads(path.read_text())["pid"]
    except (FileNotFoundError, ValueError, KeyError):
        print(f"node {node_name}: not running here (no {path})")
        return 1
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        path.unlink(missing_ok=True)
        print(f"node {node_name}: process {pid} is gone")
        return 1
    started = time.monotonic()
    deadline = started + config.ha.stop_timeout_ms / 1000 + 30
    while time.monotonic() < deadline:
        if not _alive(pid):
            print(f"node {node_name}: stopped after {time.monotonic() - started:.1f} s (drained, leases released)")
            return 0
        time.sleep(0.1)
    print(f"node {node_name}: still running after {deadline - started:.0f} s")
    return 1
