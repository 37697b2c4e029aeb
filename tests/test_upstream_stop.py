"""A relay's graceful stop hands its last frames to the node: the upstream
stream is half-closed after them and the node ends it once it has handled
every one (`replicas.upstream.Upstream.stop`).

The fault suite's graceful proxy stop once delivered 77 messages twice (CI,
2026-12-06): the drain had seen every CONFIRM from the consumer, but the
proxy then cancelled its upstream stream, and gRPC dropped the CONFIRMs the
node had not read yet; the node delivered those messages again, through the
other proxy. Here the node is a stand-in that reads slowly, so the frames
are still unread when the proxy stops."""

from __future__ import annotations

import queue
import threading
import time
from concurrent import futures

import grpc
import pytest

from protocol import pb
from protocol.stream import CLOSE, SERVER_GRPC_OPTIONS, SERVICE, Link, drain
from proxies.server import Proxy
from replicas.upstream import STOP_FLUSH_S

pytestmark = pytest.mark.unit

MESSAGES = 40
READ_DELAY_S = 0.01   # per CONFIRM frame: 40 frames take the node 0.4 s to read


class SlowNode:
    """A node's Session stream as far as this test needs it: a read queue
    open is answered and MESSAGES are pushed on it; CONFIRM frames are read
    one per READ_DELAY_S and recorded."""

    def __init__(self) -> None:
        self.confirmed: list[bytes] = []
        self.ended_by_peer = threading.Event()   # the request side ended, not cancelled

    def session(self, request_iterator, context):
        out: "queue.SimpleQueue[object]" = queue.SimpleQueue()

        def read() -> None:
            try:
                for frame in request_iterator:
                    kind = frame.WhichOneof("body")
                    if kind == "open_queue":
                        req = frame.open_queue
                        out.put(pb.Frame(open_queue_response=pb.OpenQueueResponse(
                            request_id=req.request_id, queue_id=req.queue_id, status=pb.Status(code=pb.SUCCESS))))
                        out.put(pb.Frame(push=pb.PushBatch(messages=[
                            pb.PushMessage(queue_id=req.queue_id, guid=b"%016d" % i, payload=b"x", sequence=i + 1)
                            for i in range(MESSAGES)])))
                    elif kind == "confirm":
                        time.sleep(READ_DELAY_S)
                        self.confirmed.extend(m.guid for m in frame.confirm.messages)
                self.ended_by_peer.set()
            except grpc.RpcError:
                pass   # cancelled by the peer
            finally:
                out.put(CLOSE)

        threading.Thread(target=read, daemon=True).start()
        yield from drain(out)


@pytest.fixture
def node():
    stand_in = SlowNode()
    server = grpc.server(futures.ThreadPoolExecutor(4), options=SERVER_GRPC_OPTIONS)
    handler = grpc.stream_stream_rpc_method_handler(stand_in.session, request_deserializer=pb.Frame.FromString,
                                                     response_serializer=pb.Frame.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Session": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield stand_in, f"127.0.0.1:{port}"
    finally:
        server.stop(0)


def pushed_through(proxy: Proxy) -> tuple[Link, list[pb.PushMessage]]:
    """A client link below `proxy` with a read queue open and every PUSH in hand."""
    link = Link("client")
    proxy.open_link(link)
    proxy.on_frame(link, pb.Frame(open_queue=pb.OpenQueue(request_id=1, queue_id=1, uri="taproot://demo/q",
                                                          read=True)))
    assert link.next_frame(10).open_queue_response.status.code == pb.SUCCESS
    pushes: list[pb.PushMessage] = []
    while len(pushes) < MESSAGES:
        pushes.extend(link.next_frame(10).push.messages)
    return link, pushes


def confirm_each(proxy: Proxy, link: Link, pushes: list[pb.PushMessage]) -> None:
    for message in pushes:
        proxy.on_frame(link, pb.Frame(confirm=pb.ConfirmBatch(messages=[pb.ConfirmMessage(
            queue_id=message.queue_id, guid=message.guid, sequence=message.sequence)])))


def test_a_graceful_stop_hands_the_node_every_confirm_before_the_stream_ends(node):
    stand_in, address = node
    proxy = Proxy([address], reconnect_interval_s=0.05)
    proxy.start(connect_timeout_s=10)
    link, pushes = pushed_through(proxy)
    confirm_each(proxy, link, pushes)
    assert proxy.relay.unconfirmed_count == 0   # what a drain waits for: the proxy has every CONFIRM
    assert len(stand_in.confirmed) < MESSAGES   # and the node is still reading them

    started = time.monotonic()
    proxy.stop(flush_s=STOP_FLUSH_S)
    assert sorted(stand_in.confirmed) == sorted(m.guid for m in pushes)
    assert stand_in.ended_by_peer.is_set()
    assert time.monotonic() - started < STOP_FLUSH_S   # ended by the node, not by the bound


def test_a_stop_without_flush_cancels_at_once_and_the_unread_confirms_are_lost(node):
    """What a crash or a forced stop does, and what the graceful stop used to
    do: the node sees the stream cancelled and never reads the rest."""
    stand_in, address = node
    proxy = Proxy([address], reconnect_interval_s=0.05)
    proxy.start(connect_timeout_s=10)
    link, pushes = pushed_through(proxy)
    confirm_each(proxy, link, pushes)
    proxy.stop()
    time.sleep(READ_DELAY_S * MESSAGES + 0.2)
    assert len(stand_in.confirmed) < MESSAGES
    assert not stand_in.ended_by_peer.is_set()
