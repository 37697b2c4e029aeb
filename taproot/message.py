"""What a consumer receives: one `Message` at a time, or a `MessageBatch`
(an Arrow table of many, confirmed with one call).

A columnar PUSH frame waits in a queue's inbox as `Rows` (its decoded Arrow
table) and becomes `Message` objects only if the application asks for them
one at a time; `Queue.get_columns` hands the rows over as they are.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from itertools import repeat
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from protocol import columns
from protocol.properties import PropertyValue, from_wire, maps_to_wire, to_wire, wire_to_maps
from taproot.compression import NAMES as COMPRESSION_NAMES
from taproot.compression import decompress
from taproot.guid import guid_hex

if TYPE_CHECKING:
    from taproot.session import Queue

log = logging.getLogger(__name__)

# The columns of a `MessageBatch` table.
BATCH_SCHEMA = pa.schema([
    pa.field("guid", pa.binary()),
    pa.field("seq", pa.int64()),
    pa.field("payload", pa.binary()),                    # decompressed
    pa.field("properties", columns.PROPERTY_MAP),        # the tables' form: values as strings
    pa.field("property_types", columns.PROPERTY_MAP),    # name -> bool, int32, int64, string, binary
    pa.field("put_time_us", pa.int64()),
    pa.field("delivery_count", pa.int32()),
    pa.field("compression", pa.string()),                # how the payload travelled (null: as it is)
])


@dataclass(frozen=True)
class Message:
    guid: bytes
    payload: bytes
    properties: Mapping[str, PropertyValue]
    queue_uri: str
    delivery_count: int
    sequence: int
    put_time_us: int
    compression: str | None = None    # how the payload travelled; `payload` is always decompressed
    _queue: "Queue | None" = field(default=None, repr=False, compare=False)

    @property
    def redelivered(self) -> bool:
        return self.delivery_count > 1

    @property
    def guid_hex(self) -> str:
        """The GUID as Taproot writes it everywhere (uppercase hex, as the
        tables' `guid_hex` column and the CLI)."""
        return guid_hex(self.guid)

    def confirm(self) -> None:
        assert self._queue is not None, "message not attached to a queue"
        self._queue.confirm(self)


_FIELDS = tuple(f.name for f in fields(Message))
_new = object.__new__
_set = object.__setattr__


def _message(guid: bytes, payload: bytes, properties: Mapping[str, PropertyValue], queue_uri: str,
             delivery_count: int, sequence: int, put_time_us: int, compression: str | None,
             queue: "Queue") -> Message:
    """`Message(...)` with every field given, made without the frozen
    dataclass's `__init__` (an `object.__setattr__` a field: 1.7 us a message
    against 0.8). The same object: equal, hashed and printed alike, and as
    frozen (`tests/test_message.py`)."""
    message = _new(Message)
    _set(message, "__dict__", dict(zip(_FIELDS, (guid, payload, properties, queue_uri, delivery_count, sequence,
                                                 put_time_us, compression, queue))))
    return message


def _no_entries(column: "pa.ChunkedArray") -> bool:
    """A map (list) column whose rows are all empty or null."""
    for chunk in column.chunks:
        offsets = chunk.offsets
        if len(offsets) and offsets[len(offsets) - 1].as_py() != offsets[0].as_py():
            return False
    return True


class MessageBatch:
    """Pushed messages of one queue as one Arrow table (`BATCH_SCHEMA`), in
    push order: for consumers that process columns (Spark, pandas, Arrow
    compute) rather than one message at a time. `confirm()` confirms them
    all with one CONFIRM frame of seq ranges; `confirm(rows)` some of them."""

    __slots__ = ("table", "queue")

    def __init__(self, table: pa.Table, queue: "Queue"):
        self.table = table
        self.queue = queue

    def __len__(self) -> int:
        return int(self.table.num_rows)

    def __repr__(self) -> str:
        return f"MessageBatch({self.queue.uri}, rows={len(self)})"

    @property
    def seqs(self) -> np.ndarray:
        seqs: np.ndarray = self.table["seq"].to_numpy()
        return seqs

    def messages(self) -> list[Message]:
        """The rows as `Message`s (the per-message view of the batch)."""
        return table_messages(self.table, self.queue)

    def confirm(self, rows: Sequence[int] | slice | None = None) -> None:
        """Confirm every message of the batch, or the rows named (indexes or a slice)."""
        seqs = self.seqs
        if rows is not None:
            seqs = seqs[rows] if isinstance(rows, slice) else seqs[np.asarray(rows, dtype=np.int64)]
        self.queue._confirm_seqs(seqs.tolist())


class Rows:
    """A decoded PUSH frame waiting in a queue's inbox, from row `offset` on."""

    __slots__ = ("table", "offset")

    def __init__(self, table: pa.Table, offset: int = 0):
        self.table, self.offset = table, offset

    def __len__(self) -> int:
        return int(self.table.num_rows) - self.offset

    def take(self, count: int) -> tuple[pa.Table, "Rows | None"]:
        """The next `count` rows (at most), and what is left (None: nothing)."""
        n = min(count, len(self))
        taken = self.table.slice(self.offset, n)
        return taken, (Rows(self.table, self.offset + n) if n < len(self) else None)


def received_table(push: pa.Table, uri: str) -> pa.Table:
    """A PushColumns body (`columns.PUSH_SCHEMA`) as `BATCH_SCHEMA`: payloads
    decompressed, compression as its name. A payload that does not
    decompress is kept as received (logged), so the application can see and
    dead-letter it."""
    codes = push["compression"]
    payload, names = push["payload"], pa.nulls(push.num_rows, pa.string())
    if pc.any(pc.not_equal(codes, 0)).as_py():
        code_list = codes.to_pylist()
        guids = push["guid"].to_pylist()
        payload = pa.array([p if not c else decompressed(uri, g, p, c) for p, c, g in zip(
            payload.to_pylist(), code_list, guids)], pa.binary())
        names = pa.array([COMPRESSION_NAMES.get(c) for c in code_list], pa.string())
    return pa.Table.from_arrays([push["guid"], push["seq"], payload, push["properties"], push["property_types"],
                                 push["put_time_us"], push["delivery_count"], names], schema=BATCH_SCHEMA)


def table_messages(table: pa.Table, queue: "Queue") -> list[Message]:
    """`BATCH_SCHEMA` rows as `Message`s of `queue`."""
    return TableRows(table).messages(queue, 0, table.num_rows)


class TableRows:
    """A `BATCH_SCHEMA` table, its columns listed as Python lists once, when
    first needed: a PUSH frame spanning many queues of a session (or going
    to several of its broadcast consumers) gives each callback queue its
    rows from these (`messages`), not a `to_pylist` per column per queue."""

    __slots__ = ("table", "_columns")

    def __init__(self, table: pa.Table):
        self.table = table
        self._columns: list[list[Any] | None] | None = None

    def _listed(self) -> list[list[Any] | None]:
        """The columns as Python lists, made on the first call."""
        if self._columns is None:
            table = self.table
            # A column with nothing in it (no properties, no compression: most
            # frames) is not listed a row at a time: None, read as all None.
            bare = _no_entries(table["properties"])
            self._columns = [table[name].to_pylist() for name in (
                "guid", "seq", "payload", "put_time_us", "delivery_count")] + [
                None if bare else table["properties"].to_pylist(),
                None if bare else table["property_types"].to_pylist(),
                None if table["compression"].null_count == table.num_rows else table["compression"].to_pylist()]
        return self._columns

    def messages(self, queue: "Queue", start: int, count: int) -> list[Message]:
        """Rows `start` to `start + count` as `Message`s of `queue`."""
        stop = start + count
        return self._made((None if column is None else column[start:stop] for column in self._listed()),
                          repeat(queue, count))

    def messages_of_rows(self, row_queues: "Sequence[Queue | None]") -> list[Message]:
        """Every row as a `Message` of its queue (`row_queues`, one per row;
        None: the row is left out), in one pass: a frame spanning thousands
        of queues, a row or two each, is not sliced queue by queue."""
        return self._made(iter(self._listed()), row_queues)

    @staticmethod
    def _made(columns: Iterator[list[Any] | None], queues: "Iterable[Queue | None]") -> list[Message]:
        """`Message`s from the listed columns (None: a column of all None)
        and each row's queue, the rows whose queue is None left out."""
        nothing = repeat(None)
        return [_message(guid, payload, from_wire(maps_to_wire(value, kinds)) if value else {}, queue.uri, count_,
                         seq, put_time_us, codec, queue)
                for guid, seq, payload, put_time_us, count_, value, kinds, codec, queue in zip(
                    *(nothing if column is None else column for column in columns), queues)
                if queue is not None]


def messages_table(messages: Sequence[Message]) -> pa.Table:
    """`Message`s (those that came one by one) as `BATCH_SCHEMA` rows."""
    maps = [wire_to_maps(to_wire(m.properties)) if m.properties else (None, None) for m in messages]
    return pa.table({
        "guid": pa.array([m.guid for m in messages], pa.binary()),
        "seq": pa.array([m.sequence for m in messages], pa.int64()),
        "payload": pa.array([m.payload for m in messages], pa.binary()),
        "properties": pa.array([v for v, _ in maps], columns.PROPERTY_MAP),
        "property_types": pa.array([t for _, t in maps], columns.PROPERTY_MAP),
        "put_time_us": pa.array([m.put_time_us for m in messages], pa.int64()),
        "delivery_count": pa.array([m.delivery_count for m in messages], pa.int32()),
        "compression": pa.array([m.compression for m in messages], pa.string()),
    }, schema=BATCH_SCHEMA)


def decompressed(uri: str, guid: bytes, payload: bytes, compression: int) -> bytes:
    """A pushed payload as the producer posted it. One that does not
    decompress is delivered as received, so the application can see and
    dead-letter it."""
    if not compression:
        return payload
    try:
        return decompress(payload, compression)
    except ValueError as exc:
        log.error("%s: message %s: %s", uri, guid.hex(), exc)
        return payload
