from protocol import ResultCode, pb
from replicas.relay import UPSTREAM, Relay


def open_frame(qid, req, read=False, write=True):
    return pb.Frame(open_queue=pb.OpenQueue(request_id=req, queue_id=qid, uri="taproot://d/q", read=read,
                                            write=write))


def test_relay_maps_queue_ids_both_ways_and_answers_inflight_puts_when_upstream_is_lost():
    relay = Relay()
    # Two clients use the same downstream queue id 1: upstream ids must differ.
    (dest_a, up_a), = relay.from_downstream("A", open_frame(1, 10))
    (dest_b, up_b), = relay.from_downstream("B", open_frame(1, 10, read=True))
    assert dest_a == dest_b == UPSTREAM
    qa, qb = up_a.open_queue.queue_id, up_b.open_queue.queue_id
    assert qa != qb
    (to, resp), = relay.from_upstream(pb.Frame(open_queue_response=pb.OpenQueueResponse(
        request_id=up_a.open_queue.request_id, queue_id=qa, status=pb.Status(code=0))))
    assert to == "A" and resp.open_queue_response.request_id == 10 and resp.open_queue_response.queue_id == 1

    put = pb.Frame(put=pb.PutBatch(messages=[pb.PutMessage(queue_id=1, guid=b"g" * 16, payload=b"p"),
                                             pb.PutMessage(queue_id=7, guid=b"h" * 16, payload=b"p")]))
    out = relay.from_downstream("A", put)
    upstream = [f for d, f in out if d == UPSTREAM]
    nacks = [f for d, f in out if d == "A"]
    assert [m.queue_id for m in upstream[0].put.messages] == [qa]
    assert nacks[0].ack.messages[0].code == ResultCode.INVALID_ARGUMENT  # queue 7 never opened
    assert relay.unacked_count == 1

    push = pb.Frame(push=pb.PushBatch(messages=[pb.PushMessage(queue_id=qb, guid=b"x" * 16)]))
    (to, frame), = relay.from_upstream(push)
    assert to == "B" and frame.push.messages[0].queue_id == 1

    relay.from_downstream("A", put)  # another PUT in flight
    (to, lost), = relay.upstream_lost("upstream gone")
    assert to == "A"
    assert {m.code for m in lost.ack.messages} == {ResultCode.UNKNOWN}
    assert relay.unacked_count == 0


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
