"""Several frames in one gRPC message (`protocol.bundles`): the bytes are
protobuf's own, the frames come out as they went in and in order, a stream
bundles only what it has queued at once and only for a peer that reads
bundles, and a server never sends one to a peer that did not say so."""

from __future__ import annotations

import asyncio
import queue
import threading

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import ResultCode, bundles, columns, pb
from protocol.auth import metadata as auth_metadata
from protocol.auth import token_from_env
from protocol.stream import CLOSE, Link, drain, serialized, session_stream
from protocol.tls import ClientTls
from protocol.tls import channel as tls_channel
from tests.conftest import wait_until


def heartbeat(n: int) -> pb.Frame:
    return pb.Frame(heartbeat=pb.Heartbeat(sent_time_us=n))


def push(n: int, size: int) -> pb.Frame:
    return pb.Frame(push_columns=pb.PushColumns(queue_id=n, count=1, arrow_ipc=b"x" * size))


frames_strategy = st.lists(st.one_of(
    st.integers(0, 2**62).map(heartbeat),
    st.tuples(st.integers(0, 2**32 - 1), st.binary(max_size=300), st.binary(max_size=64)).map(
        lambda t: pb.Frame(put_columns=pb.PutColumns(queue_id=t[0], arrow_ipc=t[1], guids=t[2]))),
    st.just(pb.Frame())), max_size=20)


@pytest.mark.unit
@settings(deadline=None)
@given(frames_strategy)
def test_a_bundle_is_protobufs_own_bytes_and_gives_its_frames_back_in_order(frames):
    data = [f.SerializeToString() for f in frames]
    encoded = bundles.encode(data)
    assert encoded == pb.Frame(bundle=pb.FrameBundle(frames=frames)).SerializeToString()
    message = pb.Frame.FromString(encoded)
    assert message.WhichOneof("body") == "bundle"
    assert list(bundles.unbundled(message)) == frames


@pytest.mark.unit
def test_a_frame_alone_is_itself_and_a_bundle_in_a_bundle_is_passed_on_as_a_frame():
    one = heartbeat(7)
    assert list(bundles.unbundled(one)) == [one]
    inner = pb.Frame(bundle=pb.FrameBundle(frames=[heartbeat(1)]))
    outer = pb.Frame.FromString(bundles.encode([inner.SerializeToString(), heartbeat(2).SerializeToString()]))
    assert [f.WhichOneof("body") for f in bundles.unbundled(outer)] == ["bundle", "heartbeat"]


@pytest.mark.unit
@settings(deadline=None)
@given(st.lists(st.integers(0, 3 * bundles.BUNDLE_MAX_BYTES // 2), max_size=12))
def test_pack_keeps_order_and_bounds_each_bundle(sizes):
    data = [push(i, size).SerializeToString() for i, size in enumerate(sizes)]
    out: list[bytes] = []
    carried: list[list[bytes]] = []
    for message in bundles.pack(data):
        frames = [f.SerializeToString() for f in bundles.unbundled(pb.Frame.FromString(message))]
        if len(frames) > 1:
            assert sum(map(len, frames)) <= bundles.BUNDLE_MAX_BYTES
        else:
            assert message == frames[0]   # a frame alone goes as it is, not as a bundle of one
        carried.append(frames)
        out += frames
    assert out == data
    # Greedy: a message's next frame would not have fitted in it.
    for this, following in zip(carried, carried[1:]):
        assert sum(map(len, this)) + len(following[0]) > bundles.BUNDLE_MAX_BYTES


async def written(link: Link, frames: list[pb.Frame], more: list[pb.Frame] | None = None) -> list[pb.Frame]:
    """The messages `link` writes for `frames` queued before its writer
    starts, and for `more` queued once it has written those; then closed."""
    for f in frames:
        link.send(f)
    out = []
    writer = link.aio_frames()
    out.append(pb.Frame.FromString(await writer.__anext__()))
    while sum(len(bundles.unbundled(m)) for m in out) < len(frames):
        out.append(pb.Frame.FromString(await writer.__anext__()))
    for f in more or []:
        link.send(f)
    link.close()
    out += [pb.Frame.FromString(m) async for m in writer]
    return out


@pytest.mark.unit
def test_a_link_bundles_what_is_queued_at_once_only_for_a_peer_that_reads_bundles():
    queued = [heartbeat(i) for i in range(5)]
    plain = Link("old peer")
    assert asyncio.run(written(plain, queued)) == queued   # one frame a message
    link = Link("peer")
    link.bundles = True
    messages = asyncio.run(written(link, queued, more=[heartbeat(9)]))
    # What was queued together goes as one message; a frame queued after,
    # alone; the close ends the stream after both.
    assert [len(bundles.unbundled(m)) for m in messages] == [5, 1]
    assert list(bundles.unbundled(messages[0])) == queued and messages[1] == heartbeat(9)
    assert link.outbound_bytes == 0


@pytest.mark.unit
def test_a_link_sends_a_large_frame_alone_and_its_neighbours_around_it():
    link = Link("peer")
    link.bundles = True
    big = push(2, bundles.BUNDLE_MAX_BYTES)
    queued = [heartbeat(1), big, heartbeat(3), heartbeat(4)]
    messages = asyncio.run(written(link, queued))
    assert [m.WhichOneof("body") for m in messages] == ["heartbeat", "push_columns", "bundle"]
    assert [f for m in messages for f in bundles.unbundled(m)] == queued


@pytest.mark.unit
def test_drain_bundles_once_the_peer_says_so_and_ends_after_what_was_queued():
    out: queue.SimpleQueue[object] = queue.SimpleQueue()
    said = threading.Event()
    stream = drain(out, said.is_set)
    for i in range(3):
        out.put(heartbeat(i))
    # Before the peer's answer: a frame a message, as the frames were queued.
    assert next(stream) == heartbeat(0)
    said.set()
    out.put(heartbeat(3))
    out.put(CLOSE)
    rest = [pb.Frame.FromString(serialized(m)) for m in stream]   # ends at CLOSE, after the frames before it
    assert len(rest) == 1 and list(bundles.unbundled(rest[0])) == [heartbeat(1), heartbeat(2), heartbeat(3)]


def put_frame(queue_id: int, n: int) -> pb.Frame:
    messages = [pb.PutMessage(guid=n.to_bytes(8, "big") + b"bundles!", payload=b"p" * 100)]
    return pb.Frame(put_columns=pb.PutColumns(queue_id=queue_id, arrow_ipc=columns.encode_puts(messages),
                                              guids=b"".join(m.guid for m in messages)))


def session(address: str, bundled: bool) -> tuple[grpc.Channel, "queue.SimpleQueue[object]", list[pb.Frame],
                                                   threading.Thread, list[object]]:
    """A Session stream at the protocol level, saying it reads bundles or
    not; the messages it reads as they came (not unbundled)."""
    channel = tls_channel(address, ClientTls.from_env())
    grpc.channel_ready_future(channel).result(timeout=10)
    out: queue.SimpleQueue[object] = queue.SimpleQueue()
    metadata = auth_metadata(token_from_env()) + (bundles.BUNDLES_METADATA if bundled else ())
    call = session_stream(channel)(drain(out), metadata=metadata)
    received: list[pb.Frame] = []
    initial: list[object] = []

    def read() -> None:
        initial.append(call.initial_metadata())
        try:
            for message in call:
                received.append(message)
        except grpc.RpcError:
            pass
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return channel, out, received, reader, initial


@pytest.mark.integration
@pytest.mark.parametrize("bundled", [False, True], ids=["older-peer", "reads-bundles"])
def test_a_server_bundles_only_for_a_peer_that_reads_bundles(cluster, bundled):
    """200 PUT frames in one bundle to the proxy: all ACKed, each once. A
    peer that did not say it reads bundles gets a frame a message; one that
    did gets the ACKs queued together as bundles. The server says it reads
    bundles in its initial metadata either way."""
    channel, out, received, reader, initial = session(cluster.proxy_address, bundled)
    try:
        out.put(pb.Frame(open_queue=pb.OpenQueue(request_id=1, queue_id=1, uri="taproot://demo/bundles",
                                                 write=True)))
        wait_until(lambda: any(m.WhichOneof("body") == "open_queue_response" for m in received), 30,
                   what="the open's answer")
        assert received[0].open_queue_response.status.code == ResultCode.SUCCESS
        out.put(bundles.encode([put_frame(1, i).SerializeToString() for i in range(200)]))

        def acked() -> list[bytes]:
            return [f.ack_columns.guids for m in list(received) for f in bundles.unbundled(m)
                    if f.WhichOneof("body") == "ack_columns"]
        wait_until(lambda: len(acked()) >= 200, 60, what="200 ACKs")
        assert sorted(acked()) == sorted(put_frame(1, i).put_columns.guids for i in range(200))
        assert all(f.ack_columns.code == ResultCode.SUCCESS for m in received for f in bundles.unbundled(m)
                   if f.WhichOneof("body") == "ack_columns")
        assert bundles.offered(initial[0])
        sizes = [len(bundles.unbundled(m)) for m in received]
        if bundled:
            assert max(sizes) > 1, "ACKs queued together were not bundled"
        else:
            assert all(m.WhichOneof("body") != "bundle" for m in received)
    finally:
        out.put(CLOSE)
        channel.close()
        reader.join(5)
