"""A consumer's `Message`s made from a PUSH frame's table (`TableRows`):
made without the dataclass's `__init__`, and with the columns that hold
nothing (no properties, no compression) not listed a row at a time; the
messages must be the same as the plain way makes them."""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pytest

from protocol import columns
from protocol.properties import from_wire, maps_to_wire, to_wire, wire_to_maps
from taproot.message import BATCH_SCHEMA, Message, TableRows, _message

pytestmark = pytest.mark.unit


class FakeQueue:
    uri = "taproot://d/q"


QUEUE = FakeQueue()


def batch(rows: list[dict]) -> pa.Table:
    maps = [wire_to_maps(to_wire(r.get("properties"))) if r.get("properties") else (None, None) for r in rows]
    return pa.table({
        "guid": pa.array([bytes([i]) * 16 for i in range(len(rows))], pa.binary()),
        "seq": pa.array([100 + i for i in range(len(rows))], pa.int64()),
        "payload": pa.array([b"p%d" % i for i in range(len(rows))], pa.binary()),
        "properties": pa.array([v for v, _ in maps], columns.PROPERTY_MAP),
        "property_types": pa.array([t for _, t in maps], columns.PROPERTY_MAP),
        "put_time_us": pa.array([7 + i for i in range(len(rows))], pa.int64()),
        "delivery_count": pa.array([1 + i % 2 for i in range(len(rows))], pa.int32()),
        "compression": pa.array([r.get("compression") for r in rows], pa.string()),
    }, schema=BATCH_SCHEMA)


def plainly(table: pa.Table, start: int, count: int) -> list[Message]:
    """The messages as the dataclass makes them, a column listed at a time."""
    cols = {name: table[name].to_pylist()[start:start + count] for name in table.column_names}
    return [Message(cols["guid"][i], cols["payload"][i],
                    from_wire(maps_to_wire(cols["properties"][i], cols["property_types"][i]))
                    if cols["properties"][i] else {}, QUEUE.uri, cols["delivery_count"][i], cols["seq"][i],
                    cols["put_time_us"][i], cols["compression"][i], QUEUE)  # type: ignore[arg-type]
            for i in range(count)]


def test_a_message_made_directly_is_the_dataclasss_own():
    args = (b"g" * 16, b"payload", {"n": 1}, "taproot://d/q", 2, 5, 7, "zstd", QUEUE)
    fast, plain = _message(*args), Message(*args)  # type: ignore[arg-type]
    assert fast == plain and repr(fast) == repr(plain)
    assert vars(fast) == vars(plain)
    assert fast.redelivered and fast.guid_hex == plain.guid_hex and fast._queue is QUEUE
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.sequence = 6  # type: ignore[misc]


@pytest.mark.parametrize("rows", [
    [{}] * 5,                                                          # nothing in either column
    [{"properties": {"a": 1, "b": "x"}}, {}, {"properties": {"c": b"\x00"}, "compression": "zlib"}, {}],
    [{"compression": "zstd"}, {}, {}],                                 # compression only
    [{}, {}, {"properties": {"flag": True, "big": 2**40}}],            # properties only, last row
], ids=["bare", "mixed", "compression", "last-row"])
def test_rows_become_the_same_messages_as_the_plain_way(rows):
    table = batch(rows)
    for start, count in ((0, len(rows)), (1, len(rows) - 1), (len(rows) - 1, 1)):
        assert TableRows(table).messages(QUEUE, start, count) == plainly(table, start, count)  # type: ignore[arg-type]


def test_a_table_of_slices_and_chunks_is_read_by_its_own_rows():
    """Offsets of a slice do not start at zero, and a chunk with properties
    may follow one without: each chunk's own rows decide."""
    with_props = batch([{}, {}, {"properties": {"k": "v"}}])
    bare = batch([{}, {}, {}])
    table = pa.concat_tables([bare, with_props.slice(1)])   # the entries are in the second chunk
    assert table["properties"].num_chunks == 2
    assert TableRows(table).messages(QUEUE, 0, 5) == plainly(table, 0, 5)  # type: ignore[arg-type]
    sliced = with_props.slice(0, 2)   # rows without entries, from a chunk whose array holds one
    assert TableRows(sliced).messages(QUEUE, 0, 2) == plainly(sliced, 0, 2)  # type: ignore[arg-type]
    assert all(m.properties == {} for m in TableRows(sliced).messages(QUEUE, 0, 2))  # type: ignore[arg-type]


def test_a_frame_spanning_queues_gives_each_callback_its_rows_and_each_reader_its_slices():
    """`Session._deliver_columns` of a PUSH frame spanning queues of a
    session: callback queues get their rows as `Message`s, made in one pass
    over the frame, each queue's in the frame's order, equal to the plain
    way's; queues read with `get` get slices of the table; a range of a
    queue closed meanwhile (not in the session) goes to nobody."""
    import queue as _queue

    from protocol import taproot_pb2 as pb
    from taproot.message import Rows, received_table
    from taproot.session import Queue, Session

    rows = 10
    props = [to_wire({"n": i, "tag": "x"}) if i % 3 == 0 else [] for i in range(rows)]
    maps = [wire_to_maps(p) if p else (None, None) for p in props]
    push = columns.push_table([bytes([i]) * 16 for i in range(rows)], [50 + i for i in range(rows)],
                              [b"m%d" % i for i in range(rows)], [m for m, _ in maps], [t for _, t in maps],
                              [1000 + i for i in range(rows)], [1 + i % 2 for i in range(rows)], [0] * rows)
    # (queue id, rows): queues 1 and 2 have callbacks and come back later in
    # the frame; 3 is read with `get`; 4 was closed.
    ranges = [(1, 2), (2, 1), (3, 2), (4, 1), (1, 1), (2, 3)]
    starts, row = [], 0
    for _, count in ranges:
        starts.append(50 + row)
        row += count
    got: dict[int, list[Message]] = {1: [], 2: []}

    def queue(qid: int, callback: bool) -> Queue:
        q = object.__new__(Queue)
        q.queue_id, q.uri, q._inbox = qid, f"taproot://d/q{qid}", _queue.SimpleQueue()
        q._on_message = got[qid].append if callback else None
        return q

    session = object.__new__(Session)
    session._queues = {1: queue(1, True), 2: queue(2, True), 3: queue(3, False)}
    session._deliver_columns(pb.PushColumns(
        queue_id=1, count=rows, arrow_ipc=columns.encode_push_table(push), range_queue_ids=[q for q, _ in ranges],
        seq_starts=starts, seq_counts=[c for _, c in ranges]))

    table = received_table(push, "taproot://d/q1")
    for qid, at in ((1, [0, 1, 6]), (2, [2, 7, 8, 9])):
        q = session._queues[qid]
        want = [m for i in at for m in plainly(table, i, 1)]
        assert got[qid] == [dataclasses.replace(m, queue_uri=q.uri, _queue=q) for m in want]
        assert all(m._queue is q for m in got[qid])
        assert [m.properties for m in got[qid]] == [{"n": i, "tag": "x"} if i % 3 == 0 else {} for i in at]
    inbox = session._queues[3]._inbox
    (slice_,) = [inbox.get_nowait()]
    assert inbox.empty() and isinstance(slice_, Rows)
    assert slice_.table.column("seq").to_pylist() == [53, 54]
    assert slice_.table.column("payload").to_pylist() == [b"m3", b"m4"]
