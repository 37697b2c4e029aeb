"""The SDK's sans-I/O core (`taproot.core`) and the retransmission buffer it
shares with every relay hop (`protocol.retransmit`): no sockets, no threads,
the clock is a number."""

import pytest

from protocol import ResultCode, columns, pb, status
from protocol.retransmit import RetransmissionBuffer, RetransmissionLimits, put_frames
from taproot import events
from taproot.batching import BatchPolicy
from taproot.core import NO_EFFECTS, Ack, ConnectionState, Put, QueueRecord, SessionCore
from taproot.errors import AckError, ConnectionError

pytestmark = pytest.mark.unit


def g(i: int) -> bytes:
    return i.to_bytes(16, "big")


def put(i: int, queue_id: int = 1, size: int = 10) -> pb.PutMessage:
    return pb.PutMessage(queue_id=queue_id, guid=g(i), payload=b"x" * size)


def ack(*ids: int, code: int = ResultCode.SUCCESS) -> pb.Frame:
    return pb.Frame(ack=pb.AckBatch(messages=[pb.AckMessage(queue_id=1, guid=g(i), code=code) for i in ids]))


def core_with_queue(**kwargs) -> SessionCore:
    core = SessionCore(batch=BatchPolicy(linger_ms=5, max_messages=3, columns_min=1), **kwargs)
    core.connected("h1", 0)
    core.add_queue(QueueRecord(1, "taproot://d/q", read=False, write=True,
                               open_request=pb.OpenQueue(queue_id=1, uri="taproot://d/q", write=True)))
    core.opened(1, pb.OpenQueueResponse(queue_id=1, status=status(ResultCode.SUCCESS)))
    core.take()
    return core


def reopened(core: SessionCore, frames, window_ms: int = 0) -> None:
    """Answer the reopen among `frames` with SUCCESS."""
    reopen, = [f.open_queue for f in frames if f.WhichOneof("body") == "open_queue"]
    core.on_frame(pb.Frame(open_queue_response=pb.OpenQueueResponse(
        request_id=reopen.request_id, queue_id=reopen.queue_id, status=status(ResultCode.SUCCESS),
        dedup_history_window_ms=window_ms)))


def sent_guids(frames) -> list[bytes]:
    """The GUIDs of the PUTs in `frames`: single PUTs go as PutColumns frames
    (a test's stand-in bytes for a post_columns frame are skipped)."""
    guids = []
    for f in frames:
        if f.WhichOneof("body") == "put":
            guids += [m.guid for m in f.put.messages]
        elif f.WhichOneof("body") == "put_columns":
            table = columns.decode(f.put_columns.arrow_ipc)
            guids += [] if isinstance(table, str) else table["guid"].to_pylist()
    return guids


def ack_frame(*ids: int, code: int = ResultCode.SUCCESS) -> pb.Frame:
    """The node's answer to a PutColumns frame of these PUTs."""
    return pb.Frame(ack_columns=pb.AckColumns(queue_id=1, guids=b"".join(g(i) for i in ids), code=code))


# -- the buffer ----------------------------------------------------------------
def test_the_buffer_keeps_put_order_counts_and_bounds():
    buffer: RetransmissionBuffer[bytes, str] = RetransmissionBuffer(RetransmissionLimits(3, 100, 1000))
    buffer.hold(g(1), "a", 40, 1, now_ms=0)
    buffer.hold(g(2), "b", 40, 1, now_ms=1)
    assert buffer.refusal(30) == (ResultCode.LIMIT_BYTES, "retransmission buffer holds 80 bytes (max 100)")
    buffer.hold(g(3), "c", 10, 1, now_ms=2)
    assert buffer.refusal(1)[0] == ResultCode.LIMIT_MESSAGES and buffer.full
    buffer.hold(g(1), "a again", 40, 1, now_ms=3)   # a resent PUT: one copy, at the end
    assert [k for k, _ in buffer.items()] == [g(2), g(3), g(1)]
    assert (buffer.messages, buffer.nbytes) == (3, 90)
    assert buffer.release(g(3)).item == "c" and buffer.release(g(3)) is None
    assert (buffer.messages, buffer.nbytes) == (2, 80)


def test_the_buffer_expires_by_each_entrys_own_bound():
    buffer: RetransmissionBuffer[bytes, str] = RetransmissionBuffer(RetransmissionLimits(timeout_ms=1000))
    buffer.hold(g(1), "long", 1, 1, now_ms=0)
    buffer.hold(g(2), "short", 1, 1, now_ms=10, timeout_ms=100)
    buffer.hold(g(3), "capped", 1, 1, now_ms=20, timeout_ms=10**9)  # never beyond the limit
    assert buffer.expire(109) == []
    assert [h.item for _, h in buffer.expire(110)] == ["short"]
    assert [h.item for _, h in buffer.expire(1000)] == ["long"]
    assert [h.item for _, h in buffer.expire(1020)] == ["capped"]
    assert len(buffer) == 0 and buffer._timeouts == {}


def test_deferred_entries_go_by_queue_in_put_order_and_pack_into_frames():
    buffer: RetransmissionBuffer[bytes, object] = RetransmissionBuffer()
    columns = pb.PutColumns(queue_id=1, arrow_ipc=b"ipc")
    items = {g(1): put(1), g(2): put(2, queue_id=2), g(3): columns, g(4): put(4), g(5): put(5)}
    for key, item in items.items():
        buffer.hold(key, item, 1, 1, now_ms=0)
    buffer.defer_all(lambda _, held: held.item.queue_id)
    buffer.release(g(4))                                   # answered meanwhile: skipped
    buffer.defer(1, g(6))                                  # held later, not sent either
    buffer.hold(g(6), put(6), 1, 1, now_ms=1)
    taken = [h.item for h in buffer.take_deferred(1)]
    assert taken == [put(1), columns, put(5), put(6)] and buffer.take_deferred(1) == []
    frames = put_frames(taken, max_messages=1)
    assert [f.WhichOneof("body") for f in frames] == ["put", "put_columns", "put", "put"]
    buffer.forget_deferred(2)
    assert buffer.take_deferred(2) == [] and len(buffer) == 5


def test_an_entry_of_several_queues_goes_once_all_are_open_and_holds_back_their_later_entries():
    buffer: RetransmissionBuffer[str, str] = RetransmissionBuffer()
    for key in ("a1", "m12", "b1", "c2", "m23", "d3"):
        buffer.hold(key, key, 1, 1, now_ms=0)
    spans = {"m12": [1, 2], "m23": [2, 3]}
    buffer.defer_all(lambda key, _: spans.get(key, int(key[-1])))
    opened: set[int] = set()

    def open_(q: int) -> list[str]:
        opened.add(q)
        return [h.item for h in buffer.take_deferred(q, opened.__contains__)]

    assert open_(1) == ["a1"]                    # m12 waits for queue 2, b1 behind it
    assert buffer.blocked(1) and not buffer.blocked(4)
    assert open_(3) == []                        # d3 behind m23, which waits for queue 2
    taken = open_(2)                             # m12, then c2, m23 and what they held back
    assert sorted(taken) == ["b1", "c2", "d3", "m12", "m23"]
    for before, after in (("m12", "b1"), ("m12", "c2"), ("c2", "m23"), ("m23", "d3")):
        assert taken.index(before) < taken.index(after)   # each queue's PUT order
    assert not any(buffer.blocked(q) for q in (1, 2, 3))

    # A queue forgotten: its entries of several queues no longer hold the others back.
    for key in ("m12", "b1"):
        buffer.hold(key, key, 1, 1, now_ms=1)
    buffer.defer_many([1, 2], "m12")
    buffer.defer(1, "b1")
    opened = {1}
    assert buffer.blocked(1) and open_(1) == []
    buffer.forget_deferred(2)
    assert open_(1) == ["b1"] and "m12" in buffer   # held (its owner answers it), never sent


# -- the session core ------------------------------------------------------------
def test_puts_batch_until_full_or_their_linger_time_and_each_frame_ack_answers_each_put_once():
    core = core_with_queue()
    for i in (1, 2):
        assert core.post(1, put(i), f"t{i}", now_ms=0) is None
    assert core.take().frames == [] and core.pending == 2 and len(core.buffer) == 0   # lingering
    core.post(1, put(3), "t3", now_ms=1)
    assert sent_guids(core.take().frames) == [g(1), g(2), g(3)]  # full batch: one frame
    assert len(core.buffer) == 1 and core.buffer.messages == 3   # held as one entry
    core.post(1, put(4), "t4", now_ms=2)
    assert core.tick(3) == 7 and core.take().frames == []
    core.tick(7)
    assert sent_guids(core.take().frames) == [g(4)]
    refused = pb.Frame(ack_columns=pb.AckColumns(queue_id=1, guids=g(1) + g(2) + g(3), refused_rows=[2],
                                                 refused_codes=[ResultCode.LIMIT_MESSAGES], refused_messages=["q"]))
    core.on_frame(refused)
    core.on_frame(refused)                             # a resent frame's second ACK
    core.on_frame(ack(4, code=ResultCode.STORAGE_FAILURE))   # single ACKs answer a one-PUT frame
    answered = core.take().answered
    assert answered[:2] == [("t1", Ack(g(1), "taproot://d/q")), ("t2", Ack(g(2), "taproot://d/q"))]
    (t3, limit), (t4, failure) = answered[2:]
    assert (t3, limit.code, limit.guid, limit.message) == ("t3", ResultCode.LIMIT_MESSAGES, g(3), "q")
    assert t4 == "t4" and isinstance(failure, AckError) and failure.code == ResultCode.STORAGE_FAILURE
    assert len(core.buffer) == 0 and core.pending == 0


def test_single_puts_travel_as_one_columnar_frame_and_its_ack_answers_each_once():
    core = core_with_queue()
    core.post(1, pb.PutMessage(queue_id=1, guid=g(1), payload=b"a", put_time_us=7,
                               properties=[pb.Property(name="n", int32_value=5)]), "t1", now_ms=0)
    core.post(1, put(2), "t2", now_ms=0)
    core.post(2, put(3, queue_id=2), "other queue", now_ms=0)   # not open: waits, in no frame
    core.flush()
    frame, = core.take().frames
    table = columns.decode(frame.put_columns.arrow_ipc)
    assert not isinstance(table, str) and columns.check(table, 100) is None
    assert table["guid"].to_pylist() == [g(1), g(2)] and table["put_time_us"].to_pylist() == [7, None]
    assert table["properties"].to_pylist()[0] == [("n", "5")]
    assert table["property_types"].to_pylist()[0] == [("n", "int32")]
    core.on_frame(ack_frame(1, 2))
    core.on_frame(ack_frame(1, 2))                    # a resent frame's second ACK
    assert core.take().answered == [("t1", Ack(g(1), "taproot://d/q")), ("t2", Ack(g(2), "taproot://d/q"))]
    core.post(1, put(4), "t4", now_ms=1)
    core.flush()
    core.on_frame(ack_frame(4, code=ResultCode.LIMIT_MESSAGES))   # refused as a frame: each PUT gets the code
    (token, error), = core.take().answered
    assert token == "t4" and isinstance(error, AckError) and error.code == ResultCode.LIMIT_MESSAGES


def test_a_reconnection_reopens_every_queue_and_resends_its_unacked_frames_as_they_were_once_it_is_open():
    core = core_with_queue()
    for i in range(1, 5):
        core.post(1, put(i), i, now_ms=0)
    core.flush()
    first, second = core.take().frames                 # [1, 2, 3] (a full batch) and [4]
    core.on_frame(ack_frame(4))
    core.take()
    core.connection_lost("UNAVAILABLE")
    assert core.state is ConnectionState.DISCONNECTED
    core.post(1, put(5), 5, now_ms=1)                 # batched, then held: nowhere to send it
    effects = core.take()
    assert effects.events == [events.ConnectionLost("h1", "UNAVAILABLE", 3)]
    assert effects.frames == []
    core.connected("h2", 2)
    effects = core.take()
    assert [f.WhichOneof("body") for f in effects.frames] == ["open_queue"]
    assert effects.events == [events.Reconnected("h2", 4)]
    core.post(1, put(6), 6, now_ms=3)                 # the queue is not open yet: it waits too
    core.flush()
    assert core.take().frames == []
    reopened(core, effects.frames, window_ms=5000)
    effects = core.take()
    assert sent_guids(effects.frames) == [g(1), g(2), g(3), g(5), g(6)]
    assert effects.frames[0] == first                  # the same frame, byte for byte
    assert effects.events == [events.StateRestored("h2", 1, ())]
    assert core.queues[1].timeout_ms == 5000


def test_a_refused_reopen_ends_that_queue_and_answers_its_puts():
    core = core_with_queue()
    core.connection_lost("x")
    core.post(1, put(1), "p", now_ms=0)
    core.connected("h2", 0)
    reopen = core.take().frames[0].open_queue
    core.on_frame(pb.Frame(error=pb.FrameError(request_id=reopen.request_id,
                                               status=status(ResultCode.REFUSED, "unknown domain"))))
    effects = core.take()
    assert effects.closed == [1] and 1 not in core.queues
    assert effects.events == [events.StateRestored("h2", 0, ("taproot://d/q",))]
    (token, error), = effects.answered
    assert token == "p" and error.code == ResultCode.REFUSED and "unknown domain" in str(error)
    assert len(core.buffer) == 0
    # Posted before the shell learns the queue is gone: the reopen's answer, not CANCELED.
    for late in (core.post(1, put(2), "q", now_ms=1),
                 core.post_columns(1, pb.PutColumns(queue_id=1), g(3), 1, "r", now_ms=1)):
        assert isinstance(late, AckError) and late.code == ResultCode.REFUSED and "unknown domain" in str(late)


def test_stop_request_holds_puts_for_the_next_host_while_acks_and_confirms_flow():
    core = core_with_queue()
    core.on_frame(pb.Frame(stop_request=pb.StopRequest(request_id=9)))
    effects = core.take()
    assert core.state is ConnectionState.HELD
    assert effects.frames == [pb.Frame(stop_response=pb.StopResponse(request_id=9))]
    core.post(1, put(1), 1, now_ms=0)
    core.confirm(1, [7], now_ms=0)
    core.flush()
    frames = core.take().frames
    assert sent_guids(frames) == [] and [f.WhichOneof("body") for f in frames] == ["confirm_columns"]
    core.connection_lost("host stopped")
    core.connected("h2", 1)
    reopened(core, core.take().frames)
    assert sent_guids(core.take().frames) == [g(1)]


def test_bounds_refuse_while_disconnected_and_time_out_with_timeout():
    core = core_with_queue(limits=RetransmissionLimits(max_messages=2, max_bytes=1 << 20, timeout_ms=1000))
    core.connection_lost("x")
    assert core.post(1, put(1), 1, now_ms=0) is None
    core.tick(5)                                      # its linger time: a frame, held since 0
    assert core.post(1, put(2), 2, now_ms=600) is None
    core.tick(605)
    refused = core.post(1, put(3), 3, now_ms=700)
    assert isinstance(refused, AckError) and refused.code == ResultCode.LIMIT_MESSAGES
    core.tick(999)                                    # checked every EXPIRY_INTERVAL_MS (500)
    assert core.take().answered == []
    core.tick(1499)
    (token, error), = core.take().answered
    assert token == 1 and error.code == ResultCode.TIMEOUT and "no ACK within 1 s" in str(error)
    core.tick(1999)
    assert [t for t, _ in core.take().answered] == [2]


def test_without_reconnect_a_lost_connection_fails_everything_once_and_the_state_is_final():
    core = core_with_queue(reconnect=False)
    core.post(1, put(1), "p", now_ms=0)
    core.request(pb.Frame(configure_queue=pb.ConfigureQueue(queue_id=1)), "configure_queue", "r")
    core.connection_lost("RST")
    effects = core.take()
    (token, error), = effects.answered
    assert token == "p" and error.code == ResultCode.UNKNOWN
    (token, failure), = effects.responses
    assert token == "r" and isinstance(failure, ConnectionError)
    assert effects.closed == [1] and core.state is ConnectionState.LOST
    assert isinstance(core.failure(), ConnectionError)
    core.on_frame(ack(1))                             # too late: answered already
    core.stop()
    assert not core.take()


def test_columnar_frames_keep_their_place_in_put_order_across_a_resend():
    core = core_with_queue()
    core.post(1, put(1), "a", now_ms=0)
    frame = pb.PutColumns(queue_id=1, arrow_ipc=b"ipc")
    core.post_columns(1, frame, g(2) + g(3), 2, "cols", now_ms=0)
    core.post(1, put(4), "b", now_ms=0)
    first = core.take().frames
    assert [f.WhichOneof("body") for f in first] == ["put_columns", "put_columns"]   # the batched single went first
    assert sent_guids(first) == [g(1)]
    core.connection_lost("x")
    core.connected("h2", 1)
    reopened(core, core.take().frames)
    resent = core.take().frames
    assert [f.WhichOneof("body") for f in resent] == ["put_columns", "put_columns", "put_columns"]
    assert sent_guids(resent) == [g(1), g(4)] and resent[1].put_columns == frame
    core.on_frame(pb.Frame(ack_columns=pb.AckColumns(queue_id=1, guids=g(2) + g(3))))
    assert core.take().answered == [("cols", [g(2), g(3)])]
    assert core.buffer.messages == 2


def test_a_consumer_asks_for_columnar_pushes_and_the_core_hands_the_frames_to_the_shell():
    core = SessionCore()
    core.connected("h1", 0)
    frame = pb.PushColumns(queue_id=3, count=2, arrow_ipc=b"...")
    core.on_frame(pb.Frame(push_columns=frame))
    effects = core.take()
    assert effects.push_frames == [frame] and effects.pushes == [] and bool(effects)


def test_a_reconnection_resends_each_queues_puts_from_one_pass_over_the_buffer():
    """Many queues reopening must not each scan the whole buffer: the resend
    lists are built once per connection; what was ACKed meanwhile is skipped."""
    # A frame per queue (not one spanning the partition's queues): so one
    # queue's frame can be ACKed on its own below.
    core = SessionCore(batch=BatchPolicy(linger_ms=5, max_messages=1000, columns_min=1, spanning_min=10**6))
    core.connected("h1", 0)
    for qid in range(1, 201):
        core.add_queue(QueueRecord(qid, f"taproot://d/q{qid}", read=False, write=True,
                                   open_request=pb.OpenQueue(queue_id=qid, uri=f"taproot://d/q{qid}", write=True)))
        core.opened(qid, pb.OpenQueueResponse(queue_id=qid, status=status(ResultCode.SUCCESS)))
    for i in range(2000):
        core.post(1 + i % 200, put(i, queue_id=1 + i % 200), i, now_ms=0)
    core.take()
    core.connection_lost("x")
    core.connected("h2", 1)
    reopens = [f.open_queue for f in core.take().frames]
    acked = [5, 205, 405, 605, 805]                        # queue 6's frame of the first batch
    core.on_frame(pb.Frame(ack_columns=pb.AckColumns(       # its ACK, of the lost stream, arriving late
        queue_id=6, guids=b"".join(g(i) for i in acked))))
    calls = []
    items = core.buffer.items
    core.buffer.items = lambda: calls.append(1) or items()  # type: ignore[method-assign]
    for req in reopens:
        core.on_frame(pb.Frame(open_queue_response=pb.OpenQueueResponse(
            request_id=req.request_id, queue_id=req.queue_id, status=status(ResultCode.SUCCESS))))
    resent = sent_guids(core.take().frames)
    assert calls == []                                     # no scan of the buffer per reopen
    assert sorted(resent) == sorted(g(i) for i in range(2000) if i not in acked)
    per_queue = [int.from_bytes(x, "big") for x in resent if int.from_bytes(x, "big") % 200 == 7]
    assert per_queue == sorted(per_queue)                  # PUT order within a queue


def open_request(core: SessionCore, queue_id: int = 2, token: str = "open") -> int:
    record = QueueRecord(queue_id, "taproot://d/r", read=True, write=False,
                         open_request=pb.OpenQueue(queue_id=queue_id, uri="taproot://d/r", read=True))
    core.add_queue(record)
    return core.request(pb.Frame(open_queue=pb.OpenQueue(queue_id=queue_id, uri="taproot://d/r", read=True)),
                        "open_queue", token)


def test_an_open_in_flight_across_a_reconnection_is_answered_by_the_reopen_not_abandoned():
    """Issue 16, defect 9: the open was failed with ConnectionError while the
    reconnection reopened the queue anyway, leaving a consumer on the broker
    that the application never got, holding messages."""
    core = core_with_queue()
    open_request(core)
    core.take()
    core.connection_lost("reset")
    core.connected("h2", 10)
    effects = core.take()
    assert not effects.responses  # nothing abandoned
    reopens = [f.open_queue for f in effects.frames if f.WhichOneof("body") == "open_queue"]
    assert sorted(r.queue_id for r in reopens) == [1, 2]
    for r in reopens:
        core.on_frame(pb.Frame(open_queue_response=pb.OpenQueueResponse(
            request_id=r.request_id, queue_id=r.queue_id, status=status(ResultCode.SUCCESS))))
    (token, response), = core.take().responses
    assert token == "open" and ResultCode.of(response.status.code) is ResultCode.SUCCESS
    assert core.queues[2].open


def test_other_requests_in_flight_are_abandoned_by_a_reconnection():
    core = core_with_queue()
    core.request(pb.Frame(configure_queue=pb.ConfigureQueue(queue_id=1)), "configure_queue", "conf")
    core.connection_lost("reset")
    core.connected("h2", 10)
    (token, error), = core.take().responses
    assert token == "conf" and isinstance(error, ConnectionError)


def test_an_open_answered_after_the_application_gave_up_on_it_is_closed_on_the_broker():
    core = core_with_queue()
    request_id = open_request(core)
    core.forget(request_id)       # the shell's open timed out
    core.remove_queue(2)
    core.take()
    # The answer comes after all: the shell never sees it, but without a
    # close the broker would keep a consumer nobody reads.
    core.on_frame(pb.Frame(open_queue_response=pb.OpenQueueResponse(
        request_id=request_id, queue_id=2, status=status(ResultCode.SUCCESS))))
    effects = core.take()
    assert not effects.responses
    (close,) = [f.close_queue for f in effects.frames if f.WhichOneof("body") == "close_queue"]
    assert close.queue_id == 2
    # A refused one leaves nothing to close.
    request_id = open_request(core, queue_id=3)
    core.forget(request_id)
    core.remove_queue(3)
    core.on_frame(pb.Frame(open_queue_response=pb.OpenQueueResponse(
        request_id=request_id, queue_id=3, status=status(ResultCode.REFUSED))))
    assert not [f for f in core.take().frames if f.WhichOneof("body") == "close_queue"]


@pytest.mark.integration   # dials a real (closed) port
def test_a_session_waiting_for_a_host_ends_when_stopped():
    """connect_timeout_s=None waits for a host as long as it takes; stop()
    from another thread ends the wait with ConnectionError, not a hang."""
    import socket
    import threading

    from taproot import ConnectionError as TaprootConnectionError
    from taproot import Session
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]   # nothing listens here once closed
    session = Session([f"127.0.0.1:{port}"], connect_timeout_s=None, reconnect_interval_s=0.05)
    errors: list[BaseException] = []

    def start() -> None:
        try:
            session.start()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=start)
    thread.start()
    thread.join(0.5)   # ten reconnect intervals
    assert thread.is_alive(), "start() gave up although told to wait"
    session.stop(timeout_s=1)
    thread.join(5)
    assert not thread.is_alive() and len(errors) == 1 and isinstance(errors[0], TaprootConnectionError)
    assert "stopped before a host answered" in str(errors[0])


def test_confirms_go_as_seq_ranges_per_queue_split_at_the_frame_bound():
    from taproot.core import confirm_frames

    core = core_with_queue()
    core.confirm(1, [5, 6, 7, 3, 9, 10], now_ms=0)
    core.flush()
    (frame,) = core.take().frames
    assert frame.confirm_columns == pb.ConfirmColumns(queue_id=1, starts=[5, 3, 9], counts=[3, 1, 2])
    frames = confirm_frames({4: list(range(100, 125)) + [7]}, frame_max=10)
    assert [(list(f.confirm_columns.starts), list(f.confirm_columns.counts)) for f in frames] == \
        [([100], [10]), ([110], [10]), ([120, 7], [5, 1])]
    assert {f.confirm_columns.queue_id for f in frames} == {4}
    assert not any(f.confirm_columns.queue_ids for f in frames)


def test_only_the_confirm_that_begins_a_batch_asks_for_the_flusher():
    """The shell wakes its flusher on CONFIRM_LINGERS only: the first CONFIRM
    of a batch sets the linger deadline `tick` returns; the next ones change
    nothing the flusher waits for (and leave no effects to take), and a
    batch sent at once is CONFIRM_SENT, its frames to take."""
    from taproot.core import CONFIRM_HELD, CONFIRM_LINGERS, CONFIRM_SENT, NO_EFFECTS

    core = core_with_queue()
    assert core.confirm(1, [5], now_ms=0) == CONFIRM_LINGERS
    assert core.confirm(1, [6], now_ms=1) == CONFIRM_HELD and core.take() is NO_EFFECTS
    assert core.tick(1) == 5            # the first CONFIRM's linger
    assert core.tick(5) > 5 and [f.WhichOneof("body") for f in core.take().frames] == ["confirm_columns"]
    assert core.confirm(1, [7], now_ms=6) == CONFIRM_LINGERS      # a new batch
    core.flush()
    core.take()
    assert core.confirm(1, [8, 9, 10], now_ms=7) == CONFIRM_SENT   # full (max 3): sent now, nothing lingers
    assert [f.WhichOneof("body") for f in core.take().frames] == ["confirm_columns"]
    core.connection_lost("gone")
    core.take()
    assert core.confirm(1, [11], now_ms=9) == CONFIRM_HELD and core.take() is NO_EFFECTS   # no stream: dropped


def test_confirms_of_many_queues_share_frames_each_range_naming_its_queue():
    from taproot.core import confirm_frames

    core = SessionCore(batch=BatchPolicy(linger_ms=5, max_messages=100))
    core.connected("h1", 0)
    for qid in (1, 2):
        core.add_queue(QueueRecord(qid, f"taproot://d/q{qid}", read=True, write=False))
    core.confirm(1, [5, 6], now_ms=0)
    core.confirm(2, [5, 8], now_ms=0)
    core.confirm(1, [7], now_ms=0)
    core.flush()
    (frame,) = core.take().frames
    assert frame.confirm_columns == pb.ConfirmColumns(starts=[5, 5, 8], counts=[3, 1, 1], queue_ids=[1, 2, 2])
    # Split at the bound across queues: a range cut in two keeps its queue.
    frames = confirm_frames({1: [1, 2, 3], 2: [10, 11, 12, 13]}, frame_max=5)
    assert [(list(f.confirm_columns.queue_ids), f.confirm_columns.queue_id, list(f.confirm_columns.starts),
             list(f.confirm_columns.counts)) for f in frames] == \
        [([1, 2], 0, [1, 10], [3, 2]), ([], 2, [12], [2])]


def test_a_broadcast_queue_sends_no_confirms():
    core = core_with_queue()
    core.queues[1].broadcast = True
    core.confirm(1, [1, 2], now_ms=0)
    core.flush()
    assert core.take().frames == []


def test_a_producer_posting_to_its_queues_in_turn_sends_one_frame_per_queue_in_each_queues_order():
    core = SessionCore(batch=BatchPolicy(linger_ms=5, max_messages=6, columns_min=1))
    core.connected("h1", 0)
    for qid in (1, 2):
        core.add_queue(QueueRecord(qid, f"taproot://d/q{qid}", read=False, write=True,
                                   open_request=pb.OpenQueue(queue_id=qid, uri=f"taproot://d/q{qid}", write=True)))
        core.opened(qid, pb.OpenQueueResponse(queue_id=qid, status=status(ResultCode.SUCCESS)))
    for i in range(6):
        core.post(1 + i % 2, put(i, queue_id=1 + i % 2), i, now_ms=0)
    frames = core.take().frames
    assert [(f.put_columns.queue_id, sent_guids([f])) for f in frames] == [(1, [g(0), g(2), g(4)]),
                                                                            (2, [g(1), g(3), g(5)])]
    assert len(core.buffer) == 2 and core.buffer.messages == 6


def test_a_queues_few_puts_go_as_put_messages_each_held_and_answered_on_its_own():
    core = SessionCore(batch=BatchPolicy(linger_ms=5, max_messages=1000, columns_min=3))
    core.connected("h1", 0)
    core.add_queue(QueueRecord(1, "taproot://d/q", read=False, write=True,
                               open_request=pb.OpenQueue(queue_id=1, uri="taproot://d/q", write=True)))
    core.opened(1, pb.OpenQueueResponse(queue_id=1, status=status(ResultCode.SUCCESS)))
    core.take()
    core.post(1, put(1), "a", now_ms=0)
    core.post(1, put(2), "b", now_ms=0)
    core.flush()
    (frame,) = core.take().frames
    assert frame.WhichOneof("body") == "put" and [m.guid for m in frame.put.messages] == [g(1), g(2)]
    assert len(core.buffer) == 2                      # an entry each
    core.on_frame(ack(2, code=ResultCode.LIMIT_BYTES))
    (token, error), = core.take().answered
    assert token == "b" and error.code == ResultCode.LIMIT_BYTES
    core.connection_lost("x")
    core.connected("h2", 1)
    reopened(core, core.take().frames)
    (resent,) = core.take().frames                    # resent as PutMessages, packed again
    assert resent.WhichOneof("body") == "put" and [m.guid for m in resent.put.messages] == [g(1)]
    core.on_frame(ack(1))
    assert core.take().answered == [("a", Ack(g(1), "taproot://d/q"))] and core.pending == 0


def test_puts_posted_as_light_records_go_as_put_messages_or_rows_with_every_field():
    core = core_with_queues({7: 0})
    props = [pb.Property(name="n", int64_value=5)]
    core.post(7, Put(g(1), b"one", props, 1_700_000_000_000_001, 2), "a", now_ms=0)
    core.flush()
    (frame,) = core.take().frames                       # fewer than columns_min: a PutMessage
    (message,) = frame.put.messages
    assert (message.queue_id, message.guid, message.payload, message.put_time_us, message.compression) == (
        7, g(1), b"one", 1_700_000_000_000_001, 2)
    assert list(message.properties) == props
    for i in range(2, 5):                               # columns_min of them: one PutColumns frame
        core.post(7, Put(g(i), b"p%d" % i, props if i == 3 else [], 1_700_000_000_000_000 + i, 0), f"t{i}", now_ms=1)
    core.flush()
    (frame,) = core.take().frames
    table = columns.decode(frame.put_columns.arrow_ipc)
    assert frame.put_columns.queue_id == 7 and table["guid"].to_pylist() == [g(2), g(3), g(4)]
    assert table["payload"].to_pylist() == [b"p2", b"p3", b"p4"]
    assert table["put_time_us"].to_pylist() == [1_700_000_000_000_002, 1_700_000_000_000_003, 1_700_000_000_000_004]
    assert table["properties"].to_pylist() == [[], [("n", "5")], []]
    core.on_frame(pb.Frame(ack_columns=pb.AckColumns(queue_id=7, guids=g(2) + g(3) + g(4), code=ResultCode.SUCCESS)))
    assert core.take().answered == [(f"t{i}", Ack(g(i), "taproot://d/q7")) for i in range(2, 5)]


def test_a_call_with_nothing_to_do_hands_back_the_shared_empty_effects_and_never_fills_it():
    core = core_with_queue()                            # max_messages 3
    core.post(1, put(1), "t1", now_ms=0)
    assert core.take() is NO_EFFECTS                    # batched: no frame yet, no new Effects
    core.post(1, put(2), "t2", now_ms=0)
    core.post(1, put(3), "t3", now_ms=0)                # the batch is full: a frame
    effects = core.take()
    assert effects is not NO_EFFECTS and len(effects.frames) == 1
    assert core.take() is NO_EFFECTS
    core.on_frame(ack_frame(1, 2, 3))
    assert [t for t, _ in core.take().answered] == ["t1", "t2", "t3"]
    assert not NO_EFFECTS and NO_EFFECTS.frames == [] and NO_EFFECTS.answered == []


def core_with_queues(partitions: dict[int, int]) -> SessionCore:
    """A connected core with these queues ({queue id: partition}) open for
    writing; 3 PUTs make a queue's own frame, or a frame shared by queues."""
    core = SessionCore(batch=BatchPolicy(linger_ms=5, max_messages=1000, columns_min=3, spanning_min=3))
    core.connected("h1", 0)
    for qid, partition in partitions.items():
        core.add_queue(QueueRecord(qid, f"taproot://d/q{qid}", read=False, write=True,
                                   open_request=pb.OpenQueue(queue_id=qid, uri=f"taproot://d/q{qid}", write=True)))
        core.opened(qid, pb.OpenQueueResponse(queue_id=qid, status=status(ResultCode.SUCCESS), partition=partition))
    core.take()
    return core


def test_the_puts_of_many_queues_share_one_frame_per_partition_queue_by_queue_answered_row_by_row():
    core = core_with_queues({1: 0, 2: 0, 3: 0, 4: 1, 5: 1, 6: 2})
    order = [1, 2, 1, 3, 4, 5, 6, 2]     # partition 0: 5 PUTs, 1: 2, 2: 1
    for i, qid in enumerate(order):
        core.post(qid, put(i, queue_id=qid), f"t{i}", now_ms=0)
    core.flush()
    frames = core.take().frames
    assert [f.WhichOneof("body") for f in frames] == ["put_columns", "put"]
    spanning = frames[0].put_columns
    # Queue by queue (in the order of each queue's first PUT), each queue's PUTs in order.
    assert spanning.queue_id == 0 and list(spanning.queue_ids) == [1, 1, 2, 2, 3] and spanning.per_message
    assert sent_guids(frames[:1]) == [g(0), g(2), g(1), g(7), g(3)] and spanning.guids == b"".join(
        g(i) for i in (0, 2, 1, 7, 3))
    assert sorted(m.guid for m in frames[1].put.messages) == [g(4), g(5), g(6)]   # too few to share a frame
    assert core.buffer.messages == 8 and len(core.buffer) == 4
    core.on_frame(pb.Frame(ack_columns=pb.AckColumns(guids=spanning.guids, refused_rows=[2],
                                                     refused_codes=[ResultCode.LIMIT_MESSAGES],
                                                     refused_messages=["quota"])))
    answered = dict(core.take().answered)
    assert answered["t0"] == Ack(g(0), "taproot://d/q1") and answered["t3"] == Ack(g(3), "taproot://d/q3")
    assert answered["t7"] == Ack(g(7), "taproot://d/q2") and answered["t2"] == Ack(g(2), "taproot://d/q1")
    assert isinstance(answered["t1"], AckError) and answered["t1"].code is ResultCode.LIMIT_MESSAGES
    assert core.buffer.messages == 3


def test_a_partitions_puts_share_one_frame_even_when_one_queue_has_many_and_one_queue_alone_has_its_own():
    """A queue with many PUTs and one with few, of one partition: one frame
    (before, the many had a frame of their own and the few went as
    PutMessages: two entries, two ACKs). A partition with one queue: a
    frame of that queue."""
    core = core_with_queues({1: 0, 2: 0, 3: 1})
    for i in range(40):
        core.post(1, put(i, queue_id=1), i, now_ms=0)
    core.post(2, put(40, queue_id=2), 40, now_ms=0)
    for i in range(41, 51):
        core.post(3, put(i, queue_id=3), i, now_ms=0)
    core.flush()
    frames = [f.put_columns for f in core.take().frames]
    assert [(f.queue_id, list(f.queue_ids)) for f in frames] == [(0, [1] * 40 + [2]), (3, [])]
    assert len(core.buffer) == 2 and core.buffer.messages == 51


def test_a_frame_spanning_queues_is_resent_once_all_reopen_and_holds_back_their_later_puts():
    core = core_with_queues({1: 0, 2: 0, 3: 0})
    for i, qid in enumerate([1, 2, 3]):
        core.post(qid, put(i, queue_id=qid), i, now_ms=0)
    core.flush()
    (first,) = core.take().frames
    assert list(first.put_columns.queue_ids) == [1, 2, 3]
    core.connection_lost("x")
    core.connected("h2", 1)
    reopens = {f.open_queue.queue_id: f.open_queue for f in core.take().frames if f.WhichOneof("body") == "open_queue"}

    def answer(qid: int, code: int = ResultCode.SUCCESS) -> list[pb.Frame]:
        core.on_frame(pb.Frame(open_queue_response=pb.OpenQueueResponse(
            request_id=reopens[qid].request_id, queue_id=qid, status=status(code))))
        return core.take().frames

    assert answer(1) == []
    for i in (10, 11, 12):                  # queue 1 open, but its new PUTs wait behind the frame
        core.post(1, put(i), i, now_ms=2)
    core.flush()
    assert core.take().frames == [] and core.buffer.blocked(1)
    assert answer(3) == []
    resent = answer(2)
    assert resent[0].put_columns == first.put_columns          # byte for byte, first
    assert sent_guids(resent[1:]) == [g(10), g(11), g(12)]
    assert not core.buffer.blocked(1)


def test_a_queue_that_cannot_be_reopened_fails_the_frames_it_shares():
    core = core_with_queues({1: 0, 2: 0, 3: 0})
    for i, qid in enumerate([1, 2, 3]):
        core.post(qid, put(i, queue_id=qid), i, now_ms=0)
    core.flush()
    core.take()
    core.connection_lost("x")
    core.connected("h2", 1)
    reopens = {f.open_queue.queue_id: f.open_queue for f in core.take().frames if f.WhichOneof("body") == "open_queue"}
    core.on_frame(pb.Frame(open_queue_response=pb.OpenQueueResponse(
        request_id=reopens[2].request_id, queue_id=2, status=status(ResultCode.REFUSED, "gone"))))
    answered = dict(core.take().answered)
    assert set(answered) == {0, 1, 2} and all(a.code is ResultCode.REFUSED for a in answered.values())
    for qid in (1, 3):                      # the others no longer wait for it
        core.on_frame(pb.Frame(open_queue_response=pb.OpenQueueResponse(
            request_id=reopens[qid].request_id, queue_id=qid, status=status(ResultCode.SUCCESS))))
    core.post(1, put(20), "late", now_ms=3)
    core.flush()
    assert sent_guids(core.take().frames) == [g(20)] and core.buffer.messages == 1


def test_by_default_it_takes_spanning_min_puts_of_several_queues_to_share_a_frame():
    from protocol.limits import PUT_SPANNING_MIN

    for count, kind in ((PUT_SPANNING_MIN - 1, "put"), (PUT_SPANNING_MIN, "put_columns")):
        core = SessionCore()
        core.connected("h1", 0)
        for qid in range(1, 9):
            core.add_queue(QueueRecord(qid, f"taproot://d/q{qid}", read=False, write=True))
            core.opened(qid, pb.OpenQueueResponse(queue_id=qid, status=status(ResultCode.SUCCESS)))
        for i in range(count):   # 4 or fewer to each of 8 queues: under columns_min each
            core.post(1 + i % 8, put(i, queue_id=1 + i % 8), i, now_ms=0)
        core.flush()
        assert [f.WhichOneof("body") for f in core.take().frames] == [kind]


def test_closing_a_queue_fails_its_unsent_puts_and_frees_the_queues_it_shared_a_frame_with():
    core = core_with_queues({1: 0, 2: 0, 3: 0})
    for i, qid in enumerate([1, 2, 3]):
        core.post(qid, put(i, queue_id=qid), i, now_ms=0)
    core.post(2, put(9, queue_id=2), 9, now_ms=0)
    core.flush()
    core.take()
    core.connection_lost("x")
    core.connected("h2", 1)
    reopens = {f.open_queue.queue_id: f.open_queue for f in core.take().frames if f.WhichOneof("body") == "open_queue"}
    for qid in (1, 3):
        core.on_frame(pb.Frame(open_queue_response=pb.OpenQueueResponse(
            request_id=reopens[qid].request_id, queue_id=qid, status=status(ResultCode.SUCCESS))))
    assert core.take().frames == [] and core.buffer.blocked(1)   # the frame waits for queue 2
    core.remove_queue(2)                                        # closed before its reopen was answered
    answered = dict(core.take().answered)
    assert set(answered) == {0, 1, 2, 9} and all(a.code is ResultCode.CANCELED for a in answered.values())
    assert core.buffer.messages == 0 and not core.buffer.blocked(1)
    core.post(1, put(20), "next", now_ms=2)
    core.flush()
    assert sent_guids(core.take().frames) == [g(20)]


def test_a_batch_of_one_queue_is_its_frame_and_one_other_queues_put_makes_it_span():
    """`_seal` takes a batch of one queue's PUTs whole; the PUT of another
    queue, first or last, makes it a batch of several (one frame for the
    partition, queue by queue); each new batch starts as one queue's again."""
    core = core_with_queues({1: 0, 2: 0})
    for i in range(4):
        core.post(1, put(i, queue_id=1), f"t{i}", now_ms=0)
    core.flush()
    (frame,) = core.take().frames
    assert frame.put_columns.queue_id == 1 and not frame.put_columns.queue_ids
    assert sent_guids([frame]) == [g(i) for i in range(4)] and frame.put_columns.guids == b"".join(map(g, range(4)))
    for i, qid in enumerate([2, 2, 2, 1], start=10):
        core.post(qid, put(i, queue_id=qid), f"t{i}", now_ms=1)
    core.flush()
    (frame,) = core.take().frames
    assert list(frame.put_columns.queue_ids) == [2, 2, 2, 1]
    for i in range(20, 22):   # under columns_min: PutMessages
        core.post(2, put(i, queue_id=2), f"t{i}", now_ms=2)
    core.flush()
    (frame,) = core.take().frames
    assert [m.guid for m in frame.put.messages] == [g(20), g(21)]
    assert core.buffer.messages == 10


def test_a_batch_whose_queue_was_closed_before_it_was_sealed_fails_canceled():
    core = core_with_queues({1: 0})
    for i in range(4):
        core.post(1, put(i, queue_id=1), i, now_ms=0)
    core.queues.pop(1)   # as the shell's close does (`remove_queue`), the batch not sealed yet
    core.flush()
    effects = core.take()
    assert effects.frames == [] and sorted(t for t, _ in effects.answered) == [0, 1, 2, 3]
    assert all(isinstance(a, AckError) and a.code is ResultCode.CANCELED for _, a in effects.answered)
