"""Columnar frames: many messages to one queue as one Arrow batch.

PUTs (`PutColumns`): the SDK encodes, the broker decodes and checks every
message with the same rules as a single PUT (GUID length, payload size,
property names, types and values, compression), vectorised with pyarrow
compute, so the per-message Python cost leaves the hot path. A frame is
accepted or refused as a whole.

PUSHes (`PushColumns`, `PUSH_SCHEMA`): the primary encodes a run of messages
to one consumer queue; relays forward the bytes; the SDK decodes.
"""

from __future__ import annotations

import functools
from operator import attrgetter
from typing import Any, Mapping, Protocol, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from protocol import taproot_pb2 as pb
from protocol.codes import COMPRESSION_CODES, COMPRESSION_NAMES, ResultCode, wire
from protocol.limits import GUID_LENGTH
from protocol.properties import NAME_LENGTH_MAX, PROPERTIES_MAX, wire_to_maps


class PutRow(Protocol):
    """What `encode_puts` reads of a PUT: a `pb.PutMessage`, or the SDK's
    lighter record of one (`taproot.core.Put`)."""
    @property
    def guid(self) -> bytes: ...
    @property
    def payload(self) -> bytes: ...
    @property
    def properties(self) -> Sequence[pb.Property]: ...
    @property
    def put_time_us(self) -> int: ...
    @property
    def compression(self) -> Any: ...

PROPERTY_MAP = pa.map_(pa.string(), pa.string())
SCHEMA = pa.schema([
    pa.field("guid", pa.binary()),
    pa.field("payload", pa.binary()),
    pa.field("properties", PROPERTY_MAP),
    pa.field("property_types", PROPERTY_MAP),
    pa.field("compression", pa.string()),
])
PUT_SCHEMA = pa.schema([*SCHEMA, pa.field("put_time_us", pa.int64())])   # with the optional column
PUSH_SCHEMA = pa.schema([
    pa.field("guid", pa.binary()),
    pa.field("seq", pa.int64()),
    pa.field("payload", pa.binary()),
    pa.field("properties", PROPERTY_MAP),
    pa.field("property_types", PROPERTY_MAP),
    pa.field("put_time_us", pa.int64()),
    pa.field("delivery_count", pa.int32()),
    pa.field("compression", pa.int8()),        # the wire code (0: none)
])
# Optional in a PutColumns frame: the producer's clock per message (what
# `post()` records; the PUT log's producer_time). Bulk frames leave it out.
PUT_TIME = "put_time_us"
TYPES = ("bool", "int32", "int64", "string", "binary")
COMPRESSIONS = tuple(COMPRESSION_CODES)


def warm_up() -> None:
    """Pay pyarrow's first-call cost now. A process's first `pa.array`
    imports pandas when it is installed (apache/arrow#34994): 140-170 ms on
    the 2-core dev machine, which otherwise lands on the first frame a
    producer posts or a consumer takes, or on a new primary's first commit.
    Servers call it before they serve; a session on a thread of its own."""
    pa.array([b""], pa.binary())


# Given, so that a writer does not read its defaults from the environment
# (six lookups of os.environ, about 6 us a frame).
_IPC_OPTIONS = pa.ipc.IpcWriteOptions()


def _ipc(schema: pa.Schema, table: pa.Table | pa.RecordBatch) -> bytes:
    """`table` as one Arrow IPC stream of `schema` (a frame's body)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema, options=_IPC_OPTIONS) as writer:
        writer.write(table)
    data: bytes = sink.getvalue().to_pybytes()
    return data


def encode(table: pa.Table) -> bytes:
    """A PutColumns body: `SCHEMA`'s columns, and `put_time_us` if `table` has it."""
    schema = PUT_SCHEMA if PUT_TIME in table.column_names else SCHEMA
    return _ipc(schema, table.select(schema.names).cast(schema))


def encode_puts(messages: Sequence[PutRow]) -> bytes:
    """One PutColumns body from single PUTs (what `post()` batched), each
    message's fields as its row, its typed properties as the tables' maps."""
    return encode_put_rows(messages)[0]


_GUID, _PAYLOAD, _PROPERTIES = attrgetter("guid"), attrgetter("payload"), attrgetter("properties")
_PUT_TIME_US, _COMPRESSION = attrgetter("put_time_us"), attrgetter("compression")


def encode_put_rows(messages: Sequence[PutRow]) -> tuple[bytes, bytes, int]:
    """`encode_puts`'s body, with the rows' GUIDs joined (the frame's
    `guids`) and their payloads' bytes: what the SDK's frame needs, each
    field read once a message (a paced producer's frames hold tens of PUTs,
    so the fixed cost counts as much as the rows)."""
    count = len(messages)
    guids, payloads = list(map(_GUID, messages)), list(map(_PAYLOAD, messages))
    if any(map(_PROPERTIES, messages)):
        maps = [wire_to_maps(m.properties) if m.properties else ([], []) for m in messages]
        values, types = pa.array([v for v, _ in maps], PROPERTY_MAP), pa.array([t for _, t in maps], PROPERTY_MAP)
    else:
        values = types = _no_properties(count)
    codes = list(map(_COMPRESSION, messages))
    batch = pa.RecordBatch.from_arrays([
        pa.array(guids, pa.binary()),
        pa.array(payloads, pa.binary()),
        values, types,
        (pa.array([COMPRESSION_NAMES.get(c) for c in codes], pa.string()) if any(codes)
         else pa.nulls(count, pa.string())),
        pa.array([t or None for t in map(_PUT_TIME_US, messages)], pa.int64()),
    ], schema=PUT_SCHEMA)
    return _ipc(PUT_SCHEMA, batch), b"".join(guids), sum(map(len, payloads))


@functools.lru_cache(maxsize=256)
def _no_properties(count: int) -> pa.Array:
    """`count` empty property maps (every offset 0), made once a size: an
    array is immutable, and building it from `[[]] * count` cost 13-19 us a
    frame. (Made on first use: a module-level `pa.array` would import pandas
    at import time, `warm_up`.)"""
    empty = pa.array([], pa.string())
    return pa.MapArray.from_arrays(pa.array(np.zeros(count + 1, np.int32)), empty, empty)


def push_table(guids: list[bytes], seqs: list[int], payloads: list[bytes],
               properties: list[list[tuple[str, str]] | None], property_types: list[list[tuple[str, str]] | None],
               put_times_us: list[int], delivery_counts: list[int], compressions: list[int]) -> pa.Table:
    """PUSH rows (`PUSH_SCHEMA`) from per-column lists (one entry per message)."""
    return pa.Table.from_arrays([
        pa.array(guids, pa.binary()), pa.array(seqs, pa.int64()), pa.array(payloads, pa.binary()),
        pa.array(properties, PROPERTY_MAP), pa.array(property_types, PROPERTY_MAP),
        pa.array(put_times_us, pa.int64()), pa.array(delivery_counts, pa.int32()),
        pa.array(compressions, pa.int8()),
    ], schema=PUSH_SCHEMA)


def encode_push_table(table: pa.Table) -> bytes:
    """One PushColumns body from PUSH rows (`PUSH_SCHEMA`)."""
    return _ipc(PUSH_SCHEMA, table)


def push_run_table(table: pa.Table, delivery_count: int) -> pa.Table:
    """PUSH rows (`PUSH_SCHEMA`) from a run's columns (all of them but the
    delivery count, which is the run's): the rows' buffers as they are, with
    no Python object per row."""
    count = table.num_rows
    columns = [pa.array(np.full(count, delivery_count, np.int32)) if name == "delivery_count" else table[name]
               for name in PUSH_SCHEMA.names]
    return pa.Table.from_arrays(columns, schema=PUSH_SCHEMA)


def encode_push_run(table: pa.Table, delivery_count: int) -> bytes:
    """One PushColumns body from a run's columns (`push_run_table`)."""
    return _ipc(PUSH_SCHEMA, push_run_table(table, delivery_count))


def ack_columns(queue_id: int, guids: bytes, code: ResultCode, text: str,
                refused: "Mapping[int, tuple[ResultCode, str]]") -> pb.Frame:
    """The answer to a PutColumns frame: `code` for every row but those a
    per-message frame refused on their own (row -> code and why)."""
    rows = sorted(refused)
    return pb.Frame(ack_columns=pb.AckColumns(
        queue_id=queue_id, guids=guids, code=wire(code), message=text, refused_rows=rows,
        refused_codes=[wire(refused[r][0]) for r in rows], refused_messages=[refused[r][1] for r in rows]))


def read_stream(data: bytes) -> pa.Table | str:
    """The Arrow IPC stream in `data`, checked in full (offsets within
    their buffers, and so on) before any kernel touches it, or why it
    cannot be read. Any bytes may come from a peer: whatever Arrow raises
    on them (invalid, not implemented, wrong type) is a reason, not an error."""
    try:
        table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
        table.validate(full=True)
    except (pa.ArrowException, ValueError, OSError) as exc:   # ValueError: a name that is not UTF-8
        return f"arrow_ipc is not an Arrow IPC stream: {exc}"
    return table


def decode_push(data: bytes) -> pa.Table | str:
    """A PushColumns body, or why it cannot be read."""
    table = read_stream(data)
    if isinstance(table, str):
        return table
    if table.schema != PUSH_SCHEMA:
        return f"arrow_ipc is not a PUSH frame: {table.schema}"
    return table


def guids_of(table: pa.Table) -> bytes:
    """The frame's GUIDs, concatenated, straight from the column's buffers."""
    return joined_values(table["guid"])


def joined_values(column: pa.Array | pa.ChunkedArray) -> bytes:
    """A binary column's values, concatenated (a copy of their bytes only)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if len(column) == 0:
        return b""
    offsets = column.buffers()[1]
    first, last = (int.from_bytes(offsets[4 * i:4 * i + 4], "little", signed=True)
                   for i in (column.offset, column.offset + len(column)))
    data: bytes = column.buffers()[2][first:last].to_pybytes()
    return data


def fixed_width_binary(data: bytes, width: int) -> pa.Array:
    """A binary array over `data` cut into `width`-byte values, without copying them one by one."""
    import numpy as np

    n = len(data) // width
    offsets = np.arange(0, n * width + 1, width, dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def decode(data: bytes) -> pa.Table | str:
    """The batch as `PUT_SCHEMA` (a null `put_time_us` when the frame has
    none), or why it cannot be read (then no GUID is known)."""
    table = read_stream(data)
    if isinstance(table, str):
        return table
    if table.schema.equals(PUT_SCHEMA):
        return table   # what the SDK sends: no select and no cast (45 us a frame, whatever its rows)
    missing = [n for n in SCHEMA.names if n not in table.column_names]
    if missing:
        return f"arrow_ipc lacks column(s) {', '.join(missing)}"
    try:
        if PUT_TIME not in table.column_names:
            table = table.append_column(PUT_TIME, pa.nulls(table.num_rows, pa.int64()))
        return table.select(PUT_SCHEMA.names).cast(PUT_SCHEMA)
    except pa.ArrowException as exc:
        return f"arrow_ipc columns have the wrong types: {exc}"


def check(table: pa.Table, max_payload_bytes: int) -> str | None:
    """Why the batch is refused, or None. Mirrors validate_wire for one PUT."""
    # Few kernels for a frame without properties (a paced producer's frames
    # hold tens of rows, so these calls' fixed cost is most of the check).
    if table.num_rows == 0:
        return "empty batch"
    guid_len = pc.min_max(pc.binary_length(table["guid"]))
    if table["guid"].null_count or guid_len["min"].as_py() != GUID_LENGTH or guid_len["max"].as_py() != GUID_LENGTH:
        return f"every GUID must be {GUID_LENGTH} bytes"
    if table["payload"].null_count:
        return "a payload is null"
    if pc.max(pc.binary_length(table["payload"])).as_py() > max_payload_bytes:
        return f"a payload exceeds the domain's max_payload_bytes {max_payload_bytes}"
    compression = table["compression"]
    if compression.null_count < len(compression) and not pc.all(
            pc.is_in(compression.drop_null(), pa.array(COMPRESSIONS))).as_py():
        return f"compression must be null, {' or '.join(COMPRESSIONS)}"
    props, types = table["properties"].combine_chunks(), table["property_types"].combine_chunks()
    if len(props.keys) == 0 and len(types.keys) == 0:
        return None   # no message has a property (every offset is 0 in both)
    names = pa.ListArray.from_arrays(props.offsets, props.keys)  # a null map reads as no properties
    if (pc.max(pc.list_value_length(names)).as_py() or 0) > PROPERTIES_MAX:
        return f"more than {PROPERTIES_MAX} properties"
    if not (props.offsets.equals(types.offsets) and props.keys.equals(types.keys)):
        return "properties and property_types must name the same properties in the same order"
    keys, values, kinds = props.keys, props.items, types.items
    if len(keys) == 0:
        return None
    if (pc.max(pc.utf8_length(keys)).as_py() > NAME_LENGTH_MAX
            or pc.any(pc.invert(pc.match_substring_regex(keys, "^[A-Za-z0-9]"))).as_py()):
        return f"property names must be 1..{NAME_LENGTH_MAX} characters starting with a letter or digit"
    owner = pc.cast(pc.list_parent_indices(names), pa.string())
    if pc.count_distinct(pc.binary_join_element_wise(owner, keys, "\x00")).as_py() != len(keys):
        return "a property is given twice in one message"
    if pc.any(pc.is_null(values)).as_py() or not pc.all(pc.is_in(kinds, pa.array(TYPES))).as_py():
        return f"every property needs a value and a type among {', '.join(TYPES)}"
    for kind, pattern in (("int32", r"^-?[0-9]{1,10}$"), ("int64", r"^-?[0-9]{1,19}$"),
                          ("bool", r"^(true|false)$"), ("binary", r"^[A-Za-z0-9+/]*={0,2}$")):
        chosen = pc.filter(values, pc.equal(kinds, kind))
        if len(chosen) and not pc.all(pc.match_substring_regex(chosen, pattern)).as_py():
            return f"invalid {kind} property value"
        if kind in ("int32", "int64") and len(chosen):
            lo, hi = (-(2**31), 2**31 - 1) if kind == "int32" else (-(2**63), 2**63 - 1)
            try:
                numbers = pc.cast(chosen, pa.decimal128(20, 0))
            except pa.ArrowInvalid:
                return f"invalid {kind} property value"
            low, high = pc.min(numbers).as_py(), pc.max(numbers).as_py()
            if low < lo or high > hi:
                return f"{kind} property value out of range"
    return None
