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
