"""A server-side link (`protocol.stream.Link`): what it queues for its peer is
bounded, and a link whose peer does not read is dropped, not grown."""

from __future__ import annotations

import asyncio
import queue

import pytest

from protocol import pb
from protocol.stream import Link, serialized

pytestmark = pytest.mark.unit


def frame(n: int) -> pb.Frame:
    return pb.Frame(push_columns=pb.PushColumns(queue_id=1, count=1, arrow_ipc=b"x" * n))


def test_queued_bytes_are_counted_until_the_writer_takes_them():
    link = Link("peer", max_outbound_bytes=10_000)
    for _ in range(3):
        link.send(frame(1_000))
    assert 3_000 < link.outbound_bytes < 3_100
    link.next_frame(1)
    assert 2_000 < link.outbound_bytes < 2_100
    link.next_frame(1)
    link.next_frame(1)
    assert link.outbound_bytes == 0 and link.dropped is None


def test_a_link_past_its_bound_is_dropped_at_once_and_takes_nothing_more():
    aborted: list[bool] = []
    link = Link("slow consumer", max_outbound_bytes=10_000)
    link._abort = lambda: aborted.append(True)
    for _ in range(9):
        link.send(frame(1_000))
    assert link.dropped is None
    link.send(frame(2_000))
    assert link.closed and aborted == [True]
    assert link.dropped is not None and "slow peer" in link.dropped and "max 10,000" in link.dropped
    link.send(frame(10))          # closed: ignored
    with pytest.raises(queue.Empty):  # what was queued is discarded: only the close is left
        link.next_frame(0.01)
    assert link.outbound_bytes == 0


def test_the_async_writer_ends_as_soon_as_the_link_is_dropped():
    link = Link("peer", max_outbound_bytes=5_000)

    async def write() -> int:
        sent = 0
        async for _ in link.aio_frames():
            sent += 1
            if sent == 1:
                for _ in range(10):   # the peer stops reading; more comes, past the bound
                    link.send(frame(1_000))
        return sent

    link.send(frame(100))
    assert asyncio.run(asyncio.wait_for(write(), 5)) == 1  # nothing queued after the drop is written


def test_the_writer_gets_the_frame_as_it_was_sent_serialized_and_the_bound_counts_those_bytes():
    link = Link("peer")
    sent = frame(1_000)
    link.send(sent)
    wire = sent.SerializeToString()
    assert link.outbound_bytes == len(wire)
    sent.push_columns.queue_id = 7    # a change after send does not reach the peer

    async def first() -> bytes:
        async for data in link.aio_frames():
            return data
        raise AssertionError("nothing written")

    assert asyncio.run(asyncio.wait_for(first(), 5)) == wire
    assert link.outbound_bytes == 0
    assert serialized(wire) is wire and serialized(frame(10)) == frame(10).SerializeToString()


def test_next_frame_waits_then_says_empty():
    link = Link("peer")
    with pytest.raises(queue.Empty):
        link.next_frame(0.01)
    link.close()
    with pytest.raises(queue.Empty):
        link.next_frame(0.01)


class AbortedError(Exception):
    """What `_Context.abort` raises, as gRPC's does, to end the stream."""


class _Context:
    """What serve_session asks of a gRPC servicer context."""

    def __init__(self, metadata: tuple = ()) -> None:
        self.callbacks: list = []
        self.metadata = metadata
        self.initial_metadata: tuple | None = None

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    def invocation_metadata(self) -> tuple:
        return self.metadata

    async def send_initial_metadata(self, metadata: tuple) -> None:
        self.initial_metadata = metadata

    async def abort(self, code, details: str) -> None:
        raise AbortedError(code, details)

    def add_done_callback(self, callback) -> None:
        self.callbacks.append(callback)


@pytest.mark.parametrize("bundled", [False, True], ids=["a-frame-a-message", "one-bundle"])
def test_frames_a_predicate_picks_run_on_the_loop_and_the_rest_on_the_pool_in_order(bundled: bool):
    """serve_session(inline=predicate): heartbeats on the event loop's
    thread, the other frames on the frame pool's; each frame is handled
    after every frame before it, even when a pool frame is slow; and the
    same when all of them come in one message (a bundle)."""
    import threading
    import time

    from protocol.stream import serve_session

    sent = [pb.Frame(put_columns=pb.PutColumns(queue_id=1)), pb.Frame(heartbeat=pb.Heartbeat(sent_time_us=2)),
            pb.Frame(put_columns=pb.PutColumns(queue_id=3)), pb.Frame(heartbeat=pb.Heartbeat(sent_time_us=4))]
    frames = [pb.Frame(bundle=pb.FrameBundle(frames=sent))] if bundled else sent
    seen: list[tuple[int, bool]] = []
    closed = threading.Event()

    def on_frame(link, frame) -> None:
        kind = frame.WhichOneof("body")
        if kind == "put_columns":
            time.sleep(0.05)   # a slow pool frame: the heartbeat after it waits
            seen.append((frame.put_columns.queue_id, threading.current_thread() is loop_thread))
        else:
            seen.append((frame.heartbeat.sent_time_us, threading.current_thread() is loop_thread))

    async def requests():
        for f in frames:
            yield f

    async def run() -> list:
        nonlocal loop_thread
        loop_thread = threading.current_thread()
        session = serve_session(requests(), _Context(), lambda link: None, on_frame, lambda link: closed.set(),
                                inline=lambda f: f.WhichOneof("body") == "heartbeat")
        return [f async for f in session]

    loop_thread = None
    assert asyncio.run(asyncio.wait_for(run(), 10)) == []   # no handler sent anything back
    assert seen == [(1, False), (2, True), (3, False), (4, True)]
    assert closed.wait(5)


def test_the_frames_of_a_bundle_after_its_link_was_dropped_are_not_handled():
    """A bundle is read as one message: once a frame of it gets its link
    dropped (a token revoked, a slow peer), the frames after it are not
    handled, as if they had never been read."""
    import threading

    from protocol.stream import serve_session

    sent = [pb.Frame(heartbeat=pb.Heartbeat(sent_time_us=i)) for i in range(4)]
    seen: list[int] = []
    closed = threading.Event()

    def on_frame(link, frame) -> None:
        seen.append(frame.heartbeat.sent_time_us)
        if frame.heartbeat.sent_time_us == 1:
            link.drop("dropped by the second frame")

    async def requests():
        yield pb.Frame(bundle=pb.FrameBundle(frames=sent))

    async def run() -> None:
        session = serve_session(requests(), _Context(), lambda link: None, on_frame, lambda link: closed.set())
        with pytest.raises(AbortedError):
            async for _ in session:
                pass

    asyncio.run(asyncio.wait_for(run(), 10))
    assert seen == [0, 1]
    assert closed.wait(5)
