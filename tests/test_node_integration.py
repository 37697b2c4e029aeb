"""A real node and proxy as separate processes on loopback ports, real Delta
tables on a temp dir; no Spark (PUT -> ACK path and bad input)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pyarrow.compute as pc
import pytest

import conf
from protocol import ResultCode, pb
from protocol.auth import metadata as auth_metadata
from protocol.auth import token_from_env
from storage import deltars
from storage.tables import PartitionPaths
from taproot import AckError, InvalidArgumentError, Message, PostError, RefusedError, Session
from taproot.batching import BatchPolicy
from taproot_ops.embedded import EmbeddedCluster
from tests.rawclient import RawSession, send_garbage

pytestmark = pytest.mark.integration
URI = "taproot://demo/it"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The shipped configuration, as `make run` runs it: TLS on every link,
    with a throwaway CA, and token auth. The module's clients find the CA and
    the local token in the environment (`ClientTls.from_env`,
    `protocol.auth.token_from_env`)."""
    with EmbeddedCluster(data_dir=str(tmp_path_factory.mktemp("data")), ephemeral_ports=True,
                         with_pipeline=False) as c:
        assert c.config.tls.enabled and c.config.tls.auto and c.config.auth.enabled and c.config.auth.auto
        env = c.client_env()
        assert set(env) == {"TAPROOT_TLS_CA_FILE", "TAPROOT_TOKEN_FILE"}
        os.environ.update(env)
        try:
            yield c
        finally:
            for name in env:
                del os.environ[name]


def aio_channel(address: str):
    """An asyncio gRPC channel to the module's cluster (TLS)."""
    import grpc

    from protocol.tls import ClientTls
    tls = ClientTls.from_env()
    assert tls is not None
    return grpc.aio.secure_channel(address, tls.credentials())


def committed_guids(cluster) -> set[bytes]:
    table = deltars.try_open(PartitionPaths(cluster.data_dir, 0).puts)
    return set(table.to_pyarrow_table(columns=["guid"])["guid"].to_pylist())


@pytest.mark.parametrize("via", ["proxy", "node"])
def test_every_put_is_acked_after_it_is_in_delta(cluster, via):
    address = cluster.proxy_address if via == "proxy" else cluster.node_address
    with Session([address]) as session, session.open_queue(URI, write=True) as queue:
        futures = [queue.post(f"m{i}".encode(), properties={"i": i}) for i in range(500)]
        acks = [f.result(timeout=30) for f in futures]
    assert [a.guid for a in acks] == [f.guid for f in futures]
    assert {f.guid for f in futures} <= committed_guids(cluster)


def test_bad_queue_uri_and_unknown_domain_get_stable_codes(cluster):
    with Session([cluster.proxy_address]) as session:
        with pytest.raises(InvalidArgumentError):
            session.open_queue("taproot://demo/bad name", write=True)
        with pytest.raises(RefusedError) as exc:
            session.open_queue("taproot://nosuchdomain/q", write=True)
        assert exc.value.code == ResultCode.REFUSED and "unknown domain" in exc.value.message
    raw = RawSession(cluster.proxy_address)
    assert raw.open(1, "not-a-uri").status.code == ResultCode.INVALID_ARGUMENT
    raw.close()


def test_oversized_payload_is_refused_by_sdk_and_by_the_broker(cluster):
    with Session([cluster.proxy_address]) as session, session.open_queue(URI, write=True) as queue:
        limit = queue.max_payload_bytes
        assert limit > 0
        # The same checks with nothing to convert (exact bytes, post()'s
        # inline path) and with something (a bytearray, properties).
        for payload, properties in ((b"x" * (limit + 1), None), (bytearray(limit + 1), None),
                                    (b"x" * (limit + 1), {"k": 1})):
            with pytest.raises(PostError, match=f"payload of {limit + 1} bytes exceeds the domain's "
                                                f"max_payload_bytes {limit}"):
                queue.post(payload, properties)
        reader = session.open_queue(URI, read=True)
        with pytest.raises(PostError, match="is not open for writing"):
            reader.post(b"fine")
        reader.close()
        other = session.open_queue(URI, write=True)
        other.close()
        with pytest.raises(PostError, match="is closed"):
            other.post(b"fine")
        queue._record.max_payload_bytes = 0  # bypass the SDK check: the broker must refuse too
        with pytest.raises(AckError) as exc:
            queue.post(b"x" * (limit + 1)).result(timeout=30)
        assert exc.value.code == ResultCode.INVALID_ARGUMENT
        assert queue.post(b"fine").result(timeout=30)  # the session carries on


def test_malformed_frames_get_errors_and_lose_nothing(cluster):
    with Session([cluster.proxy_address]) as session, session.open_queue(URI, write=True) as queue:
        before = [queue.post(b"before").result(timeout=30).guid for _ in range(20)]
        for address in (cluster.proxy_address, cluster.node_address):
            error = send_garbage(address, b"\xff\xfe not a protobuf frame")
            assert error is not None  # that stream alone is failed by gRPC
            raw = RawSession(address)
            raw.send(pb.Frame())  # empty frame
            assert raw.recv("error").error.status.code == ResultCode.INVALID_ARGUMENT
            raw.send(pb.Frame(push=pb.PushBatch()))  # a server-only frame from a client
            assert raw.recv("error").error.status.code == ResultCode.INVALID_ARGUMENT
            assert raw.open(1, URI).status.code == ResultCode.SUCCESS
            raw.send(pb.Frame(put=pb.PutBatch(messages=[pb.PutMessage(queue_id=1, guid=b"short", payload=b"x"),
                                                         pb.PutMessage(queue_id=9, guid=b"g" * 16, payload=b"x")])))
            acks = list(raw.recv("ack").ack.messages)
            if len(acks) < 2:  # through the proxy, one NACK is the proxy's and one the node's
                acks += raw.recv("ack").ack.messages
            assert sorted(a.guid for a in acks) == [b"g" * 16, b"short"]
            assert [a.code for a in acks] == [ResultCode.INVALID_ARGUMENT] * 2
            raw.close()
        after = [queue.post(b"after").result(timeout=30).guid for _ in range(20)]
    assert set(before + after) <= committed_guids(cluster)


def test_retransmitted_put_is_acked_twice(cluster):
    raw = RawSession(cluster.proxy_address)
    assert raw.open(1, URI).status.code == ResultCode.SUCCESS
    guid = b"R" * 16
    for _ in range(2):
        raw.send(pb.Frame(put=pb.PutBatch(messages=[pb.PutMessage(queue_id=1, guid=guid, payload=b"again")])))
        ack = raw.recv("ack").ack.messages[0]
        assert ack.guid == guid and ack.code == ResultCode.SUCCESS
    raw.close()
    table = deltars.try_open(PartitionPaths(cluster.data_dir, 0).puts).to_pyarrow_table(columns=["guid"])
    assert pc.sum(pc.equal(table["guid"], guid)).as_py() == 2  # both in the raw log; the pipeline dedups


@pytest.mark.parametrize("via", ["proxy", "node"])
def test_columnar_puts_are_acked_as_a_whole_after_they_are_in_delta(cluster, via):
    import pyarrow as pa

    address = cluster.proxy_address if via == "proxy" else cluster.node_address
    with Session([address]) as session, session.open_queue(URI, write=True) as queue:
        good = pa.table({"payload": pa.array([b"c%d" % i for i in range(1000)], pa.binary())})
        guids = queue.post_columns(good).result(timeout=30)
        assert len(guids) == 1000 and len(set(guids)) == 1000
        assert set(guids) <= committed_guids(cluster)
        bad = pa.table({"payload": pa.array([b"ok", b"x" * (4 * 1024 * 1024 + 1)], pa.binary())})
        with pytest.raises(AckError) as info:
            queue.post_columns(bad).result(timeout=30)
        assert info.value.code == ResultCode.INVALID_ARGUMENT and "max_payload_bytes" in info.value.message
        assert info.value.guid not in committed_guids(cluster)  # refused as a whole


def test_a_bulk_producer_waits_for_room_and_a_batch_consumer_takes_lots(cluster):
    """post_columns blocks while the retransmission buffer is full (flow
    control, as post() does) instead of refusing; get_batch hands over what
    has arrived, up to its maximum, and one confirm takes the lot."""
    import pyarrow as pa

    uri = "taproot://demo/bulk-batch"
    with Session([cluster.proxy_address], max_pending_puts=2_500) as session, \
            session.open_queue(uri, read=True, max_unconfirmed_messages=5_000) as consumer, \
            session.open_queue(uri, write=True) as producer:
        frame = pa.table({"payload": pa.array([b"m%d" % i for i in range(1000)], pa.binary())})
        futures = [producer.post_columns(frame) for _ in range(8)]   # 8,000 rows through a 2,500 buffer
        guids = [g for f in futures for g in f.result(timeout=60)]
        assert len(set(guids)) == 8_000
        got: list = []
        sizes = []
        while len(got) < 8_000:
            batch = consumer.get_batch(max_messages=3_000, timeout_s=30)
            assert batch, f"only {len(got)} of 8,000 arrived"
            sizes.append(len(batch))
            got.extend(batch)
            consumer.confirm(batch)
        assert max(sizes) <= 3_000 and [m.guid for m in got] == guids   # push order is PUT order
        assert consumer.get_batch(timeout_s=0.2) == []


def test_a_producer_waiting_for_room_does_not_wait_out_its_own_linger(cluster):
    """With a window of one PUT, a post waits for the previous PUT's ACK; that
    PUT is batched, and nothing can join its batch while the producer waits,
    so it goes out at once: ten PUTs under a 10-second linger take well under
    one linger, not ten."""
    policy = BatchPolicy(linger_ms=10_000)
    started = time.monotonic()
    with Session([cluster.proxy_address], batch=policy, max_pending_puts=1) as session, \
            session.open_queue("taproot://demo/window-one", write=True) as queue:
        futures = [queue.post(b"m%d" % i) for i in range(10)]
        assert all(f.result(timeout=30) for f in futures[:-1])   # answered while the posts went on
    assert time.monotonic() - started < 8.0


def test_a_column_consumer_takes_arrow_batches_and_confirms_them_as_seq_ranges(cluster):
    """get_columns hands PUSH frames over as Arrow tables, cut at its
    maximum and mixed in order with get(); batch.confirm() confirms by seq
    ranges through the proxy: what it confirmed never comes again, what it
    did not comes again to the next consumer, flagged as redelivered."""
    import pyarrow as pa

    from taproot.message import BATCH_SCHEMA

    uri = "taproot://demo/columns-consumer"
    payloads = [b"c%05d" % i + b"z" * 2000 for i in range(3_000)]
    with Session([cluster.proxy_address]) as session:
        with session.open_queue(uri, write=True) as producer:
            for start in range(0, 3_000, 1_000):
                frame = pa.table({"payload": pa.array(payloads[start:start + 1_000], pa.binary())})
                producer.post_columns(frame, compression="zlib").result(timeout=60)
            single = producer.post(b"one by one", properties={"n": 7}).result(timeout=30)
        with session.open_queue(uri, read=True, max_unconfirmed_messages=10_000) as consumer:
            first = consumer.get(timeout_s=30)
            assert first is not None and first.payload == payloads[0]
            got = [first.payload]
            batches = []
            while len(got) < 3_001:
                batch = consumer.get_columns(max_messages=1_500, timeout_s=30)
                assert batch is not None, f"only {len(got)} of 3,001 arrived"
                assert batch.table.schema == BATCH_SCHEMA and len(batch) <= 1_500
                got.extend(batch.table["payload"].to_pylist())
                batches.append(batch)
            assert got == payloads + [b"one by one"]   # push order is PUT order, payloads decompressed
            last = batches[-1].table.slice(len(batches[-1]) - 1).to_pylist()[0]
            assert last["guid"] == single.guid and last["properties"] == [("n", "7")]
            assert last["property_types"] == [("n", "int32")] and last["delivery_count"] == 1
            first.confirm()
            at = 1
            for batch in batches:   # all but the last ten messages, by rows of each batch
                batch.confirm([row for row in range(len(batch)) if at + row < len(got) - 10])
                at += len(batch)
        with session.open_queue(uri, read=True) as again:
            back = []
            while len(back) < 10:
                batch = again.get_columns(timeout_s=30)
                assert batch is not None, f"{len(back)} of 10 came again"
                assert set(batch.table["delivery_count"].to_pylist()) == {2}
                back.extend(batch.table["payload"].to_pylist())
                batch.confirm()
            assert back == got[-10:]
            assert again.get_columns(timeout_s=0.5) is None


def test_confirms_of_many_queues_travel_as_one_frame_through_the_proxy(cluster, monkeypatch):
    """A session consuming several queues sends their CONFIRMs as one frame
    whose ranges name their queues; the proxy and the node take each range
    for its queue: what was confirmed never comes again, what was not comes
    again to the next consumer of that queue."""
    import taproot.core

    sent: list[pb.ConfirmColumns] = []
    real = taproot.core.confirm_frames

    def spy(*args: object, **kwargs: object) -> list[pb.Frame]:
        frames = real(*args, **kwargs)
        sent.extend(f.confirm_columns for f in frames)
        return frames

    monkeypatch.setattr(taproot.core, "confirm_frames", spy)
    uris = [f"taproot://demo/multi-confirm-{i}" for i in range(3)]
    with Session([cluster.proxy_address], batch=BatchPolicy(linger_ms=200, max_messages=1000)) as session:
        for uri in uris:
            with session.open_queue(uri, write=True) as producer:
                for n in range(4):
                    producer.post(b"%s/%d" % (uri.encode(), n)).result(timeout=30)
        consumers = [session.open_queue(uri, read=True) for uri in uris]
        kept = {}
        for uri, consumer in zip(uris, consumers):
            got = [consumer.get(timeout_s=30) for _ in range(4)]
            assert [m.payload for m in got if m] == [b"%s/%d" % (uri.encode(), n) for n in range(4)]
            for m in got[:3]:
                consumer.confirm(m)
            kept[uri] = got[3].payload
        consumers[0].flush()   # every queue's CONFIRMs: they are the session's
        deadline = time.monotonic() + 10
        while not any(len(set(f.queue_ids)) == 3 for f in sent) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any(len(set(f.queue_ids)) == 3 for f in sent), sent
        time.sleep(0.5)   # the confirm frame reaches the node before the consumers go
        for consumer in consumers:
            consumer.close()
    with Session([cluster.proxy_address]) as session:
        for uri in uris:
            with session.open_queue(uri, read=True) as again:
                message = again.get(timeout_s=30)
                assert message is not None and message.payload == kept[uri] and message.delivery_count == 2
                again.confirm(message)
                assert again.get(timeout_s=0.5) is None


def test_pushes_to_many_queues_of_a_session_come_as_frames_spanning_them_and_to_no_other_session(cluster):
    """A few single PUTs to each of 12 queues (one frame, one commit), read
    through the proxy by two sessions of six queues each: each session's
    PUSHes come as a PushColumns frame whose seq ranges name its queues (the
    node groups them by the session they end at, `push_group`; the proxy
    rewrites the ids and forwards the bytes), never a queue of the other
    session. Then SDK consumers, by `get` and by callback: each queue gets
    its messages, in order."""
    from protocol import columns

    def uris(tag: str) -> list[str]:
        return [f"taproot://demo/span-{tag}-{i}" for i in range(12)]

    def produce(names: list[str]) -> None:
        with Session([cluster.proxy_address], batch=BatchPolicy(linger_ms=100)) as session:
            queues = [session.open_queue(u, write=True) for u in names]
            futures = [q.post(b"%s/%d" % (u.encode(), n)) for n in range(3) for u, q in zip(names, queues)]
            for f in futures:
                f.result(timeout=30)

    names = uris("raw")
    raws = [RawSession(cluster.proxy_address) for _ in range(2)]
    of_queue: dict[tuple[int, int], str] = {}
    for s, raw in enumerate(raws):
        for n, u in enumerate(names[s * 6:(s + 1) * 6], start=1):
            raw.send(pb.Frame(open_queue=pb.OpenQueue(request_id=n, queue_id=n, uri=u, read=True,
                                                      columnar_push=True)))
            assert raw.recv("open_queue_response").open_queue_response.status.code == ResultCode.SUCCESS
            of_queue[(s, n)] = u
    produce(names)
    for s, raw in enumerate(raws):
        got: dict[str, list[bytes]] = {}
        spanning = 0
        while sum(map(len, got.values())) < 18:
            push = raw.recv("push_columns", timeout_s=30).push_columns
            table = columns.decode_push(push.arrow_ipc)
            assert not isinstance(table, str)
            ids = list(push.range_queue_ids) or [push.queue_id] * len(push.seq_counts)
            spanning += len(set(ids)) > 1
            payloads, seqs, row = table["payload"].to_pylist(), table["seq"].to_pylist(), 0
            for queue_id, start, count in zip(ids, push.seq_starts, push.seq_counts):
                assert (s, queue_id) in of_queue, (s, queue_id)   # only this session's queues
                assert seqs[row:row + count] == list(range(start, start + count))
                got.setdefault(of_queue[(s, queue_id)], []).extend(payloads[row:row + count])
                row += count
            assert row == table.num_rows == push.count
        assert got == {u: [b"%s/%d" % (u.encode(), n) for n in range(3)] for u in names[s * 6:(s + 1) * 6]}
        assert spanning >= 1
        raw.close()

    names = uris("sdk")
    with Session([cluster.proxy_address]) as one, Session([cluster.proxy_address]) as two:
        consumers = [(one if i < 6 else two).open_queue(u, read=True) for i, u in enumerate(names)]
        produce(names)
        for u, consumer in zip(names, consumers):
            got = [consumer.get(timeout_s=30) for _ in range(3)]
            assert [m.payload if m else None for m in got] == [b"%s/%d" % (u.encode(), n) for n in range(3)]
            assert all(m.queue_uri == u for m in got if m)
            for m in got:
                if m:
                    consumer.confirm(m)
            assert consumer.get(timeout_s=0.2) is None

    # Callback consumers: each queue's callback gets its own rows of the
    # spanning frames (listed once a frame), in order, with their properties.
    names = uris("cb")
    got_cb: dict[str, list[tuple[bytes, int, dict[str, object]]]] = {u: [] for u in names}
    done = threading.Event()

    def on_message(message: Message) -> None:
        got_cb[message.queue_uri].append((message.payload, message.sequence, dict(message.properties)))
        message.confirm()
        if sum(map(len, got_cb.values())) == 36:
            done.set()

    with Session([cluster.proxy_address]) as one, Session([cluster.proxy_address]) as two:
        for i, u in enumerate(names):
            (one if i < 6 else two).open_queue(u, read=True, on_message=on_message)
        with Session([cluster.proxy_address], batch=BatchPolicy(linger_ms=100)) as session:
            queues = [session.open_queue(u, write=True) for u in names]
            futures = [q.post(b"%s/%d" % (u.encode(), n), properties={"n": n})
                       for n in range(3) for u, q in zip(names, queues)]
            for f in futures:
                f.result(timeout=30)
        assert done.wait(30)
    for u in names:
        assert [(p, props) for p, _, props in got_cb[u]] == [(b"%s/%d" % (u.encode(), n), {"n": n}) for n in range(3)]
        seqs = [seq for _, seq, _ in got_cb[u]]
        assert seqs == sorted(seqs) and len(set(seqs)) == 3


def test_a_put_frame_whose_header_names_other_guids_is_refused_by_the_header(cluster):
    """Relays trust a PUT frame's header; the primary checks it against the
    rows and refuses the frame, answering with the header's GUIDs (what the
    relays and the producer hold it by)."""
    import pyarrow as pa

    from protocol import columns

    raw = RawSession(cluster.proxy_address)
    assert raw.open(1, "taproot://demo/header").status.code == ResultCode.SUCCESS
    rows = pa.table({"guid": columns.fixed_width_binary(b"\x01" * 32, 16), "payload": [b"a", b"b"],
                     "properties": pa.array([[], []], columns.PROPERTY_MAP),
                     "property_types": pa.array([[], []], columns.PROPERTY_MAP),
                     "compression": pa.nulls(2, pa.string())})
    header = b"\x02" * 32
    raw.send(pb.Frame(put_columns=pb.PutColumns(queue_id=1, arrow_ipc=columns.encode(rows), guids=header)))
    ack = raw.recv("ack_columns").ack_columns
    assert ack.code == ResultCode.INVALID_ARGUMENT and ack.guids == header and "header" in ack.message
    raw.close()
    assert not committed_guids(cluster) & {b"\x01" * 16, b"\x02" * 16}


def test_columnar_pushes_carry_properties_compression_and_order(cluster):
    """A run of pushes to one consumer travels as one Arrow frame (the SDK asks
    for it): every field arrives as posted, through the proxy and directly."""
    uri = "taproot://demo/columnar-push"
    payload = b"z" * 4096
    with Session([cluster.proxy_address]) as session, \
            session.open_queue(uri, write=True) as producer:
        futures = [producer.post(payload + b"%d" % i, properties={"i": i, "s": f"v{i}", "b": i % 2 == 0,
                                                                  "raw": bytes([i])},
                                 compression="zstd" if i % 3 else None) for i in range(64)]
        guids = [f.result(timeout=30).guid for f in futures]
    for address in (cluster.proxy_address, cluster.node_address):
        with Session([address]) as session, session.open_queue(uri, read=True) as consumer:
            got = []
            while len(got) < 64:
                batch = consumer.get_batch(100, timeout_s=30)
                assert batch
                got.extend(batch)
            assert [m.guid for m in got] == guids
            for i, m in enumerate(got):
                assert m.payload == payload + b"%d" % i
                assert m.properties == {"i": i, "s": f"v{i}", "b": i % 2 == 0, "raw": bytes([i])}
                assert m.compression == ("zstd" if i % 3 else None) and m.put_time_us > 0
            assert [m.sequence for m in got] == sorted({m.sequence for m in got})   # distinct, in PUT order
            if address == cluster.node_address:
                consumer.confirm(got)   # the proxy's consumer left without confirming: redelivered here
                assert all(m.delivery_count == 2 for m in got)


def test_a_put_with_a_timestamp_no_table_reader_can_hold_is_refused_and_the_queue_carries_on(cluster):
    """put_time_us = 10**16 (year 2286) was once ACKed, stored, and after a
    restart kept its partition from recovering: now it is refused at once."""
    for address in (cluster.proxy_address, cluster.node_address):
        raw = RawSession(address)
        assert raw.open(1, URI).status.code == ResultCode.SUCCESS
        raw.send(pb.Frame(put=pb.PutBatch(messages=[
            pb.PutMessage(queue_id=1, guid=b"t" * 16, payload=b"x", put_time_us=10**16),
            pb.PutMessage(queue_id=1, guid=b"u" * 16, payload=b"x", put_time_us=1_795_000_000_000_000)])))
        acks = {a.guid: a for a in raw.recv("ack").ack.messages}
        while len(acks) < 2:
            acks.update({a.guid: a for a in raw.recv("ack").ack.messages})
        assert acks[b"t" * 16].code == ResultCode.INVALID_ARGUMENT and "put_time_us" in acks[b"t" * 16].message
        assert acks[b"u" * 16].code == ResultCode.SUCCESS
        raw.close()
    assert b"t" * 16 not in committed_guids(cluster) and b"u" * 16 in committed_guids(cluster)


def test_one_guid_twice_in_a_batch_gets_an_ack_for_each_put_through_a_proxy_as_from_the_node(cluster):
    """Issue 16, defect 9: a node answered both PUTs, a proxy only one (its
    buffer kept one entry per GUID). Both now answer each PUT, and the
    message is stored and delivered once (the second is a duplicate)."""
    for n, address in enumerate((cluster.proxy_address, cluster.node_address)):
        guid = bytes([0xD0 + n]) * 16
        raw = RawSession(address)
        assert raw.open(1, URI).status.code == ResultCode.SUCCESS
        raw.send(pb.Frame(put=pb.PutBatch(messages=[pb.PutMessage(queue_id=1, guid=guid, payload=b"x"),
                                                    pb.PutMessage(queue_id=1, guid=guid, payload=b"x")])))
        acks = list(raw.recv("ack").ack.messages)
        while len(acks) < 2:
            acks += raw.recv("ack").ack.messages
        assert [(a.guid, a.code) for a in acks] == [(guid, ResultCode.SUCCESS)] * 2, address
        raw.close()
        rows = deltars.try_open(PartitionPaths(cluster.data_dir, 0).puts).to_pyarrow_table(columns=["guid"])
        assert rows["guid"].to_pylist().count(guid) == 2   # both in the log; the second is pushed to nobody


def test_a_relay_that_fails_on_an_upstream_frame_reconnects_and_loses_nothing(cluster):
    """Issue 16, defect 7: the proxy's forwarding thread caught only gRPC
    errors, so any other exception ended forwarding for good while clients
    stayed connected. Now the failure costs a reconnection: the buffered PUT
    is resent and ACKed once."""
    import queue as _queue

    from protocol.stream import Link
    from proxies.server import Proxy

    proxy = Proxy([cluster.node_address], tls=cluster.client_tls, token=cluster.cluster_token)
    proxy.start(connect_timeout_s=10)
    original = proxy.relay.from_upstream
    failures = [1]

    def flaky(frame, now_ms=None):
        if frame.WhichOneof("body") == "ack" and failures:
            failures.pop()
            raise RuntimeError("seeded relay bug")
        return original(frame, now_ms)

    proxy.relay.from_upstream = flaky  # type: ignore[method-assign]
    link = Link("client")
    proxy.open_link(link)
    try:
        proxy.on_frame(link, pb.Frame(open_queue=pb.OpenQueue(request_id=1, queue_id=1, uri=URI, write=True)))
        assert link.next_frame(10).open_queue_response.status.code == ResultCode.SUCCESS
        guid = b"r" * 16
        proxy.on_frame(link, pb.Frame(put=pb.PutBatch(messages=[pb.PutMessage(queue_id=1, guid=guid, payload=b"x")])))
        acks = []
        deadline = time.monotonic() + 20
        while not acks and time.monotonic() < deadline:
            try:
                frame = link.next_frame(0.2)
            except _queue.Empty:
                continue
            acks.extend(a for a in frame.ack.messages if frame.WhichOneof("body") == "ack")
        assert [(a.guid, a.code) for a in acks] == [(guid, ResultCode.SUCCESS)]
        assert proxy.connects >= 2 and not failures
    finally:
        proxy.stop()


def test_a_node_and_a_proxy_each_serve_two_thousand_sessions_at_once(cluster):
    """Issue 16, defect 5: each session held a thread of a 256-thread pool,
    and the 257th hung without an error. Now 2,000 streams stay open on each
    server at once, every one answered while all are open, and a client is
    still served. (The streams are opened one after another: opening
    thousands in one burst from one client event loop has gRPC's client
    cancel some of them, against any server.)"""
    import asyncio


    sessions, per_connection = 2_000, 100

    async def hold_many(address: str) -> list[int]:
        channels = [aio_channel(address) for _ in range(sessions // per_connection)]
        try:
            calls = [c.stream_stream("/taproot.v1.Broker/Session", request_serializer=pb.Frame.SerializeToString,
                                     response_deserializer=pb.Frame.FromString) for c in channels]
            streams = []
            for i in range(sessions):
                stream = calls[i // per_connection]()
                await stream.write(pb.Frame())   # an empty frame: the server answers INVALID_ARGUMENT
                await asyncio.wait_for(stream.read(), 10)
                streams.append(stream)
            for stream in streams:               # every one still served, all open at once
                await stream.write(pb.Frame())
            answers = await asyncio.wait_for(asyncio.gather(*(s.read() for s in streams)), 60)
            for stream in streams:
                stream.cancel()
            return [a.error.status.code for a in answers]
        finally:
            for channel in channels:
                await channel.close()

    for address in (cluster.proxy_address, cluster.node_address):
        codes = asyncio.run(hold_many(address))
        assert codes == [ResultCode.INVALID_ARGUMENT] * sessions, address
        with Session([address]) as session, session.open_queue(URI, write=True) as queue:
            assert queue.post(b"after 2,000 sessions").result(timeout=30).guid in committed_guids(cluster)


def test_a_consumer_that_stops_reading_is_dropped_and_its_messages_go_to_another(cluster, tmp_path, caplog):
    """Issue 16, defect 6: what a server queued for a peer that does not read
    grew without bound. A proxy with a 2 MiB bound per link drops the stalled
    consumer's stream; its unconfirmed messages go to the next consumer, and
    the proxy carries on."""
    import asyncio
    import json
    import threading

    import grpc
    import pyarrow as pa

    from proxies.server import serve
    from tests.conftest import wait_until

    stop = threading.Event()
    ready = tmp_path / "proxy.ready"
    server = threading.Thread(target=serve, args=("127.0.0.1", 0, [cluster.node_address]), daemon=True,
                              kwargs=dict(ready_file=str(ready), stop_event=stop, max_outbound_bytes=2 << 20,
                                          upstream_tls=cluster.client_tls,
                                          tls=conf.server_tls(cluster._config_for_roles),
                                          auth=conf.authenticator(cluster._config_for_roles),
                                          upstream_token=cluster.cluster_token))
    server.start()
    wait_until(ready.exists, 30, what="the test proxy")
    proxy = f"127.0.0.1:{json.loads(ready.read_text())['port']}"
    uri, count = "taproot://demo/stalled", 20_000

    async def stalled_consumer(opened: threading.Event, checked: threading.Event) -> object:
        async with aio_channel(proxy) as channel:
            stream = channel.stream_stream("/taproot.v1.Broker/Session", request_serializer=pb.Frame.SerializeToString,
                                           response_deserializer=pb.Frame.FromString)(
                metadata=auth_metadata(token_from_env()))
            await stream.write(pb.Frame(open_queue=pb.OpenQueue(
                request_id=1, queue_id=1, uri=uri, read=True,
                options=pb.QueueOptions(max_unconfirmed_messages=count, max_unconfirmed_bytes=1 << 30))))
            assert (await stream.read()).open_queue_response.status.code == ResultCode.SUCCESS
            opened.set()
            # Reads nothing until the other consumer has everything; then what
            # was in flight, and the end the proxy gave the stream.
            await asyncio.get_running_loop().run_in_executor(None, checked.wait, 120)
            try:
                while await asyncio.wait_for(stream.read(), 10) is not grpc.aio.EOF:
                    pass
            except grpc.aio.AioRpcError as exc:
                return exc.code()
            return await asyncio.wait_for(stream.code(), 10)

    opened, checked = threading.Event(), threading.Event()
    result: list[object] = []

    def run_consumer() -> None:
        try:
            result.append(asyncio.run(stalled_consumer(opened, checked)))
        except BaseException as exc:  # reported by the assertion below
            result.append(exc)

    consumer = threading.Thread(target=run_consumer)
    consumer.start()
    try:
        assert opened.wait(30)
        with Session([cluster.node_address]) as session, session.open_queue(uri, write=True) as queue:
            for start in range(0, count, 1_000):
                queue.post_columns(pa.table({"payload": [b"%07d" % i + b"x" * 1017
                                                         for i in range(start, start + 1_000)]})).result(timeout=60)
        wait_until(lambda: "dropped: slow peer" in caplog.text, 60, what="the proxy to drop the stalled stream")
        got: set[bytes] = set()
        with Session([proxy]) as session, session.open_queue(uri, read=True) as queue:
            while len(got) < count:
                batch = queue.get_batch(timeout_s=30)
                assert batch, f"{len(got)} of {count} delivered"
                got.update(m.payload[:7] for m in batch)
                queue.confirm(batch)
        assert got == {b"%07d" % i for i in range(count)}
        checked.set()
        consumer.join(60)
        assert result == [grpc.StatusCode.RESOURCE_EXHAUSTED]   # told why, once it read again
    finally:
        checked.set()
        stop.set()
        server.join(30)


def test_every_serving_role_tunes_its_malloc(cluster):
    """Each node and proxy process tunes its C allocator when it starts serving
    (`protocol.malloc_tuning`) and says so in its log."""
    import platform

    logs = sorted((Path(cluster.data_dir) / "logs").glob("*.log"))
    serving = [log for log in logs if "serving on" in log.read_text(errors="replace")]
    assert len(serving) >= 2                            # the node and the proxy
    expected = ("malloc: blocks up to 32 MiB from the heap" if platform.libc_ver()[0] == "glibc"
                else "malloc left as it is")
    for log in serving:
        assert expected in log.read_text(errors="replace"), log.name


def test_no_log_line_holds_the_clusters_tokens(cluster):
    """Last in the module: the shipped configuration's tokens (the local one
    every client here presented, the cluster's own) in no role's log."""
    from tests.test_auth import role_logs

    text = role_logs(cluster)
    assert "serving on" in text
    for secret in (cluster.client_token, cluster.cluster_token):
        assert secret and secret.startswith("tpk_") and secret not in text
