"""PUT frames spanning queues (`PutColumns.queue_ids`) at the primary: a
node in-process with two partitions, real delta-rs tables, no JVM."""

from __future__ import annotations

import pytest

from conf import ClusterConfig, HaConfig, NodeConfig, parse_domain
from protocol import ResultCode, columns, pb
from protocol.stream import Link
from protocol.uri import QueueUri, parse_queue_uri, partition_of
from storage import deltars
from storage.tables import PartitionPaths
from tests.conftest import link_frames, serving_node
from tests.test_node_parking import uri_on

pytestmark = pytest.mark.integration


def g(i: int) -> bytes:
    return i.to_bytes(16, "big")


def uri(text: str) -> QueueUri:
    parsed = parse_queue_uri(text)
    assert not isinstance(parsed, str)
    return parsed


def next_of(link: Link, kind: str, timeout_s: float = 30) -> pb.Frame:
    for _, frame in link_frames(link, timeout_s):
        if frame.WhichOneof("body") == kind:
            return frame
    raise AssertionError(f"no {kind} frame within {timeout_s} s")


def spanning(rows: list[tuple[int, int]], per_message: bool = True) -> pb.Frame:
    """A frame of single PUTs: (queue id, GUID number) per row."""
    messages = [pb.PutMessage(queue_id=q, guid=g(i), payload=b"m%d" % i) for q, i in rows]
    return pb.Frame(put_columns=pb.PutColumns(arrow_ipc=columns.encode_puts(messages), per_message=per_message,
                                              guids=b"".join(m.guid for m in messages),
                                              queue_ids=[q for q, _ in rows]))


def test_a_frame_spanning_queues_of_one_partition_is_committed_and_answered_row_by_row(tmp_path):
    config = ClusterConfig(data_dir=str(tmp_path), partitions=2, nodes=(NodeConfig("node1", port=1),),
                           ha=HaConfig(lease_duration_ms=4000, lease_renew_interval_ms=500),
                           domains={"d": parse_domain("d", {}), "b": parse_domain("b", {"mode": "broadcast"})})
    with serving_node(config, partitions=(0, 1)) as (node, link):
        first = uri_on(0)
        second = next(u for u in (f"{first}-{n}" for n in range(100)) if partition_of(uri(u), 2) == 0)
        uris = {1: first, 2: second, 3: uri_on(1), 4: "taproot://b/cast", 5: first + "-read"}
        parts = {}
        for qid, text in uris.items():
            node.on_frame(link, pb.Frame(open_queue=pb.OpenQueue(request_id=qid, queue_id=qid, uri=text,
                                                                 write=qid != 5, read=qid == 5)))
            response = next_of(link, "open_queue_response").open_queue_response
            assert response.status.code == ResultCode.SUCCESS, response
            parts[qid] = partition_of(uri(uris[qid]), 2)
            assert response.partition == parts[qid]          # what the SDK groups frames by
        assert parts[1] == parts[2] == 0 and parts[3] == 1

        # One partition: committed together, queue by queue (each queue's rows
        # in the frame's order, on consecutive seqs); the rows refused on
        # their own are named, by their index in the frame.
        node.on_frame(link, spanning([(1, 1), (2, 2), (9, 3), (1, 4), (4, 5), (5, 6), (2, 7)]))
        ack = next_of(link, "ack_columns").ack_columns
        assert ack.code == ResultCode.SUCCESS and ack.queue_id == 0
        refused = dict(zip(ack.refused_rows, ack.refused_codes))
        assert refused == {2: ResultCode.INVALID_ARGUMENT, 4: ResultCode.INVALID_ARGUMENT, 5: ResultCode.REFUSED}
        messages = dict(zip(ack.refused_rows, ack.refused_messages))
        assert "queue id 9 is not open" in messages[2] and "broadcast" in messages[4]
        rows = deltars.try_open(PartitionPaths(str(tmp_path), parts[1]).puts).to_pyarrow_table(
            columns=["guid", "queue", "seq"]).sort_by("seq").to_pylist()
        assert [(r["guid"], r["queue"]) for r in rows] == [
            (g(1), uris[1].rsplit("/", 1)[1]), (g(4), uris[1].rsplit("/", 1)[1]),
            (g(2), uris[2].rsplit("/", 1)[1]), (g(7), uris[2].rsplit("/", 1)[1])]

        # Two partitions in one frame, a count that does not match, or not per message: refused whole.
        for bad, why in ((spanning([(1, 10), (3, 11)]), "partitions"),
                         (spanning([(1, 12), (2, 13)], per_message=False), "per_message")):
            node.on_frame(link, bad)
            nack = next_of(link, "ack_columns").ack_columns
            assert nack.code == ResultCode.INVALID_ARGUMENT and why in nack.message, nack
        short = spanning([(1, 14), (2, 15)])
        del short.put_columns.queue_ids[1:]
        node.on_frame(link, short)
        nack = next_of(link, "ack_columns").ack_columns
        assert nack.code == ResultCode.INVALID_ARGUMENT and "1 queue ids for 2 rows" in nack.message
        assert deltars.try_open(PartitionPaths(str(tmp_path), parts[1]).puts).to_pyarrow_table(
            columns=["guid"]).num_rows == 4
