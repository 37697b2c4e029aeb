"""An open whose partition has no primary yet is parked, not slept on: the
link's other frames keep flowing meanwhile (a node in-process, real delta-rs
tables in a temp directory, no JVM)."""

from __future__ import annotations

import time

import pytest

from conf import ClusterConfig, HaConfig, NodeConfig, parse_domain
from primary.node import Node
from protocol import ResultCode, pb
from protocol.stream import Link
from protocol.uri import parse_queue_uri, partition_of
from tests.conftest import link_frames, serving_node, wait_until

pytestmark = pytest.mark.integration
LEASE_MS = 6000   # the absent node2 is partition 1's preferred primary: node1 waits half a lease for it


def uri_on(partition: int, partitions: int = 2, domain: str = "d") -> str:
    """A queue of `domain` whose URI maps to `partition`."""
    for i in range(100):
        uri = f"taproot://{domain}/q{i}"
        parsed = parse_queue_uri(uri)
        assert not isinstance(parsed, str)
        if partition_of(parsed, partitions) == partition:
            return uri
    raise AssertionError("no queue name maps there")


def frames(link: Link, timeout_s: float) -> list[tuple[float, pb.Frame]]:
    return list(link_frames(link, timeout_s))


def test_an_open_waiting_for_a_failover_is_parked_while_the_links_other_frames_flow(tmp_path):
    config = ClusterConfig(data_dir=str(tmp_path), partitions=2,
                           nodes=(NodeConfig("node1", port=1), NodeConfig("node2", port=2)),
                           ha=HaConfig(lease_duration_ms=LEASE_MS, lease_renew_interval_ms=500),
                           domains={"d": parse_domain("d", {})})
    node = Node(config, "node1")
    node.start("127.0.0.1:1")
    try:
        wait_until(lambda: 0 in node.partitions, 30, what="node1 serving partition 0")
        assert 1 not in node.partitions                      # node2's, free for half a lease
        link = Link("client")
        node.open_link(link)
        started = time.monotonic()
        node.on_frame(link, pb.Frame(open_queue=pb.OpenQueue(request_id=1, queue_id=1, uri=uri_on(1), write=True)))
        parked_for = time.monotonic() - started
        node.on_frame(link, pb.Frame(heartbeat=pb.Heartbeat()))
        node.on_frame(link, pb.Frame(open_queue=pb.OpenQueue(request_id=2, queue_id=2, uri=uri_on(0), write=True)))
        node.on_frame(link, pb.Frame(put=pb.PutBatch(messages=[
            pb.PutMessage(queue_id=2, guid=bytes(16), payload=b"meanwhile")])))
        handled_in = time.monotonic() - started
        answered = frames(link, LEASE_MS / 1000 + 10)
    finally:
        node.stop(graceful=False)
    assert parked_for < 0.5 and handled_in < 2, (parked_for, handled_in)
    kinds = [(f.WhichOneof("body"), at - started) for at, f in answered]
    order = [k for k, _ in kinds]
    assert order[:3] == ["heartbeat", "open_queue_response", "ack"], kinds
    first = answered[1][1].open_queue_response
    assert first.request_id == 2 and first.status.code == ResultCode.SUCCESS
    assert answered[2][1].ack.messages[0].code == ResultCode.SUCCESS
    late = [f.open_queue_response for _, f in answered if f.WhichOneof("body") == "open_queue_response"
            and f.open_queue_response.request_id == 1]
    assert len(late) == 1 and late[0].status.code == ResultCode.SUCCESS, kinds
    assert kinds[2][1] < 2.5 < [t for k, t in kinds if k == "open_queue_response"][-1], kinds


def test_a_bad_domain_file_leaves_the_nodes_reloads_running(tmp_path):
    """Issue 16, defect 2: a domain file that was not UTF-8, or a directory
    named x.toml, killed the node's domain-watcher thread, and a valid domain
    added later stayed unknown until a restart."""
    domains = tmp_path / "domains"
    domains.mkdir()
    (domains / "d.toml").write_text('mode = "priority"\n')
    config = ClusterConfig(data_dir=str(tmp_path / "data"), domains={"d": parse_domain("d", {})})
    node = Node(config, "node1", domains_dir=domains)
    node.start("127.0.0.1:1")
    try:
        (domains / "bad.toml").write_bytes(b"\xff\xfe not text")
        (domains / "dir.toml").mkdir()
        time.sleep(2.5)   # two polls meet the bad files
        assert set(node.config.domains) == {"d"} and node._watcher.is_alive()
        (domains / "bad.toml").unlink()
        (domains / "dir.toml").rmdir()
        (domains / "later.toml").write_text('mode = "priority"\n')
        wait_until(lambda: "later" in node.config.domains, 10, what="the domain added after the bad files")
    finally:
        node.stop(graceful=False)


def test_a_put_reaching_a_stopping_partition_is_refused_as_such(tmp_path):
    """Issue 16, defect 9: a PUT during a node's stop was refused with
    LIMIT_MESSAGES "pending PUT buffer is full"."""
    config = ClusterConfig(data_dir=str(tmp_path), domains={"d": parse_domain("d", {})})
    with serving_node(config) as (node, link):
        node.on_frame(link, pb.Frame(open_queue=pb.OpenQueue(request_id=1, queue_id=1, uri=uri_on(0, 1),
                                                             write=True)))
        assert link.next_frame(10).open_queue_response.status.code == ResultCode.SUCCESS
        node.partitions[0].put_committer.stop()
        node.on_frame(link, pb.Frame(put=pb.PutBatch(messages=[pb.PutMessage(queue_id=1, guid=b"s" * 16,
                                                                             payload=b"x")])))
        (ack,) = link.next_frame(10).ack.messages
        assert ack.code == ResultCode.REFUSED and "stopping" in ack.message


def test_a_columnar_frame_counts_its_rows_against_the_pending_put_bound(tmp_path):
    """A PutColumns frame of one queue counted as one PUT against
    `pending_puts_max` (and the group commit's sizes), so frames could pile
    up far beyond the bound while a commit was slow. Its rows count now: with
    room for 1,500 PUTs and the first frame held in its commit, a second
    1,000-row frame waits and a third is refused (LIMIT_MESSAGES)."""
    import threading

    import pyarrow as pa

    from conf import PrimaryConfig
    from protocol import columns

    config = ClusterConfig(data_dir=str(tmp_path), domains={"d": parse_domain("d", {})},
                           primary=PrimaryConfig(pending_puts_max=1500))
    node = Node(config, "node1")
    node.start("127.0.0.1:1")
    release = threading.Event()
    try:
        wait_until(lambda: 0 in node.partitions, 30, what="node1 serving partition 0")
        partition = node.partitions[0]
        append = partition._puts.append
        held = threading.Event()

        def slow_append(batch, *args, **kwargs):
            held.set()
            release.wait(30)
            return append(batch, *args, **kwargs)

        partition._puts.append = slow_append
        link = Link("client")
        node.open_link(link)
        node.on_frame(link, pb.Frame(open_queue=pb.OpenQueue(request_id=1, queue_id=1, uri=uri_on(0, 1),
                                                             write=True)))
        assert link.next_frame(10).open_queue_response.status.code == ResultCode.SUCCESS

        def frame(n: int) -> pb.Frame:
            guids = b"".join(bytes([n]) * 8 + i.to_bytes(8, "big") for i in range(1000))
            rows = pa.table({"guid": columns.fixed_width_binary(guids, 16), "payload": [b"x"] * 1000,
                             "properties": pa.array([[]] * 1000, columns.PROPERTY_MAP),
                             "property_types": pa.array([[]] * 1000, columns.PROPERTY_MAP),
                             "compression": pa.nulls(1000, pa.string())})
            return pb.Frame(put_columns=pb.PutColumns(queue_id=1, arrow_ipc=columns.encode(rows), guids=guids))

        node.on_frame(link, frame(1))
        assert held.wait(10)                 # the first frame is in its (held) commit
        node.on_frame(link, frame(2))        # 1,000 waiting: within the bound
        node.on_frame(link, frame(3))        # 2,000 would be over it
        refused = link.next_frame(10).ack_columns
        assert refused.guids == frame(3).put_columns.guids and refused.code == ResultCode.LIMIT_MESSAGES, refused
        release.set()
        acks = [link.next_frame(30).ack_columns for _ in range(2)]
        assert [a.code for a in acks] == [ResultCode.SUCCESS] * 2
        assert [a.guids for a in acks] == [frame(1).put_columns.guids, frame(2).put_columns.guids]
    finally:
        release.set()
        node.stop(graceful=False)
