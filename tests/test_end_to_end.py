"""The whole tree: node, proxy and the Spark pipeline as separate processes,
real Delta tables. Checks with chispa what Spark sees in the delivery log."""

from __future__ import annotations

import threading

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F

from protocol import ResultCode, pb
from storage.tables import PartitionPaths
from taproot_ops import loadgen
from tests.conftest import collect, wait_until
from tests.rawclient import RawSession

pytestmark = [pytest.mark.integration, pytest.mark.spark]
MESSAGES = 10_000


def delivery(spark, cluster):
    return spark.read.format("delta").load(PartitionPaths(cluster.data_dir, 0).delivery)


def test_10k_messages_through_the_proxy_are_delivered_once_in_put_order(cluster, spark):
    uri = "taproot://demo/e2e"
    ready = threading.Event()
    consumed: dict[str, loadgen.ConsumeResult] = {}
    consumer = threading.Thread(target=lambda: consumed.setdefault("r", loadgen.consume(
        cluster.proxy_address, uri, MESSAGES, idle_timeout_s=240, ready=ready)))
    consumer.start()
    assert ready.wait(30)
    produced = loadgen.produce(cluster.proxy_address, uri, MESSAGES, size=256)
    assert (produced.acked, produced.failed) == (MESSAGES, 0), produced.errors
    consumer.join(600)
    received = consumed["r"]
    assert received.received == MESSAGES
    assert received.guids == produced.guids  # pushed once each, in PUT order
    assert received.redelivered == 0

    # The express lane pushed them before the pipeline decided: wait for the authority's rows.
    wait_until(lambda: delivery(spark, cluster).filter(F.col("queue") == "e2e").count() >= MESSAGES, 300,
               interval_s=1, what="the pipeline's delivery rows")
    actual = (delivery(spark, cluster).filter(F.col("queue") == "e2e").orderBy("seq").select("guid"))
    expected = spark.createDataFrame([(g,) for g in produced.guids], "guid binary")
    assert_df_equality(actual, expected, ignore_nullable=True)


def test_retransmitted_put_is_acked_twice_and_delivered_once(cluster, spark):
    uri = "taproot://demo/retransmit"
    guid = b"\x07" * 16
    producer = RawSession(cluster.proxy_address)
    assert producer.open(1, uri).status.code == ResultCode.SUCCESS
    for _ in range(2):
        producer.send(pb.Frame(put=pb.PutBatch(messages=[pb.PutMessage(queue_id=1, guid=guid, payload=b"once")])))
        ack = producer.recv("ack", timeout_s=30).ack.messages[0]
        assert (ack.guid, ack.code) == (guid, ResultCode.SUCCESS)
    # A marker PUT after the duplicate: once it is delivered, the duplicate had its chance.
    producer.send(pb.Frame(put=pb.PutBatch(messages=[pb.PutMessage(queue_id=1, guid=b"\x08" * 16, payload=b"end")])))
    assert producer.recv("ack", timeout_s=30).ack.messages[0].code == ResultCode.SUCCESS

    consumer = RawSession(cluster.proxy_address)
    assert consumer.open(1, uri, read=True, write=False).status.code == ResultCode.SUCCESS
    pushed = []
    wait_until(lambda: pushed.extend(consumer.recv("push", timeout_s=120).push.messages) or
               any(m.guid == b"\x08" * 16 for m in pushed), 180, what="the marker message")
    assert [m.guid for m in pushed] == [guid, b"\x08" * 16]
    # The pipeline, the authority, keeps it once too (once its batch with the marker is written).
    wait_until(lambda: delivery(spark, cluster).filter(F.col("guid") == F.lit(b"\x08" * 16)).count(), 120,
               interval_s=0.5, what="the marker's delivery row")
    rows = delivery(spark, cluster).filter(F.col("guid") == F.lit(guid)).count()
    assert rows == 1
    producer.close()
    consumer.close()


def test_node_restart_redelivers_unconfirmed_and_not_confirmed_messages(cluster, spark):
    """Nothing ACKed is lost across a primary restart: what was confirmed stays
    confirmed, everything else is delivered again (rebuilt from Delta)."""
    from storage import deltars
    from taproot import Session

    uri = "taproot://demo/restart"
    with Session([cluster.proxy_address]) as session:
        with session.open_queue(uri, write=True) as producer:
            guids = [producer.post(f"m{i}".encode()).result(timeout=60).guid for i in range(100)]
        with session.open_queue(uri, read=True) as consumer:
            received = []
            wait_until(lambda: received.extend(consumer.messages(timeout_s=1)) or len(received) >= 100, 180,
                       what="the first delivery of 100 messages")
            assert [m.guid for m in received] == guids
            consumer.confirm(received[:40])
            consumer.flush()
            confirms = PartitionPaths(cluster.data_dir, 0).confirms

            def confirmed_count():
                table = deltars.try_open(confirms).to_pyarrow_table(columns=["guid"])
                return len(set(table["guid"].to_pylist()) & set(guids[:40])) == 40
            wait_until(confirmed_count, 30, what="the 40 confirms in the confirm table")

    cluster.restart_node()
    wait_until(lambda: _reopens(cluster.proxy_address, uri), 60, what="the proxy reconnecting upstream")
    with Session([cluster.proxy_address]) as session, session.open_queue(uri, read=True) as consumer:
        again = []
        wait_until(lambda: again.extend(consumer.messages(timeout_s=1)) or len(again) >= 60, 120,
                   what="the 60 unconfirmed messages")
        assert [m.guid for m in again] == guids[40:]
        consumer.confirm(again)
        assert list(consumer.messages(timeout_s=2)) == []  # nothing confirmed comes back


def _reopens(address: str, uri: str) -> bool:
    from taproot import Session, TaprootError
    try:
        with Session([address], connect_timeout_s=2) as session, session.open_queue(uri, write=True, timeout_s=5):
            return True
    except TaprootError:
        return False


@pytest.mark.parametrize("via", ["proxy", "node"])
def test_consumer_that_vanishes_has_its_messages_redelivered(cluster, via):
    """At-least-once: a consumer that disconnects without confirming loses
    nothing; another consumer gets those messages, flagged as redelivered."""
    from taproot import Session

    address = cluster.proxy_address if via == "proxy" else cluster.node_address
    uri = f"taproot://demo/vanish-{via}"
    with Session([address]) as session, session.open_queue(uri, write=True) as producer:
        futures = [producer.post(b"x") for _ in range(20)]
        guids = [f.result(timeout=60).guid for f in futures]
    doomed = RawSession(address)
    assert doomed.open(1, uri, read=True, write=False).status.code == ResultCode.SUCCESS
    held = []
    wait_until(lambda: held.extend(doomed.recv("push", timeout_s=120).push.messages) or len(held) >= 20, 180,
               what="the first consumer to hold all 20")
    doomed.channel.close()  # gone without a CONFIRM or a CloseQueue

    with Session([address]) as session, session.open_queue(uri, read=True) as consumer:
        again = []
        wait_until(lambda: again.extend(consumer.messages(timeout_s=1)) or len(again) >= 20, 60,
                   what="redelivery to the second consumer")
        assert [m.guid for m in again] == guids
        assert all(m.redelivered and m.delivery_count == 2 for m in again)
        consumer.confirm(again)


def test_mirrored_puts_over_the_proxy_and_the_node_are_delivered_once_in_put_order(cluster, spark):
    """RAIS's mirroring: each PUT goes over two paths (the proxy, and the node
    directly) with one GUID. The primary commits both copies and the GUID
    history keeps the second from being pushed. Spark's dedup may keep
    either copy of a pair that lands in one micro-batch: the primary takes
    its choice as agreement (the same message, to the same apps) and pushes
    nothing again once the pipeline has judged them."""
    from pyspark.sql import functions as F

    from taproot import MirroredSession, Session

    uri = "taproot://demo/mirrored"
    count = 2_000
    with Session([cluster.proxy_address]) as consumer_session, \
            consumer_session.open_queue(uri, read=True) as consumer:
        with MirroredSession([[cluster.proxy_address], [cluster.node_address]]) as mirrored:
            producer = mirrored.open_queue(uri, write=True)
            wait_until(lambda: len(producer._legs) == 2, 30, what="the queue open on both paths")
            futures = [producer.post(b"%06d" % i) for i in range(count)]
            producer.flush()
            acks = [f.result(timeout=60) for f in futures]
            assert [a.guid for a in acks] == [f.guid for f in futures]
            assert sum(mirrored.stats.first) == count and mirrored.stats.lost == 0
            assert mirrored.stats.skipped == [0, 0]
        received = collect(consumer, count, timeout_s=120)
        assert [m.guid for m in received] == [f.guid for f in futures]   # once each, in PUT order

        # Both copies are in the PUT log; the authority delivered each GUID once.
        puts = (spark.read.format("delta").load(PartitionPaths(cluster.data_dir, 0).puts)
                .filter(F.col("queue") == "mirrored"))
        wait_until(lambda: puts.count() == 2 * count, 60, interval_s=1, what="both copies in the PUT log")
        wait_until(lambda: delivery(spark, cluster).filter(F.col("queue") == "mirrored").count() >= count, 300,
                   interval_s=1, what="the pipeline's delivery rows")
        rows = delivery(spark, cluster).filter(F.col("queue") == "mirrored")
        assert rows.count() == count and rows.select("guid").distinct().count() == count
        # The primary has reconciled them: no copy comes again, nothing disagrees.
        assert list(consumer.messages(timeout_s=5)) == []
    disagreements = (spark.read.format("delta").load(PartitionPaths(cluster.data_dir, 0).disagreements)
                     .filter(F.col("queue") == "mirrored"))
    assert disagreements.count() == 0
