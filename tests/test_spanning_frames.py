"""PUT frames spanning queues (`PutColumns.queue_ids`) at the primary: a
node in-process with two partitions, real delta-rs tables, no JVM."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import primary.partition as partition_module
from conf import ClusterConfig, HaConfig, NodeConfig, parse_domain
from protocol import ResultCode, columns, pb
from protocol.stream import Link
from protocol.uri import QueueUri, parse_queue_uri, partition_of
from storage import deltars
from storage.tables import PartitionPaths
from tests.conftest import link_frames, serving_node, wait_until
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


def pushes_of(link: Link, want: int, timeout_s: float = 30,
              spans: list[set[int]] | None = None) -> list[tuple[int, int, bytes, int]]:
    """(queue id, seq, payload, delivery count) of the next `want` messages
    pushed on `link`, PushColumns frames (ranges of one queue or of many)
    and PushBatch alike; each PushColumns frame's queue ids into `spans`."""
    got: list[tuple[int, int, bytes, int]] = []
    for _, frame in link_frames(link, timeout_s):
        kind = frame.WhichOneof("body")
        if kind == "push_columns":
            push = frame.push_columns
            table = columns.decode_push(push.arrow_ipc)
            assert not isinstance(table, str), table
            ids = list(push.range_queue_ids) or [push.queue_id] * len(push.seq_starts)
            if spans is not None:
                spans.append(set(ids))
            row = 0
            rows = table.to_pylist()
            for queue_id, start, count in zip(ids, push.seq_starts, push.seq_counts):
                for seq in range(start, start + count):
                    assert rows[row]["seq"] == seq
                    got.append((queue_id, seq, rows[row]["payload"], rows[row]["delivery_count"]))
                    row += 1
            assert row == len(rows) == push.count
        elif kind == "push":
            for m in frame.push.messages:
                for queue_id in list(m.queue_ids) or [m.queue_id]:
                    got.append((queue_id, m.sequence, m.payload, m.delivery_count))
        if len(got) >= want:
            assert len(got) == want, got
            return got
    raise AssertionError(f"{len(got)} of {want} messages pushed within {timeout_s} s: {got}")


def test_a_frame_of_many_queues_is_pushed_in_one_pass_to_their_sole_consumers(tmp_path, monkeypatch):
    """The express lane's one pass over a frame spanning queues (`take_fresh`):
    queues with a sole consumer with room get their rows at once, in
    PushColumns frames taken from the PUT frame (a consumer asking for
    PushBatch gets messages); a consumer at its window, and a queue with two
    consumers, go the per-queue way. A frame is of one session's queues (its
    push group). Nothing is pushed twice, CONFIRMs free
    the windows, and a consumer that goes leaves its messages to the next,
    delivered again."""
    config = ClusterConfig(data_dir=str(tmp_path), partitions=1, nodes=(NodeConfig("node1", port=1),),
                           ha=HaConfig(lease_duration_ms=4000, lease_renew_interval_ms=500),
                           domains={"d": parse_domain("d", {})})
    with serving_node(config) as (node, link):
        other = Link("other")
        node.open_link(other)

        def open_queue(on: Link, qid: int, name: str, window: int = 100, columnar: bool = True) -> None:
            node.on_frame(on, pb.Frame(open_queue=pb.OpenQueue(
                request_id=qid, queue_id=qid, uri=f"taproot://d/{name}", read=True, write=True,
                columnar_push=columnar, push_group=1 if qid < 20 else 2,
                options=pb.QueueOptions(max_unconfirmed_messages=window, max_unconfirmed_bytes=1 << 20))))
            assert next_of(on, "open_queue_response").open_queue_response.status.code == ResultCode.SUCCESS

        # 1-3: a window of one message; 4-30: room; 31: PushBatch; 32: two
        # consumers. Queues from 20 are of another session below this link.
        for qid in range(1, 33):
            open_queue(link, qid, f"q{qid}", window=1 if qid <= 3 else 100, columnar=qid != 31)
        open_queue(other, 32, "q32")
        rows = [(qid, 2 * qid + k) for qid in range(1, 33) for k in (0, 1)]
        node.on_frame(link, spanning(rows))
        assert next_of(link, "ack_columns").ack_columns.code == ResultCode.SUCCESS
        payload_of = {qid: [b"m%d" % (2 * qid), b"m%d" % (2 * qid + 1)] for qid in range(1, 33)}

        spans: list[set[int]] = []
        pushed = pushes_of(link, 3 * 1 + 27 * 2 + 2 + 1, spans=spans)
        assert set().union(*spans) == set(range(1, 31)) and all(
            all(q < 20 for q in span) or all(q >= 20 for q in span) for span in spans), spans
        by_queue: dict[int, list[tuple[int, bytes, int]]] = {}
        for qid, seq, payload, count in pushed:
            by_queue.setdefault(qid, []).append((seq, payload, count))
        assert sorted(by_queue) == list(range(1, 33))
        for qid, got in by_queue.items():
            seqs = [seq for seq, _, _ in got]
            assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
            assert all(count == 1 for _, _, count in got)
            assert [p for _, p, _ in got] == payload_of[qid][:len(got)]
            assert len(got) == (1 if qid <= 3 or qid == 32 else 2), (qid, got)
        (q32_other,) = pushes_of(other, 1)
        assert q32_other[0] == 32 and q32_other[2] == payload_of[32][1] and q32_other[3] == 1

        # The rows taken at once are held as rows of the frame; held longer
        # than FRAME_HOLD_S (the sweep's work, here at once) each gets a copy
        # of its own, and what follows confirms and redelivers those.
        monkeypatch.setattr(partition_module, "FRAME_HOLD_S", -1.0)
        assert sum(p.own_frames() for p in node.partitions.values()) == 3 + 27 * 2 + 2   # (queue 32's spilled)
        assert sum(p.own_frames() for p in node.partitions.values()) == 0

        # The windows of one: a CONFIRM frees each, and its queue's second row follows.
        held = {qid: by_queue[qid][0][0] for qid in (1, 2, 3)}
        node.on_frame(link, pb.Frame(confirm_columns=pb.ConfirmColumns(
            queue_ids=list(held), starts=list(held.values()), counts=[1, 1, 1])))
        second = pushes_of(link, 3)
        assert sorted((qid, payload, count) for qid, _, payload, count in second) == [
            (qid, payload_of[qid][1], 1) for qid in (1, 2, 3)]

        # A frame of a row or two for a link goes as messages (PushBatch).
        node.on_frame(link, spanning([(10, 500), (11, 501)]))
        assert next_of(link, "ack_columns").ack_columns.code == ResultCode.SUCCESS
        assert [(qid, payload, count) for qid, _, payload, count in pushes_of(link, 2)] == [
            (10, b"m500", 1), (11, b"m501", 1)]

        # Queue 5's consumer goes without confirming; the next one gets both rows again.
        node.on_frame(link, pb.Frame(close_queue=pb.CloseQueue(request_id=99, queue_id=5)))
        next_of(link, "close_queue_response")
        open_queue(other, 5, "q5")
        again = pushes_of(other, 2)
        assert [(qid, payload, count) for qid, _, payload, count in again] == [
            (5, payload_of[5][0], 2), (5, payload_of[5][1], 2)]


def test_the_runs_of_a_frame_sent_queue_by_queue_are_found_without_a_row_loop():
    from primary.node import _runs_if_grouped

    class Handle:
        def __init__(self, state):
            self.state = state

    usable = {q: Handle(f"s{q}") for q in (3, 7, 9)}
    assert _runs_if_grouped([3, 3, 7, 9, 9, 9], usable) == [("s3", 2), ("s7", 1), ("s9", 3)]
    assert _runs_if_grouped([7], {7: usable[7]}) == [("s7", 1)]
    assert _runs_if_grouped([3, 7, 3, 9], usable) is None     # queue 3's rows apart: row by row
    assert _runs_if_grouped([3, 7, 7], usable) is None        # (a usable queue with no rows cannot happen)


@given(st.lists(st.integers(0, 4), max_size=40))
def test_id_runs_are_queue_runs_of_queue_ids(ids):
    from primary.partition import id_runs, queue_runs

    assert id_runs(ids) == queue_runs(ids)


def test_confirm_frames_of_many_queues_record_each_row_with_its_own_queue_and_app(tmp_path, monkeypatch):
    """The PUT log's and the confirm log's rows of CONFIRM frames spanning queues, whose rows
    the ledger holds (`primary.ledger`): a frame of plain sole consumers
    only is confirmed in the ledger (`Partition.confirm_held`), a frame that
    also names a queue whose rows went back to its dispatcher is split
    (`confirm_ranges`); the commit takes the queue column of the ledger's
    rows by slot (`SlotRuns`). Each row must carry its own queue."""
    from primary.ledger import Ledger

    config = ClusterConfig(data_dir=str(tmp_path), partitions=1, nodes=(NodeConfig("node1", port=1),),
                           ha=HaConfig(lease_duration_ms=4000, lease_renew_interval_ms=500),
                           domains={"d": parse_domain("d", {})})
    held_calls: list[int] = []
    original = Ledger.confirm_slots

    def counted(self, slots, starts, counts, into):
        hit, per = original(self, slots, starts, counts, into)
        held_calls.append(int(per.sum()))
        return hit, per

    monkeypatch.setattr(Ledger, "confirm_slots", counted)
    general: list[int] = []
    ranges_of = partition_module.Partition.confirm_ranges

    def counted_ranges(self, ranges):
        general.append(len(ranges))
        return ranges_of(self, ranges)

    monkeypatch.setattr(partition_module.Partition, "confirm_ranges", counted_ranges)
    queues = range(1, 41)
    with serving_node(config) as (node, link):
        for qid in queues:
            node.on_frame(link, pb.Frame(open_queue=pb.OpenQueue(
                request_id=qid, queue_id=qid, uri=f"taproot://d/q{qid}", read=True, write=True, columnar_push=True,
                options=pb.QueueOptions(max_unconfirmed_messages=100, max_unconfirmed_bytes=1 << 20))))
            assert next_of(link, "open_queue_response").open_queue_response.status.code == ResultCode.SUCCESS
        node.on_frame(link, spanning([(qid, 1000 * qid + k) for qid in queues for k in range(3)]))
        assert next_of(link, "ack_columns").ack_columns.code == ResultCode.SUCCESS
        seqs: dict[int, list[int]] = {}
        for qid, seq, _, _ in pushes_of(link, 3 * len(queues)):
            seqs.setdefault(qid, []).append(seq)
        (partition,) = node.partitions.values()
        assert all(partition.ledger.keys.get((link, qid)) is not None for qid in queues)   # all held there
        put_rows = deltars.try_open(partition.paths.puts).to_pyarrow_table(columns=["domain", "queue", "guid"])
        assert sorted((r["guid"], r["domain"], r["queue"]) for r in put_rows.to_pylist()) == sorted(
            (g(1000 * qid + k), "d", f"q{qid}") for qid in queues for k in range(3))   # the PUT log's queue column too

        # 1. Queues 1-20, two rows each, in one frame: confirmed in the ledger.
        first = [(qid, seqs[qid][0], 2) for qid in range(1, 21)]
        node.on_frame(link, pb.Frame(confirm_columns=pb.ConfirmColumns(
            queue_ids=[q for q, _, _ in first], starts=[s for _, s, _ in first], counts=[c for _, _, c in first])))
        assert held_calls == [40] and general == []   # the ledger's way (`confirm_held`) alone
        # 2. A CONFIRM with its GUID moves queue 21's rows back into its
        # dispatcher; a frame naming it and queues 22-40 is split.
        guid_21 = g(1000 * 21)
        node.on_frame(link, pb.Frame(confirm=pb.ConfirmBatch(messages=[
            pb.ConfirmMessage(queue_id=21, guid=guid_21, sequence=seqs[21][0])])))
        assert (link, 21) not in partition.ledger.keys
        second = [(qid, seqs[qid][1], 2) for qid in range(21, 41)]
        node.on_frame(link, pb.Frame(confirm_columns=pb.ConfirmColumns(
            queue_ids=[q for q, _, _ in second], starts=[s for _, s, _ in second], counts=[c for _, _, c in second])))
        assert held_calls == [40, 38] and general == [20]   # split: queues 22-40 in the ledger, 21 not

        expected = {(f"q{qid}", seq, g(1000 * qid + (seq - seqs[qid][0])))
                    for qid in range(1, 21) for seq in seqs[qid][:2]}
        expected |= {(f"q{qid}", seq, g(1000 * qid + (seq - seqs[qid][0])))
                     for qid in range(21, 41) for seq in seqs[qid][1:3]}
        expected.add(("q21", seqs[21][0], guid_21))

        def recorded():
            table = deltars.try_open(partition.paths.confirms)
            return None if table is None else table.to_pyarrow_table().to_pylist()

        rows = wait_until(lambda: (lambda r: r if r is not None and len(r) >= len(expected) else None)(recorded()),
                          15, what="the confirm log's rows")
        assert len(rows) == len(expected)
        assert {(r["queue"], r["seq"], r["guid"]) for r in rows} == expected
        assert {(r["domain"], r["app_id"]) for r in rows} == {("d", "")}
