"""The relay every forwarding hop shares: id mapping and the retransmission buffer."""

import pyarrow as pa

from protocol import ResultCode, pb
from protocol.retransmit import RetransmissionLimits
from replicas.relay import UPSTREAM, Relay


def open_frame(qid, req, read=False, write=True):
    return pb.Frame(open_queue=pb.OpenQueue(request_id=req, queue_id=qid, uri="taproot://d/q", read=read,
                                            write=write))


def opened(relay, up_frame, window_ms=0, broadcast=False):
    return relay.from_upstream(pb.Frame(open_queue_response=pb.OpenQueueResponse(
        request_id=up_frame.open_queue.request_id, queue_id=up_frame.open_queue.queue_id,
        status=pb.Status(code=0), dedup_history_window_ms=window_ms, broadcast=broadcast)))


def put(qid, *guids, payload=b"p"):
    return pb.Frame(put=pb.PutBatch(messages=[pb.PutMessage(queue_id=qid, guid=g, payload=payload)
                                              for g in guids]))


def ack(qid, *guids, code=0):
    return pb.Frame(ack=pb.AckBatch(messages=[pb.AckMessage(queue_id=qid, guid=g, code=code) for g in guids]))


def g(i: int) -> bytes:
    return i.to_bytes(16, "big")


def upstream_puts(out):
    return [m.guid for d, f in out if d == UPSTREAM and f.WhichOneof("body") == "put" for m in f.put.messages]


def test_relay_maps_queue_ids_both_ways():
    relay = Relay()
    # Two clients use the same downstream queue id 1: upstream ids must differ.
    (dest_a, up_a), = relay.from_downstream("A", open_frame(1, 10))
    (dest_b, up_b), = relay.from_downstream("B", open_frame(1, 10, read=True))
    assert dest_a == dest_b == UPSTREAM
    qa, qb = up_a.open_queue.queue_id, up_b.open_queue.queue_id
    assert qa != qb
    (to, resp), = opened(relay, up_a)
    assert to == "A" and resp.open_queue_response.request_id == 10 and resp.open_queue_response.queue_id == 1

    out = relay.from_downstream("A", pb.Frame(put=pb.PutBatch(messages=[
        pb.PutMessage(queue_id=1, guid=g(1), payload=b"p"), pb.PutMessage(queue_id=7, guid=g(2), payload=b"p")])))
    upstream = [f for d, f in out if d == UPSTREAM]
    nacks = [f for d, f in out if d == "A"]
    assert [m.queue_id for m in upstream[0].put.messages] == [qa]
    assert nacks[0].ack.messages[0].code == ResultCode.INVALID_ARGUMENT  # queue 7 never opened
    assert relay.unacked_count == 1

    push = pb.Frame(push=pb.PushBatch(messages=[pb.PushMessage(queue_id=qb, guid=b"x" * 16)]))
    (to, frame), = relay.from_upstream(push)
    assert to == "B" and frame.push.messages[0].queue_id == 1

    (to, frame), = relay.from_upstream(ack(qa, g(1)))
    assert to == "A" and frame.ack.messages[0].queue_id == 1 and relay.unacked_count == 0
    assert relay.from_upstream(ack(qa, g(1))) == []  # a second ACK of the same PUT goes nowhere


def test_puts_sent_before_the_open_is_answered_wait_for_it_in_order():
    relay = Relay()
    (_, up), = relay.from_downstream("A", open_frame(1, 1))
    assert relay.from_downstream("A", put(1, g(1), g(2))) == []
    out = opened(relay, up)
    assert [d for d, _ in out] == ["A", UPSTREAM] and upstream_puts(out) == [g(1), g(2)]


def test_failover_reopens_every_queue_and_resends_unacked_puts_in_order_with_one_ack_each():
    relay = Relay()
    (_, up), = relay.from_downstream("A", open_frame(1, 1))
    (_, up_r), = relay.from_downstream("B", open_frame(5, 2, read=True))
    opened(relay, up)
    opened(relay, up_r)
    qid = up.open_queue.queue_id
    relay.from_downstream("A", put(1, g(1), g(2), g(3)))
    relay.from_upstream(ack(qid, g(1)))

    assert relay.upstream_lost() == []            # nobody hears about it
    assert relay.from_downstream("A", put(1, g(4))) == []        # buffered while disconnected
    assert relay.from_downstream("B", pb.Frame(confirm=pb.ConfirmBatch(messages=[
        pb.ConfirmMessage(queue_id=5, guid=g(9))]))) == []     # dropped: redelivered later
    reopen = relay.upstream_restored()
    assert [f.open_queue.queue_id for _, f in reopen] == [qid, up_r.open_queue.queue_id]
    assert all(d == UPSTREAM for d, _ in reopen)
    out = relay.from_upstream(pb.Frame(open_queue_response=pb.OpenQueueResponse(
        request_id=reopen[0][1].open_queue.request_id, queue_id=qid, status=pb.Status(code=0))))
    assert [d for d, _ in out] == [UPSTREAM]       # the client sees no second open response
    assert upstream_puts(out) == [g(2), g(3), g(4)]

    (to, frame), = relay.from_upstream(ack(qid, g(2), g(3), g(4)))
    assert [m.guid for m in frame.ack.messages] == [g(2), g(3), g(4)]
    assert relay.from_upstream(ack(qid, g(2))) == []  # the old primary's late ACK: already answered
    assert relay.unacked_count == 0


def test_a_refused_reopen_answers_the_buffered_puts_and_ends_the_client_link():
    relay = Relay()
    (_, up), = relay.from_downstream("A", open_frame(1, 1))
    opened(relay, up)
    relay.from_downstream("A", put(1, g(1)))
    relay.upstream_lost()
    (_, reopen), = relay.upstream_restored()
    out = relay.from_upstream(pb.Frame(open_queue_response=pb.OpenQueueResponse(
        request_id=reopen.open_queue.request_id, queue_id=reopen.open_queue.queue_id,
        status=pb.Status(code=ResultCode.REFUSED, message="unknown domain"))))
    (to, nack), (to2, closing) = out
    assert to == to2 == "A" and nack.ack.messages[0].code == ResultCode.REFUSED and closing is None
    assert relay.unacked_count == 0


def test_buffer_bounds_refuse_with_stable_codes_and_expire_with_timeout():
    relay = Relay(RetransmissionLimits(max_messages=2, max_bytes=10_000_000, timeout_ms=60_000))
    (_, up), = relay.from_downstream("A", open_frame(1, 1))
    opened(relay, up, window_ms=5_000)             # the domain's dedup window is shorter: it wins
    relay.from_downstream("A", put(1, g(1), g(2)), now_ms=0)
    (_, nack), = [x for x in relay.from_downstream("A", put(1, g(3)), now_ms=1) if x[0] == "A"]
    assert nack.ack.messages[0].code == ResultCode.LIMIT_MESSAGES

    big = Relay(RetransmissionLimits(max_messages=10, max_bytes=1000, timeout_ms=60_000))
    (_, up2), = big.from_downstream("A", open_frame(1, 1))
    opened(big, up2)
    (_, nack), = [x for x in big.from_downstream("A", put(1, g(1), payload=b"x" * 2000)) if x[0] == "A"]
    assert nack.ack.messages[0].code == ResultCode.LIMIT_BYTES

    assert relay.expire(4_999) == []
    (to, timed_out), = relay.expire(5_000)
    assert to == "A" and {m.code for m in timed_out.ack.messages} == {ResultCode.TIMEOUT}
    assert relay.expire(5_001) == [] and relay.unacked_count == 0


def test_each_route_keeps_its_own_time_bound_and_the_expiry_scan_starts_from_the_shortest_held():
    relay = Relay(RetransmissionLimits(timeout_ms=60_000))
    (_, short), = relay.from_downstream("A", open_frame(1, 1))
    (_, long), = relay.from_downstream("A", open_frame(2, 2))
    opened(relay, short, window_ms=5_000)
    opened(relay, long)
    relay.from_downstream("A", put(2, g(1)), now_ms=0)   # on the 60 s route
    relay.from_downstream("A", put(1, g(2)), now_ms=10)  # on the 5 s route
    # The bounds held are counted as PUTs come and go, not found by a scan
    # of the routes (10,000 queues made that scan 12% of a proxy's time).
    assert dict(relay._buffer._timeouts) == {5_000: 1, 60_000: 1}
    (_, timed_out), = relay.expire(5_010)
    assert [m.guid for m in timed_out.ack.messages] == [g(2)]
    assert relay.unacked_count == 1
    assert dict(relay._buffer._timeouts) == {60_000: 1}
    (_, close), = relay.from_downstream("A", pb.Frame(close_queue=pb.CloseQueue(request_id=3, queue_id=1)))
    relay.from_upstream(pb.Frame(close_queue_response=pb.CloseQueueResponse(
        request_id=close.close_queue.request_id, queue_id=close.close_queue.queue_id, status=pb.Status(code=0))))
    assert relay.expire(59_999) == []
    (_, timed_out), = relay.expire(60_000)
    assert [m.guid for m in timed_out.ack.messages] == [g(1)]


def test_stop_request_from_upstream_holds_puts_for_the_next_upstream():
    relay = Relay()
    (_, up), = relay.from_downstream("A", open_frame(1, 1))
    opened(relay, up)
    (to, response), = relay.from_upstream(pb.Frame(stop_request=pb.StopRequest(request_id=7)))
    assert to == UPSTREAM and response.stop_response.request_id == 7
    assert relay.from_downstream("A", put(1, g(1))) == []         # held, not sent to the stopping node
    relay.upstream_lost()
    (_, reopen), = relay.upstream_restored()
    out = relay.from_upstream(pb.Frame(open_queue_response=pb.OpenQueueResponse(
        request_id=reopen.open_queue.request_id, queue_id=reopen.open_queue.queue_id, status=pb.Status())))
    assert upstream_puts(out) == [g(1)]


def test_close_and_configure_while_disconnected_complete_locally_and_reopen_uses_new_options():
    relay = Relay()
    (_, up), = relay.from_downstream("A", open_frame(1, 1, read=True, write=False))
    (_, up2), = relay.from_downstream("A", open_frame(2, 2))
    opened(relay, up)
    opened(relay, up2)
    relay.upstream_lost()
    (to, resp), = relay.from_downstream("A", pb.Frame(configure_queue=pb.ConfigureQueue(
        request_id=3, queue_id=1, options=pb.QueueOptions(max_unconfirmed_messages=7))))
    assert resp.configure_queue_response.status.code == ResultCode.SUCCESS
    (to, resp), = relay.from_downstream("A", pb.Frame(close_queue=pb.CloseQueue(request_id=4, queue_id=2)))
    assert resp.close_queue_response.status.code == ResultCode.SUCCESS
    (_, reopen), = relay.upstream_restored()
    assert reopen.open_queue.options.max_unconfirmed_messages == 7


def test_relay_closes_upstream_queues_of_a_departed_client():
    relay = Relay()
    relay.from_downstream("A", open_frame(1, 1, read=True))
    out = relay.from_downstream("A", open_frame(2, 2))
    out = relay.downstream_closed("A")
    assert [d for d, _ in out] == [UPSTREAM, UPSTREAM]
    assert all(f.WhichOneof("body") == "close_queue" for _, f in out)


def test_relay_rejects_server_frames_from_clients_and_reused_queue_ids():
    relay = Relay()
    (to, err), = relay.from_downstream("A", pb.Frame(ack=pb.AckBatch()))
    assert to == "A" and err.error.status.code == ResultCode.INVALID_ARGUMENT
    (to, err), = relay.from_downstream("A", pb.Frame())
    assert err.error.status.code == ResultCode.INVALID_ARGUMENT
    relay.from_downstream("A", open_frame(1, 1))
    (to, resp), = relay.from_downstream("A", open_frame(1, 2))
    assert resp.open_queue_response.status.code == ResultCode.INVALID_ARGUMENT


class FakeLink:
    def __init__(self, columnar=(), broadcast=(), push_groups=None):
        self.frames = []
        self.columnar = set(columnar)
        self.broadcast = set(broadcast)
        self.push_groups = dict(push_groups or {})

    def send(self, frame):
        self.frames.append(frame)


def test_one_message_for_several_queues_of_a_link_goes_down_it_once():
    from primary.dispatcher import StoredMessage
    from primary.partition import send_pushes

    a, b = FakeLink(), FakeLink()
    m1, m2 = StoredMessage(g(1), 1, b"one"), StoredMessage(g(2), 2, b"two")
    # Fanout apps 1, 2, 3 on link a (merged by seq), and one on link b.
    send_pushes([((a, 1), m1), ((a, 2), m1), ((b, 9), m1), ((a, 3), m1), ((a, 1), m2), ((a, 2), m2)])
    (frame,) = a.frames
    pushed = [(m.guid, list(m.queue_ids) or [m.queue_id]) for m in frame.push.messages]
    assert pushed == [(g(1), [1, 2, 3]), (g(2), [1, 2])]
    assert [(m.queue_id, list(m.queue_ids)) for m in b.frames[0].push.messages] == [(9, [])]


def test_a_run_of_pushes_to_a_columnar_consumer_goes_as_one_arrow_frame_and_relays_pass_it_on():
    from primary.dispatcher import StoredMessage
    from primary.partition import COLUMNAR_RUN_MIN, send_pushes
    from protocol import columns

    link = FakeLink(columnar={1})
    run = [StoredMessage(g(i), i, b"p%d" % i, maps=([("n", str(i))], [("n", "int32")]) if i % 2 else None,
                         put_time_us=i, delivery_count=1) for i in range(COLUMNAR_RUN_MIN + 2)]
    few = [StoredMessage(g(100 + i), 100 + i, b"f") for i in range(COLUMNAR_RUN_MIN - 1)]
    send_pushes([((link, 1), m) for m in run] + [((link, 2), m) for m in run[:2]] + [((link, 1), m) for m in few])
    kinds = [f.WhichOneof("body") for f in link.frames]
    assert kinds == ["push", "push_columns"]   # queue 2 does not take columns: messages
    assert [(m.queue_id, m.guid) for m in link.frames[0].push.messages] == [(2, run[0].guid), (2, run[1].guid)]
    frame = link.frames[1].push_columns   # queue 1's pushes, all of them
    table = columns.decode_push(frame.arrow_ipc)
    assert frame.queue_id == 1 and frame.count == table.num_rows == len(run) + len(few)
    assert table["guid"].to_pylist() == [m.guid for m in run + few]
    assert table["seq"].to_pylist() == [m.seq for m in run + few]
    assert table["properties"].to_pylist()[1] == [("n", "1")] and table["properties"].to_pylist()[0] is None
    assert (list(frame.seq_starts), list(frame.seq_counts)) == ([0, 100], [len(run), len(few)])   # what relays read
    assert not frame.range_queue_ids   # one queue
    link.frames.clear()
    send_pushes([((link, 1), m) for m in few])   # too few for a frame
    assert [(m.queue_id, m.guid) for m in link.frames[0].push.messages] == [(1, m.guid) for m in few]
    frame.count = len(run)   # (the relay below checks the header only)
    del frame.seq_starts[1:], frame.seq_counts[1:]

    relay = Relay()
    (_, up), = relay.from_downstream("A", open_frame(7, 1, read=True, write=False))
    opened(relay, up)
    frame.queue_id = up.open_queue.queue_id
    (dest, down), = relay.from_upstream(pb.Frame(push_columns=frame))
    assert dest == "A" and down.push_columns.queue_id == 7 and down.push_columns.arrow_ipc == frame.arrow_ipc
    assert relay.unconfirmed_count == len(run)
    relay.from_downstream("A", pb.Frame(confirm=pb.ConfirmBatch(messages=[
        pb.ConfirmMessage(queue_id=7, guid=m.guid, sequence=m.seq) for m in run[:2]])))
    assert relay.unconfirmed_count == len(run) - 2
    (dest, confirm), = relay.from_downstream("A", pb.Frame(confirm_columns=pb.ConfirmColumns(
        queue_id=7, starts=[2, 50], counts=[len(run) - 2, 3])))
    assert dest == UPSTREAM and confirm.confirm_columns.queue_id == frame.queue_id
    assert relay.unconfirmed_count == 0


def test_a_broadcast_route_tracks_no_confirms_and_a_bad_confirm_frame_is_refused():
    from primary.dispatcher import StoredMessage
    from primary.partition import COLUMNAR_RUN_MIN, send_pushes

    link = FakeLink(columnar={1}, broadcast={1})
    send_pushes([((link, 1), StoredMessage(g(i), 0, b"b")) for i in range(COLUMNAR_RUN_MIN)])
    (frame,) = link.frames
    assert frame.push_columns.count == COLUMNAR_RUN_MIN and not frame.push_columns.seq_starts
    relay = Relay()
    (_, up), = relay.from_downstream("A", open_frame(7, 1, read=True, write=False))
    opened(relay, up, broadcast=True)
    frame.push_columns.queue_id = up.open_queue.queue_id
    relay.from_upstream(frame)
    relay.from_upstream(pb.Frame(push=pb.PushBatch(messages=[pb.PushMessage(queue_id=up.open_queue.queue_id,
                                                                            guid=g(1))])))
    assert relay.unconfirmed_count == 0 and relay.drained   # a graceful stop waits for no broadcast confirm
    for bad in (pb.ConfirmColumns(queue_id=7, starts=[1, 2], counts=[1]),
                pb.ConfirmColumns(queue_id=7, starts=[0], counts=[2**32 - 1]),
                pb.ConfirmColumns(starts=[1, 2], counts=[1, 1], queue_ids=[7])):
        (dest, error), = relay.from_downstream("A", pb.Frame(confirm_columns=bad))
        assert dest == "A" and error.error.status.code == ResultCode.INVALID_ARGUMENT


def test_a_wide_confirm_range_over_few_held_seqs_is_cheap():
    relay = Relay()
    (_, up), = relay.from_downstream("A", open_frame(7, 1, read=True, write=False))
    opened(relay, up)
    qid = up.open_queue.queue_id
    relay.from_upstream(pb.Frame(push_columns=pb.PushColumns(queue_id=qid, count=3, seq_starts=[10, 90],
                                                             seq_counts=[2, 1])))
    assert relay.unconfirmed_count == 3
    relay.from_downstream("A", pb.Frame(confirm_columns=pb.ConfirmColumns(queue_id=7, starts=[0], counts=[99_999])))
    assert relay.unconfirmed_count == 0


def test_a_confirm_frame_of_several_queues_goes_up_as_one_frame_under_upstream_ids():
    relay = Relay()
    ups = {}
    for qid, req in ((7, 1), (8, 2), (9, 3)):
        (_, up), = relay.from_downstream("A", open_frame(qid, req, read=True, write=False))
        opened(relay, up)
        ups[qid] = up.open_queue.queue_id
        relay.from_upstream(pb.Frame(push_columns=pb.PushColumns(queue_id=ups[qid], count=3, seq_starts=[qid * 10],
                                                                 seq_counts=[3])))
    assert relay.unconfirmed_count == 9
    # 7 and 9 confirmed in part, 8 not at all; 42 is not open here.
    (dest, up_frame), = relay.from_downstream("A", pb.Frame(confirm_columns=pb.ConfirmColumns(
        starts=[70, 90, 72, 1], counts=[1, 3, 1, 5], queue_ids=[7, 9, 7, 42])))
    body = up_frame.confirm_columns
    assert dest == UPSTREAM and body.queue_id == 0
    assert sorted(zip(body.queue_ids, body.starts, body.counts)) == \
        sorted([(ups[7], 70, 1), (ups[7], 72, 1), (ups[9], 90, 3)])
    assert relay.unconfirmed_count == 4
    # Ranges of one queue only: named once, in `queue_id`.
    (_, up_frame), = relay.from_downstream("A", pb.Frame(confirm_columns=pb.ConfirmColumns(
        starts=[80], counts=[3], queue_ids=[8])))
    assert up_frame.confirm_columns.queue_id == ups[8] and not up_frame.confirm_columns.queue_ids
    assert relay.unconfirmed_count == 1
    assert relay.from_downstream("A", pb.Frame(confirm_columns=pb.ConfirmColumns(
        starts=[1], counts=[1], queue_ids=[42]))) == []


def test_a_confirm_frame_of_several_queues_keeps_its_order_when_ranges_of_queues_not_open_are_left_out():
    relay = Relay()
    ups = {}
    for qid, req in ((7, 1), (9, 2)):
        (_, up), = relay.from_downstream("A", open_frame(qid, req, read=True, write=False))
        opened(relay, up)
        ups[qid] = up.open_queue.queue_id
        relay.from_upstream(pb.Frame(push_columns=pb.PushColumns(queue_id=ups[qid], count=4, seq_starts=[qid * 10],
                                                                 seq_counts=[4])))
    # 42 and 43 are not open here: their ranges (first, middle, last) are dropped, the rest keep their order.
    (_, up_frame), = relay.from_downstream("A", pb.Frame(confirm_columns=pb.ConfirmColumns(
        queue_ids=[42, 9, 7, 43, 9, 7, 42], starts=[1, 90, 70, 5, 92, 72, 8], counts=[1, 2, 1, 3, 1, 2, 1])))
    body = up_frame.confirm_columns
    assert list(zip(body.queue_ids, body.starts, body.counts)) == [
        (ups[9], 90, 2), (ups[7], 70, 1), (ups[9], 92, 1), (ups[7], 72, 2)]
    assert relay.unconfirmed_count == 2    # 71 and 93


def test_relay_splits_a_multi_queue_push_by_link_and_keeps_one_copy_per_link():
    relay = Relay()
    ups = {}
    for link, qid, req in (("A", 1, 1), ("A", 2, 2), ("B", 1, 3)):
        (_, up), = relay.from_downstream(link, open_frame(qid, req, read=True, write=False))
        opened(relay, up)
        ups[(link, qid)] = up.open_queue.queue_id
    push = pb.PushMessage(guid=g(5), payload=b"x", queue_ids=list(ups.values()))
    out = dict(relay.from_upstream(pb.Frame(push=pb.PushBatch(messages=[push]))))
    assert [list(m.queue_ids) for m in out["A"].push.messages] == [[1, 2]]
    assert [(m.queue_id, list(m.queue_ids)) for m in out["B"].push.messages] == [(1, [])]
    assert relay.unconfirmed_count == 3


def test_a_pause_is_pending_until_answered_so_a_drain_counts_pushes_in_flight():
    """A graceful stop pauses its consumers upstream and must not close before
    the pause is answered: PUSHes the upstream sent before applying it come
    first on the same stream, and only then is the unconfirmed count whole."""
    relay = Relay()
    (_, up), = relay.from_downstream("C", open_frame(1, 10, read=True, write=False))
    opened(relay, up)
    qid = up.open_queue.queue_id
    (to, pause), = relay.pause_consumers()
    assert to == UPSTREAM and pause.configure_queue.queue_id == qid and relay.pauses_pending == 1
    # A PUSH sent before the upstream applied the pause arrives first.
    relay.from_upstream(pb.Frame(push=pb.PushBatch(messages=[pb.PushMessage(queue_id=qid, guid=g(5))])))
    assert relay.unconfirmed_count == 1 and relay.pauses_pending == 1
    assert relay.from_upstream(pb.Frame(configure_queue_response=pb.ConfigureQueueResponse(
        request_id=pause.configure_queue.request_id, queue_id=qid, status=pb.Status(code=0)))) == []
    assert relay.pauses_pending == 0 and relay.unconfirmed_count == 1
    relay.pause_consumers()
    relay.upstream_lost()   # nothing to wait for from a lost upstream
    assert relay.pauses_pending == 0


def test_a_restored_upstream_resends_each_queues_puts_without_a_scan_per_queue():
    relay = Relay()
    ups = []
    for qid in range(1, 101):
        (_, up), = relay.from_downstream("A", open_frame(qid, qid))
        opened(relay, up)
        ups.append(up)
    for i in range(1000):
        relay.from_downstream("A", put(1 + i % 100, g(i)))
    relay.upstream_lost()
    reopens = [f.open_queue for _, f in relay.upstream_restored()]
    relay.from_upstream(pb.Frame(ack=pb.AckBatch(messages=[pb.AckMessage(queue_id=reopens[3].queue_id, guid=g(3))])))
    calls = []
    items = relay._buffer.items
    relay._buffer.items = lambda: calls.append(1) or items()
    resent = []
    for req in reopens:
        for _, frame in relay.from_upstream(pb.Frame(open_queue_response=pb.OpenQueueResponse(
                request_id=req.request_id, queue_id=req.queue_id, status=pb.Status(code=0)))):
            resent.extend(m.guid for m in frame.put.messages)
    assert calls == [] and sorted(resent) == sorted(g(i) for i in range(1000) if i != 3)


def test_the_same_guid_twice_on_one_stream_gets_two_acks_as_it_would_from_the_node():
    """A client that sends one GUID twice before its ACK gets an ACK for
    each PUT, through a relay as from a node (which answers the second as a
    duplicate): the relay forwards both, answers both, resends both."""
    relay = Relay()
    (_, up), = relay.from_downstream("A", open_frame(1, 1))
    opened(relay, up)
    qid = up.open_queue.queue_id
    assert upstream_puts(relay.from_downstream("A", put(1, g(1), g(1)))) == [g(1), g(1)]   # one batch
    assert upstream_puts(relay.from_downstream("A", put(1, g(1)))) == [g(1)]               # a later one
    assert relay.unacked_count == 1  # one held entry, three PUTs waiting on it
    (to, first), = relay.from_upstream(ack(qid, g(1)))
    assert to == "A" and [m.guid for m in first.ack.messages] == [g(1)]

    relay.upstream_lost()
    (_, reopen), = relay.upstream_restored()
    resent = relay.from_upstream(pb.Frame(open_queue_response=pb.OpenQueueResponse(
        request_id=reopen.open_queue.request_id, queue_id=qid, status=pb.Status(code=0))))
    assert upstream_puts(resent) == [g(1), g(1)]   # the two not answered yet
    answers = [relay.from_upstream(ack(qid, g(1))) for _ in range(3)]
    assert [len(a) for a in answers] == [1, 1, 0]  # a third ACK (the old primary's late one) answers nothing
    assert relay.unacked_count == 0


def test_copies_not_yet_answered_are_each_answered_when_they_time_out():
    relay = Relay(RetransmissionLimits(max_messages=10, max_bytes=10_000_000, timeout_ms=1_000))
    (_, up), = relay.from_downstream("A", open_frame(1, 1))
    opened(relay, up)
    relay.from_downstream("A", put(1, g(1), g(1), g(2)), now_ms=0)
    (to, timed_out), = relay.expire(1_000)
    assert to == "A" and [m.guid for m in timed_out.ack.messages] == [g(1), g(1), g(2)]
    assert {m.code for m in timed_out.ack.messages} == {ResultCode.TIMEOUT}



def test_a_broadcast_frame_goes_down_each_link_once_with_its_queue_ids_and_relays_split_it_by_link():
    import pyarrow as pa

    from primary.dispatcher import ConsumerOptions, QueueDispatcher
    from primary.partition import push_run, send_pushes
    from protocol import columns

    a, b = FakeLink(columnar={1, 2}), FakeLink(columnar={9})
    d = QueueDispatcher()
    for key in ((a, 1), (a, 2), (b, 9)):
        d.add_consumer(key, ConsumerOptions())
    rows = pa.table({"guid": [g(1), g(2)], "payload": [b"x", b"y"], "properties": pa.nulls(2, columns.PROPERTY_MAP),
                     "property_types": pa.nulls(2, columns.PROPERTY_MAP), "compression": pa.nulls(2, pa.string())})
    send_pushes(d.broadcast_run(push_run(rows, [0, 0], delivery_count=1)))
    (to_a,), (to_b,) = a.frames, b.frames
    assert (to_a.push_columns.queue_id, list(to_a.push_columns.queue_ids)) == (1, [1, 2])
    assert (to_b.push_columns.queue_id, list(to_b.push_columns.queue_ids)) == (9, [])
    table = columns.decode_push(to_a.push_columns.arrow_ipc)
    assert table["guid"].to_pylist() == [g(1), g(2)] and table["delivery_count"].to_pylist() == [1, 1]
    assert d.unconfirmed_count == 0   # broadcast keeps nothing

    relay = Relay()
    ups = []
    for link, qid in (("A", 1), ("A", 2), ("B", 5)):
        (_, up), = relay.from_downstream(link, open_frame(qid, qid, read=True, write=False))
        opened(relay, up)
        ups.append(up.open_queue.queue_id)
    frame = pb.Frame(push_columns=pb.PushColumns(queue_id=ups[0], queue_ids=ups, count=2,
                                                 arrow_ipc=to_a.push_columns.arrow_ipc))
    out = sorted(relay.from_upstream(frame), key=lambda o: o[0])
    assert [(dest, f.push_columns.queue_id, list(f.push_columns.queue_ids)) for dest, f in out] == \
        [("A", 1, [1, 2]), ("B", 5, [])]
    assert all(f.push_columns.arrow_ipc == to_a.push_columns.arrow_ipc for _, f in out)


def test_a_frame_of_single_puts_keeps_its_per_message_flag_upstream():
    relay = Relay()
    (_, up), = relay.from_downstream("A", open_frame(1, 10))
    opened(relay, up)
    from protocol import columns
    frame = pb.Frame(put_columns=pb.PutColumns(queue_id=1, per_message=True, arrow_ipc=columns.encode_puts(
        [pb.PutMessage(queue_id=1, guid=g(i), payload=b"p") for i in range(3)])))
    (dest, sent), = relay.from_downstream("A", frame)
    assert dest == UPSTREAM and sent.put_columns.per_message and sent.put_columns.queue_id == up.open_queue.queue_id


def test_a_put_frame_with_its_header_goes_up_unopened_and_its_answers_use_the_header():
    """The relay keys, forwards and answers a PutColumns frame by its
    header's GUIDs: a body it cannot read is not its business (the primary
    checks it), so it is forwarded byte for byte."""
    relay = Relay(RetransmissionLimits(max_messages=10))
    (_, up), = relay.from_downstream("A", open_frame(1, 10))
    opened(relay, up)
    guids = g(1) + g(2)
    frame = pb.Frame(put_columns=pb.PutColumns(queue_id=1, arrow_ipc=b"not arrow at all", guids=guids))
    (dest, sent), = relay.from_downstream("A", frame)
    assert dest == UPSTREAM and sent.put_columns.arrow_ipc == b"not arrow at all"
    assert sent.put_columns.queue_id == up.open_queue.queue_id and relay.unacked_count == 2
    (dest, down), = relay.from_upstream(pb.Frame(ack_columns=pb.AckColumns(
        queue_id=up.open_queue.queue_id, guids=guids, code=ResultCode.INVALID_ARGUMENT)))
    assert dest == "A" and down.ack_columns.queue_id == 1 and relay.unacked_count == 0
    big = pb.Frame(put_columns=pb.PutColumns(queue_id=1, arrow_ipc=b"x", guids=b"".join(g(i) for i in range(11))))
    (dest, refused), = relay.from_downstream("A", big)   # past the buffer's bound: answered from the header
    assert refused.ack_columns.code == ResultCode.LIMIT_MESSAGES and len(refused.ack_columns.guids) == 11 * 16
    (dest, error), = relay.from_downstream("A", pb.Frame(put_columns=pb.PutColumns(queue_id=1, guids=b"short")))
    assert dest == "A" and error.error.status.code == ResultCode.INVALID_ARGUMENT


def test_a_put_frame_spanning_queues_goes_up_whole_with_upstream_ids_and_is_answered_whole():
    relay = Relay()
    ups = {}
    for qid, req in ((1, 1), (2, 2), (3, 3)):
        (_, up), = relay.from_downstream("A", open_frame(qid, req))
        opened(relay, up)
        ups[qid] = up.open_queue.queue_id
    guids = g(1) + g(2) + g(3) + g(4)
    frame = pb.PutColumns(arrow_ipc=b"not opened here", per_message=True, guids=guids, queue_ids=[2, 1, 2, 3])
    (dest, up_frame), = relay.from_downstream("A", pb.Frame(put_columns=frame))
    body = up_frame.put_columns
    assert dest == UPSTREAM and body.queue_id == 0 and body.arrow_ipc == frame.arrow_ipc and body.guids == guids
    assert list(body.queue_ids) == [ups[2], ups[1], ups[2], ups[3]]
    assert relay.unacked_count == 4
    (dest, down), = relay.from_upstream(pb.Frame(ack_columns=pb.AckColumns(guids=guids, refused_rows=[1],
                                                                           refused_codes=[ResultCode.LIMIT_BYTES])))
    assert dest == "A" and down.ack_columns.guids == guids and list(down.ack_columns.refused_rows) == [1]
    assert relay.unacked_count == 0
    # A queue of the frame not open here: the frame is refused whole.
    (dest, nack), = relay.from_downstream("A", pb.Frame(put_columns=pb.PutColumns(
        per_message=True, guids=g(5) + g(6), queue_ids=[1, 9])))
    assert dest == "A" and nack.ack_columns.code == ResultCode.INVALID_ARGUMENT
    assert "queue id 9 is not open" in nack.ack_columns.message and relay.unacked_count == 0


def test_after_failover_a_frame_spanning_queues_waits_for_all_their_reopens_and_holds_back_their_puts():
    relay = Relay()
    ups = {}
    for qid, req in ((1, 1), (2, 2)):
        (_, up), = relay.from_downstream("A", open_frame(qid, req))
        opened(relay, up)
        ups[qid] = up.open_queue.queue_id
    guids = g(1) + g(2)
    relay.from_downstream("A", pb.Frame(put_columns=pb.PutColumns(per_message=True, guids=guids, queue_ids=[1, 2])))
    relay.upstream_lost()
    reopens = {f.open_queue.queue_id: f.open_queue for _, f in relay.upstream_restored()}

    def reopened(up_qid):
        return relay.from_upstream(pb.Frame(open_queue_response=pb.OpenQueueResponse(
            request_id=reopens[up_qid].request_id, queue_id=up_qid, status=pb.Status(code=0))))

    assert reopened(ups[1]) == []
    assert relay.from_downstream("A", put(1, g(3))) == []     # queue 1 is open, but behind the frame
    out = reopened(ups[2])
    assert [f.WhichOneof("body") for _, f in out] == ["put_columns", "put"]
    assert out[0][1].put_columns.guids == guids and upstream_puts(out[1:]) == [g(3)]
    assert relay.from_downstream("A", put(1, g(4))) != []     # nothing waits any more: it goes at once


def test_pushes_to_queues_of_one_session_go_as_one_frame_whose_ranges_the_relay_rewrites():
    """The primary spans a link's columnar pushes of one push group (the
    session below a relay) in one PushColumns frame; the relay names a group
    per session and rewrites each range's id. A frame whose ranges end at
    sessions below different links (a primary that does not group) is split
    by rows; a range of a queue gone meanwhile goes with id 0."""
    from primary.dispatcher import StoredMessage
    from primary.partition import COLUMNAR_RUN_MIN, send_pushes
    from protocol import columns

    relay = Relay()
    ups: dict[tuple[str, int], pb.OpenQueue] = {}
    for link, qid in (("A", 1), ("A", 2), ("B", 1)):
        (_, up), = relay.from_downstream(link, open_frame(qid, qid, read=True, write=False))
        opened(relay, up)
        ups[(link, qid)] = up.open_queue
    assert ups[("A", 1)].push_group == ups[("A", 2)].push_group != ups[("B", 1)].push_group
    a1, a2, b1 = (ups[k].queue_id for k in (("A", 1), ("A", 2), ("B", 1)))

    # The primary's side: pushes of A's two queues (interleaved) and B's, over the relay's one link.
    upstream = FakeLink(columnar={a1, a2, b1}, push_groups={q: ups[k].push_group for k, q in (
        (("A", 1), a1), (("A", 2), a2), (("B", 1), b1))})
    n = COLUMNAR_RUN_MIN
    pushes = [((upstream, a1 if i % 2 else a2), StoredMessage(g(i), 100 + i, b"p%d" % i)) for i in range(n)]
    pushes += [((upstream, b1), StoredMessage(g(50 + i), 200 + i, b"b%d" % i)) for i in range(n)]
    send_pushes(pushes)
    to_a, to_b = (f.push_columns for f in upstream.frames)
    assert list(to_a.range_queue_ids) == [a2, a1] * (n // 2) and to_a.count == n
    assert list(zip(to_a.seq_starts, to_a.seq_counts)) == [(100 + i, 1) for i in range(n)]
    assert not to_b.range_queue_ids and to_b.queue_id == b1 and list(to_b.seq_starts) == [200]

    (dest, down), = relay.from_upstream(pb.Frame(push_columns=to_a))
    assert dest == "A" and list(down.push_columns.range_queue_ids) == [2, 1] * (n // 2)
    assert down.push_columns.queue_id == 2 and down.push_columns.arrow_ipc == to_a.arrow_ipc   # bytes as they came
    assert relay.unconfirmed_count == n

    # Not grouped: A's and B's rows in one frame, split by rows.
    mixed = [((upstream, q), StoredMessage(g(70 + i), 300 + i, b"m%d" % i)) for i, q in enumerate([a1, b1] * n)]
    upstream.frames.clear()
    upstream.push_groups.clear()
    send_pushes(mixed)
    (frame,) = upstream.frames
    out = dict(relay.from_upstream(frame))
    assert set(out) == {"A", "B"} and relay.unconfirmed_count == 3 * n
    for link, qid, first in (("A", 1, 0), ("B", 1, 1)):
        part = out[link].push_columns
        table = columns.decode_push(part.arrow_ipc)
        assert set(part.range_queue_ids) == {qid} and part.count == table.num_rows == n
        assert table["payload"].to_pylist() == [b"m%d" % i for i in range(first, 2 * n, 2)]
        assert list(part.seq_starts) == table["seq"].to_pylist() == [300 + i for i in range(first, 2 * n, 2)]

    # A's queue 2 closed: its ranges go down with id 0, the others as they are.
    relay.from_downstream("A", pb.Frame(close_queue=pb.CloseQueue(request_id=9, queue_id=2)))
    relay._forget_route(a2)
    (dest, down), = relay.from_upstream(pb.Frame(push_columns=to_a))
    assert dest == "A" and list(down.push_columns.range_queue_ids) == [0, 1] * (n // 2)
    assert down.push_columns.queue_id == 1


def test_runs_and_single_pushes_of_one_session_share_frames_in_order_cut_at_the_frame_maximum():
    """A PUT frame's rows to a queue (a MessageRun) join the span of their
    session with single pushes to other queues: one frame, each queue's rows
    in order, its seq ranges merged where they are consecutive; a frame holds
    at most `frame_messages_max` rows, so a run may be cut across two."""
    from primary.dispatcher import StoredMessage
    from primary.partition import push_run, send_pushes
    from protocol import columns

    def run(queue: int, first: int, count: int):
        rows = pa.table({"guid": pa.array([g(first + i) for i in range(count)], pa.binary()),
                         "payload": pa.array([b"r%d" % (first + i) for i in range(count)]),
                         "properties": pa.array([None] * count, columns.PROPERTY_MAP),
                         "property_types": pa.array([None] * count, columns.PROPERTY_MAP),
                         "compression": pa.array([None] * count, pa.string()),
                         "put_time_us": pa.array([7] * count, pa.int64())})
        r = push_run(rows, list(range(first, first + count)))
        r.delivery_count = 1
        return r

    link = FakeLink(columnar={1, 2, 3}, push_groups={1: 4, 2: 4, 3: 4})
    single = StoredMessage(g(30), 30, b"s30", delivery_count=2)
    pushes = [((link, 1), run(1, 0, 6)), ((link, 2), single), ((link, 1), run(1, 6, 3)), ((link, 3), run(3, 40, 5))]
    send_pushes(pushes, frame_messages_max=10)
    first, second = (f.push_columns for f in link.frames)
    assert list(zip(first.range_queue_ids, first.seq_starts, first.seq_counts)) == [(1, 0, 6), (2, 30, 1), (1, 6, 3)]
    assert not second.range_queue_ids and second.queue_id == 3   # one queue: a frame of that queue
    assert (list(second.seq_starts), list(second.seq_counts)) == ([40], [5])
    assert first.count == 10 and second.count == 5   # 6 + 1 + 3 = 10: the last run of queue 3 starts a frame
    table = columns.decode_push(first.arrow_ipc)
    assert table["payload"].to_pylist() == [b"r%d" % i for i in range(6)] + [b"s30"] + [b"r%d" % i for i in (6, 7, 8)]
    assert table["delivery_count"].to_pylist() == [1] * 6 + [2] + [1] * 3
    assert table["put_time_us"].to_pylist()[0] == 7

    link.frames.clear()   # a run cut across two frames
    send_pushes([((link, 1), run(1, 100, 12)), ((link, 2), StoredMessage(g(31), 31, b"s31"))], frame_messages_max=10)
    first, second = (f.push_columns for f in link.frames)
    assert (first.count, list(first.seq_starts), list(first.seq_counts)) == (10, [100], [10])
    assert list(zip(second.range_queue_ids, second.seq_starts, second.seq_counts)) == [(1, 110, 2), (2, 31, 1)]


def test_a_short_run_after_single_pushes_of_its_queue_goes_after_them():
    """Too few pushes for a span (a single and a run of three, cut by a
    consumer's room): the single goes as a PushMessage and the run as a
    frame of its own, in that order."""
    from primary.dispatcher import StoredMessage
    from primary.partition import push_run, send_pushes
    from protocol import columns

    rows = pa.table({"guid": pa.array([g(i) for i in (6, 7, 8)], pa.binary()), "payload": pa.array([b"r"] * 3),
                     "properties": pa.array([None] * 3, columns.PROPERTY_MAP),
                     "property_types": pa.array([None] * 3, columns.PROPERTY_MAP),
                     "compression": pa.array([None] * 3, pa.string())})
    link = FakeLink(columnar={1})
    send_pushes([((link, 1), StoredMessage(g(5), 5, b"s")), ((link, 1), push_run(rows, [6, 7, 8], 1))])
    assert [f.WhichOneof("body") for f in link.frames] == ["push", "push_columns"]
    assert [m.sequence for m in link.frames[0].push.messages] == [5]
    assert list(link.frames[1].push_columns.seq_starts) == [6] and link.frames[1].push_columns.count == 3
