"""Queue modes and consumer semantics, one scenario per rule, against real
processes: node, proxy and the Spark pipeline, real Delta tables.
The cluster (tests/cluster_conf, copied so the reload test can edit its domains)
is shared by every integration module: see conftest.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from storage import deltars
from storage.tables import PartitionPaths
from taproot import AckError, Session, TaprootError
from tests.conftest import collect, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark]
ROOT = Path(__file__).resolve().parent.parent


def post(address: str, uri: str, payloads, properties=None, **kw) -> list:
    """Post and wait for every ACK; returns the futures (some may have failed)."""
    with Session([address]) as session, session.open_queue(uri, write=True) as queue:
        futures = [queue.post(p, (properties or (lambda i: None))(i), **kw) for i, p in enumerate(payloads)]
        for f in futures:
            f.exception(timeout=60)
        return futures


def quiet(queue, seconds: float = 3.0) -> list:
    """Whatever arrives within `seconds` (expected: nothing)."""
    return list(queue.messages(timeout_s=seconds))


def table_rows(path: str, **equal) -> list[dict]:
    table = deltars.try_open(path)
    if table is None:
        return []
    rows = table.to_pyarrow_table().to_pylist()
    return [r for r in rows if all(r[k] == v for k, v in equal.items())]


# -- priority ---------------------------------------------------------------------------
def test_only_the_two_top_priority_consumers_receive_alternately_and_priority_changes_at_runtime(cluster):
    uri = "taproot://prio/roundrobin"
    with Session([cluster.proxy_address]) as session:
        top1 = session.open_queue(uri, read=True, consumer_priority=2)
        top2 = session.open_queue(uri, read=True, consumer_priority=2)
        low = session.open_queue(uri, read=True, consumer_priority=1)
        guids = [f.result().guid for f in post(cluster.proxy_address, uri, [b"m%d" % i for i in range(10)])]
        got = {name: collect(q, 5) for name, q in (("top1", top1), ("top2", top2))}
        assert quiet(low, 2) == []
        owners = sorted((m.sequence, name) for name, ms in got.items() for m in ms)
        assert [g for _, ms in sorted(got.items()) for g in (m.guid for m in ms)] != []
        assert sorted(m.guid for ms in got.values() for m in ms) == sorted(guids)
        names = [name for _, name in owners]
        assert all(a != b for a, b in zip(names, names[1:])), names  # strictly alternating

        low.configure(consumer_priority=3)  # now the only top consumer
        post(cluster.proxy_address, uri, [b"late%d" % i for i in range(4)])
        assert [m.payload for m in collect(low, 4)] == [b"late0", b"late1", b"late2", b"late3"]
        assert quiet(top1, 1) == [] and quiet(top2, 1) == []


def test_flow_control_caps_unconfirmed_and_zero_pauses(cluster):
    uri = "taproot://prio/flow"
    with Session([cluster.proxy_address]) as session:
        consumer = session.open_queue(uri, read=True, max_unconfirmed_messages=2)
        post(cluster.proxy_address, uri, [b"%d" % i for i in range(5)])
        held = collect(consumer, 2, confirm=False)
        assert [m.payload for m in held] + quiet(consumer, 2) == [b"0", b"1"]  # at capacity: nothing new
        consumer.configure(max_unconfirmed_messages=0, max_unconfirmed_bytes=0)  # paused
        consumer.confirm(held)
        assert quiet(consumer, 2) == []
        consumer.configure(max_unconfirmed_messages=10, max_unconfirmed_bytes=1 << 20)
        assert [m.payload for m in collect(consumer, 3)] == [b"2", b"3", b"4"]
        consumer.configure(consumer_priority=1)  # options not given keep their value
        assert (consumer.options.max_unconfirmed_messages, consumer.options.consumer_priority) == (10, 1)
        plain = session.open_queue(uri, read=True)  # the domain's defaults, reported by the broker
        assert (plain.options.max_unconfirmed_messages, plain.options.max_unconfirmed_bytes) == (1000, 32 << 20)


def test_consumer_subscription_leaves_unmatched_messages_for_other_consumers(cluster):
    uri = "taproot://prio/subscribed"
    with Session([cluster.proxy_address]) as session:
        eu = session.open_queue(uri, read=True, subscription="region = 'EU' && amount >= 10")
        post(cluster.proxy_address, uri, [b"%d" % i for i in range(6)],
             properties=lambda i: {"region": "EU" if i % 2 else "US", "amount": 10 * i})
        assert sorted(m.payload for m in collect(eu, 3)) == [b"1", b"3", b"5"]
        rest = session.open_queue(uri, read=True)
        assert [m.payload for m in collect(rest, 3)] == [b"0", b"2", b"4"]
        with pytest.raises(TaprootError, match="subscription"):
            session.open_queue(uri, read=True, subscription="region = ")


def test_consumer_killed_holding_50_has_them_redelivered_to_another(cluster):
    uri = "taproot://prio/killed"
    guids = [f.result().guid for f in post(cluster.proxy_address, uri, [b"k%d" % i for i in range(50)])]
    doomed = subprocess.Popen([sys.executable, "-m", "tests.consumer_proc", cluster.proxy_address, uri, "hold", "50"],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert doomed.stdout.readline().strip() == "READY"
        assert doomed.stdout.readline().strip() == "HELD 50"
    finally:
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(10)
    with Session([cluster.proxy_address]) as session, session.open_queue(uri, read=True) as consumer:
        again = collect(consumer, 50)
    assert [m.guid for m in again] == guids
    assert all(m.redelivered and m.delivery_count == 2 for m in again)


def test_max_consumers_refuses_the_next_consumer(cluster):
    uri = "taproot://single/only"
    with Session([cluster.proxy_address]) as session:
        session.open_queue(uri, read=True)
        with pytest.raises(TaprootError, match="max_consumers"):
            session.open_queue(uri, read=True)
        session.open_queue(uri, write=True)  # producers are limited separately


# -- fanout -----------------------------------------------------------------------------
def test_fanout_every_app_gets_every_message_except_what_its_subscription_rejects(cluster, spark):
    uri = "taproot://fan/orders"
    with Session([cluster.proxy_address]) as session:
        apps = {app: session.open_queue(f"{uri}?id={app}", read=True) for app in ("billing", "audit", "eu")}
        futures = post(cluster.proxy_address, uri, [b"o%d" % i for i in range(6)],
                       properties=lambda i: {"region": "EU" if i < 3 else "US"})
        guids = [f.result().guid for f in futures]
        got = {app: collect(q, 6 if app != "eu" else 3) for app, q in apps.items()}
        assert quiet(apps["eu"], 2) == []
    assert [m.guid for m in got["billing"]] == guids
    assert [m.guid for m in got["audit"]] == guids
    assert [m.payload for m in got["eu"]] == [b"o0", b"o1", b"o2"]

    paths = PartitionPaths(cluster.data_dir, 0)
    # Pushed by the express lane; the pipeline, the authority, decides the same a little later.
    # Other tests use the domain too (`test_admin`): this queue's rows only.
    wait_until(lambda: len(table_rows(paths.delivery, domain="fan", queue="orders")) >= 6, 120, interval_s=0.5,
               what="the pipeline's delivery rows")
    delivery = (spark.read.format("delta").load(paths.delivery).filter("domain = 'fan' AND queue = 'orders'")
                .orderBy("seq"))
    rows = delivery.select("guid", "apps").collect()
    assert [r.guid for r in rows] == guids                      # stored once, not once per app
    assert [sorted(r.apps) for r in rows] == [["audit", "billing", "eu"]] * 3 + [["audit", "billing"]] * 3
    wait_until(lambda: len(table_rows(paths.confirms, domain="fan", queue="orders")) == 15, 30,
               what="15 per-app confirms")
    confirms = {(r["guid"], r["app_id"]) for r in table_rows(paths.confirms, domain="fan", queue="orders")}
    assert confirms == {(g, a) for g in guids for a in ("billing", "audit")} | {(g, "eu") for g in guids[:3]}
    assert table_rows(paths.disagreements, domain="fan", queue="orders") == []   # the express lane decided as Spark did

    with Session([cluster.proxy_address]) as session:
        with pytest.raises(TaprootError, match="unknown app id"):
            session.open_queue(f"{uri}?id=nobody", read=True)
        with pytest.raises(TaprootError, match=r"\?id=<app>"):
            session.open_queue(uri, read=True)


# -- broadcast --------------------------------------------------------------------------
def test_broadcast_late_joiner_gets_only_later_messages_and_nothing_is_stored(cluster):
    uri = "taproot://bcast/ticks"
    with Session([cluster.proxy_address]) as session:
        early = session.open_queue(uri, read=True)
        first = post(cluster.proxy_address, uri, [b"a0", b"a1", b"a2"])
        assert all(f.exception() is None for f in first)
        assert [m.payload for m in collect(early, 3, timeout_s=10)] == [b"a0", b"a1", b"a2"]
        late = session.open_queue(uri, read=True)
        post(cluster.proxy_address, uri, [b"b0", b"b1"])
        assert [m.payload for m in collect(late, 2, timeout_s=10)] == [b"b0", b"b1"]
        assert [m.payload for m in collect(early, 2, timeout_s=10)] == [b"b0", b"b1"]
        assert quiet(late, 1) == []
    assert table_rows(PartitionPaths(cluster.data_dir, 0).puts, domain="bcast") == []
    # Nobody listening: the PUT is still ACKed, and the message is gone (at-most-once).
    assert post(cluster.proxy_address, uri, [b"void"])[0].exception() is None


def test_a_columnar_put_frame_to_a_broadcast_queue_reaches_every_consumer_in_order_and_is_not_stored(cluster):
    """`post_columns` to a broadcast queue: one frame, ACKed once handed on;
    each consumer attached gets every row in order, one read per message and
    one as Arrow batches; nothing is committed."""
    import pyarrow as pa

    uri = "taproot://bcast/bulk"
    payloads = [b"c%04d" % i for i in range(500)]
    with Session([cluster.proxy_address]) as session:
        one_by_one = session.open_queue(uri, read=True)
        batches = session.open_queue(uri, read=True)
        with Session([cluster.proxy_address]) as producer, producer.open_queue(uri, write=True) as queue:
            guids = queue.post_columns(pa.table({"payload": pa.array(payloads, pa.binary())})).result(timeout=60)
        assert len(guids) == 500
        assert [m.payload for m in collect(one_by_one, 500, timeout_s=30)] == payloads
        got: list[bytes] = []
        while len(got) < 500:
            batch = batches.get_columns(1000, timeout_s=30)
            assert batch is not None, f"{len(got)} of 500 rows arrived"
            got.extend(batch.table["payload"].to_pylist())
            assert batch.table["guid"].to_pylist() == guids[len(got) - len(batch):len(got)]
            batch.confirm()   # a broadcast queue's confirms are not sent; harmless
        assert got == payloads
        assert quiet(one_by_one, 1) == [] and batches.get_columns(10, timeout_s=1) is None
    assert table_rows(PartitionPaths(cluster.data_dir, 0).puts, domain="bcast") == []


# -- poison pills, TTL ------------------------------------------------------------------
def test_message_that_always_crashes_its_consumer_is_dead_lettered_after_3_attempts(cluster):
    uri = "taproot://poison/jobs"
    pill = post(cluster.proxy_address, uri, [b"pill"])[0].result().guid
    for attempt in (1, 2, 3):
        crash = subprocess.run([sys.executable, "-m", "tests.consumer_proc", cluster.proxy_address, uri, "crash"],
                               cwd=ROOT, capture_output=True, text=True, timeout=180)
        assert crash.returncode == 3, crash.stderr
        assert crash.stdout.splitlines()[-1].endswith(f" {attempt}")  # GOT <seq> <delivery_count>
    dead = PartitionPaths(cluster.data_dir, 0).dead_letters
    rows = wait_until(lambda: table_rows(dead, guid=pill), 30, what="the dead-letter row")
    assert (rows[0]["reason"], rows[0]["delivery_count"], rows[0]["payload"]) == ("max_delivery_attempts", 3, b"pill")
    post(cluster.proxy_address, uri, [b"good"])
    with Session([cluster.proxy_address]) as session, session.open_queue(uri, read=True) as consumer:
        assert [m.payload for m in collect(consumer, 1)] + quiet(consumer, 2) == [b"good"]


def test_expired_messages_are_not_pushed_and_are_recorded(cluster):
    uri = "taproot://ttl/stale"
    guids = [f.result().guid for f in post(cluster.proxy_address, uri, [b"s0", b"s1"])]
    dead = PartitionPaths(cluster.data_dir, 0).dead_letters
    rows = wait_until(lambda: len(table_rows(dead, domain="ttl")) == 2 and table_rows(dead, domain="ttl"), 60,
                      what="two expired messages in the dead-letter table")
    assert {(r["guid"], r["reason"], r["delivery_count"]) for r in rows} == {(g, "ttl_expired", 0) for g in guids}
    with Session([cluster.proxy_address]) as session, session.open_queue(uri, read=True) as consumer:
        assert quiet(consumer, 2) == []
        post(cluster.proxy_address, uri, [b"fresh"])
        assert [m.payload for m in collect(consumer, 1)] == [b"fresh"]


# -- quotas -----------------------------------------------------------------------------
def test_full_queue_answers_limit_messages_and_accepts_again_after_confirms(cluster):
    uri = "taproot://quota/bounded"
    futures = post(cluster.proxy_address, uri, [b"q%d" % i for i in range(12)])
    errors = [f.exception() for f in futures]
    assert errors[:10] == [None] * 10
    assert all(isinstance(e, AckError) and e.code.name == "LIMIT_MESSAGES" for e in errors[10:]), errors
    assert "queue_max_messages" in str(errors[10])
    with Session([cluster.proxy_address]) as session, session.open_queue(uri, read=True) as consumer:
        collect(consumer, 5)
        consumer.flush()
        # The confirms travel to the primary; once they land, there is room for 5.
        wait_until(lambda: post(cluster.proxy_address, uri, [b"again"])[0].exception() is None, 30,
                   what="room after the confirms")


def test_byte_quota_answers_limit_bytes(cluster):
    futures = post(cluster.proxy_address, "taproot://qbytes/b", [b"x" * 1024] * 5)
    assert [f.exception() is None for f in futures] == [True] * 4 + [False]
    assert futures[4].exception().code.name == "LIMIT_BYTES"


# -- messages ---------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", ["zstd", "zlib"])
def test_compression_is_done_by_the_sdk_and_reported(cluster, algorithm):
    uri = f"taproot://prio/compressed-{algorithm}"
    big = b"taproot " * 1000
    post(cluster.proxy_address, uri, [big, b"tiny"], compression=algorithm)
    with Session([cluster.proxy_address]) as session, session.open_queue(uri, read=True) as consumer:
        got = collect(consumer, 2)
    assert [(m.payload, m.compression) for m in got] == [(big, algorithm), (b"tiny", None)]
    stored = table_rows(PartitionPaths(cluster.data_dir, 0).puts, queue=f"compressed-{algorithm}")
    assert sorted((r["payload"] == b"tiny", r["compression"] or "") for r in stored) == [(False, algorithm),
                                                                                         (True, "")]
    assert all(len(r["payload"]) < 1000 for r in stored)  # stored compressed


def test_typed_properties_round_trip(cluster):
    uri = "taproot://prio/typed"
    props = {"flag": True, "small": 7, "big": 2**40, "name": "ü", "raw": b"\x00\x01"}
    post(cluster.proxy_address, uri, [b"p"], properties=lambda i: props)
    with Session([cluster.proxy_address]) as session, session.open_queue(uri, read=True) as consumer:
        assert dict(collect(consumer, 1)[0].properties) == props


# -- configuration ----------------------------------------------------------------------
def test_domains_reload_without_restart_and_a_bad_file_is_rejected_naming_the_field(cluster):
    domains = cluster.config_path.parent / "domains"
    (domains / "late.toml").write_text('mode = "priority"\nqueue_max_messages = 1\n')

    def served():
        try:
            return post(cluster.proxy_address, "taproot://late/q", [b"1", b"2"])
        except TaprootError:
            return None  # unknown domain until the node has reloaded
    futures = wait_until(served, 30, interval_s=0.5, what="the new domain to be served")
    assert futures[0].exception() is None and futures[1].exception().code.name == "LIMIT_MESSAGES"
    (domains / "late.toml").write_text('mode = "priority"\nqueue_max_mesages = 5\n')
    node_log = Path(cluster.data_dir) / "logs" / "node1.log"
    wait_until(lambda: "late.toml: queue_max_mesages: unknown field" in node_log.read_text(), 30,
               what="the node to log the bad field")
    # The last good configuration stays in force.
    assert isinstance(post(cluster.proxy_address, "taproot://late/q", [b"3"])[0].exception(), AckError)
    os.remove(domains / "late.toml")


# -- delivery = "pipeline" ---------------------------------------------------------------
def test_pipeline_delivery_pushes_only_messages_whose_delivery_row_exists(cluster):
    uri = "taproot://authority/orders"
    paths = PartitionPaths(cluster.data_dir, 0)
    with Session([cluster.proxy_address]) as session:
        consumer = session.open_queue(uri, read=True)
        guids = [f.result().guid for f in post(cluster.proxy_address, uri, [b"a%d" % i for i in range(5)])]
        got = []
        while len(got) < 5:
            message = consumer.get(timeout_s=120)
            assert message is not None, "not delivered within 120 s"
            # Read right after each push: its row must already be in the delivery log.
            assert message.guid in {r["guid"] for r in table_rows(paths.delivery, domain="authority")}
            got.append(message)
            consumer.confirm(message)
    assert [m.guid for m in got] == guids
