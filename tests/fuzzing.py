"""Inputs for the frame fuzz tier (`test_fuzz_frames.py`), from a seeded
generator: the same seed gives the same scripts, so a failure names the
seed that reproduces it.

A script is what one client sends on one Session stream: serialized
frames, each of them one of
- a frame of any kind with random fields (protobuf reflection over the
  schema: edge integers, odd strings, random bytes, unknown enum values);
- a plausible frame (a real domain's URI, small queue ids, 16-byte GUIDs,
  a valid Arrow batch) with one value pushed out of range;
- a valid frame's bytes flipped, cut, repeated or spliced;
- random bytes.
Half the scripts open a queue properly first, so later frames reach the
handlers behind an open.
"""

from __future__ import annotations

import random

import pyarrow as pa
from google.protobuf.descriptor import FieldDescriptor

from protocol import columns, pb

FD = FieldDescriptor
EDGE_INTS = [0, 1, 2, 3, 7, 2**31 - 1, 2**31, 2**32 - 1, 2**53, 2**63 - 1, 2**64 - 1, -1, -(2**31), -(2**63)]
RANGES = {
    FD.TYPE_INT32: (-(2**31), 2**31 - 1), FD.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FD.TYPE_SFIXED32: (-(2**31), 2**31 - 1), FD.TYPE_UINT32: (0, 2**32 - 1), FD.TYPE_FIXED32: (0, 2**32 - 1),
    FD.TYPE_INT64: (-(2**63), 2**63 - 1), FD.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FD.TYPE_SFIXED64: (-(2**63), 2**63 - 1), FD.TYPE_UINT64: (0, 2**64 - 1), FD.TYPE_FIXED64: (0, 2**64 - 1),
}
URIS = ["taproot://demo/fuzz", "taproot://prio/fuzz", "taproot://fan/fuzz?id=app1", "taproot://bcast/fuzz",
        "taproot://quota/fuzz", "taproot://nosuch/fuzz", "taproot://demo/", "taproot:///x", "demo/fuzz",
        "taproot://demo/fuzz?id=", "taproot://demo/fuzz?id=app1&id=app2", "taproot://DEMO/Fuzz",
        "taproot://demo/" + "q" * 5000, "taproot://demo/fuzz\x00", "taproot://d\u00e9mo/fuzz", ""]
STRINGS = ["", "x", "region", "a" * 300, "\u00e9\u6f22\U0001f600", "\x00", "' OR 1=1 --", "a > 1 AND",
           "region = 'EU'", "(" * 500, "NaN"]
KINDS = [f.name for f in pb.Frame.DESCRIPTOR.oneofs_by_name["body"].fields]
CLIENT_KINDS = ["open_queue", "configure_queue", "close_queue", "put", "put_columns", "confirm", "stop_request",
                "stop_response", "heartbeat"]


def random_int(rng: random.Random, field_type: int) -> int:
    lo, hi = RANGES[field_type]
    value = rng.choice(EDGE_INTS) if rng.random() < 0.5 else rng.randint(lo, hi) if rng.random() < 0.3 \
        else rng.randint(0, 10)
    return min(max(value, lo), hi)


def random_value(rng: random.Random, field: FieldDescriptor, depth: int) -> object:
    t = field.type
    if t in RANGES:
        return random_int(rng, t)
    if t == FD.TYPE_BOOL:
        return rng.random() < 0.5
    if t in (FD.TYPE_DOUBLE, FD.TYPE_FLOAT):
        return rng.choice([0.0, -1.0, 1e308, float("inf"), float("nan")])
    if t == FD.TYPE_STRING:
        return rng.choice(URIS if field.name == "uri" else STRINGS)
    if t == FD.TYPE_BYTES:
        n = rng.choice([0, 1, 15, 16, 16, 17, 100, 5000])
        return rng.randbytes(n)
    if t == FD.TYPE_ENUM:
        values = [v.number for v in field.enum_type.values]
        return rng.choice(values + [999, -5, 2**31 - 1])
    raise AssertionError(f"no generator for field type {t}")


def fill(rng: random.Random, message: object, depth: int = 0) -> None:
    """Set a random subset of `message`'s fields, recursively."""
    for field in message.DESCRIPTOR.fields:  # type: ignore[attr-defined]
        if field.containing_oneof is not None and rng.random() < 0.7:
            continue
        if rng.random() < 0.4:
            continue
        if field.is_repeated:
            target = getattr(message, field.name)
            for _ in range(rng.choice([0, 1, 2, 5, 50])):
                if field.type == FD.TYPE_MESSAGE:
                    if depth < 3:
                        fill(rng, target.add(), depth + 1)
                else:
                    target.append(random_value(rng, field, depth))
        elif field.type == FD.TYPE_MESSAGE:
            if depth < 3:
                fill(rng, getattr(message, field.name), depth + 1)
                getattr(message, field.name).SetInParent()
        else:
            try:
                setattr(message, field.name, random_value(rng, field, depth))
            except (ValueError, TypeError):
                pass  # e.g. an enum value a closed enum refuses


def random_frame(rng: random.Random) -> pb.Frame:
    frame = pb.Frame()
    kind = rng.choice(KINDS + CLIENT_KINDS * 2)
    fill(rng, getattr(frame, kind))
    getattr(frame, kind).SetInParent()
    return frame


def arrow_batch(rng: random.Random) -> bytes:
    n = rng.choice([0, 1, 3, 100])
    guids = [rng.randbytes(rng.choice([16, 16, 16, 15, 0])) for _ in range(n)]
    table = pa.table({
        "guid": pa.array(guids, pa.binary()),
        "payload": pa.array([rng.randbytes(rng.choice([0, 10, 1000])) for _ in range(n)], pa.binary()),
        "properties": pa.array([rng.choice([None, [("region", "EU")], [("", "x")], [("n", "x" * 70000)]])
                                for _ in range(n)], columns.PROPERTY_MAP),
        "property_types": pa.array([rng.choice([None, [("region", "string")], [("region", "int32")],
                                                [("region", "nope")]]) for _ in range(n)], columns.PROPERTY_MAP),
        "compression": pa.array([rng.choice([None, "zstd", "zlib", "lz4", ""]) for _ in range(n)], pa.string()),
    })
    data = columns.encode(table)
    if rng.random() < 0.3:  # a batch with other columns or types than the schema's
        other = pa.table({"guid": pa.array([1, 2], pa.int64()), "x": pa.array(["a", "b"])})
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, other.schema) as writer:
            writer.write_table(other)
        data = sink.getvalue().to_pybytes()
    return mutate(rng, data) if rng.random() < 0.4 else data


def plausible_frame(rng: random.Random, queue_ids: list[int]) -> pb.Frame:
    queue_id = rng.choice(queue_ids + [0, 99, 2**32 - 1])
    kind = rng.choice(["put", "put", "put_columns", "confirm", "confirm_columns", "configure_queue", "close_queue",
                       "open_queue", "heartbeat", "stop_request"])
    if kind == "put":
        return pb.Frame(put=pb.PutBatch(messages=[pb.PutMessage(
            queue_id=queue_id, guid=rng.randbytes(rng.choice([16, 16, 16, 0, 8, 32])),
            payload=rng.randbytes(rng.choice([0, 10, 1000]) if rng.random() < 0.97 else 5 * 1024 * 1024),
            properties=[pb.Property(name=rng.choice(STRINGS), int32_value=rng.choice([0, -1, 2**31 - 1]))
                        for _ in range(rng.choice([0, 1, 2, 200]))],
            put_time_us=rng.choice([0, 1, -1, 10**16, 2**63 - 1, -(2**63), 1_700_000_000_000_000]),
            compression=rng.choice([0, 0, 1, 2, 7]))  # type: ignore[arg-type]
            for _ in range(rng.choice([1, 1, 2, 20]))]))
    if kind == "put_columns":
        # Of one queue, or spanning queues: ids per row, some not open, the list short or long.
        queue_ids = rng.choice([[], [], [rng.choice([queue_id, 0, 2**32 - 1, rng.randint(1, 9)])
                                         for _ in range(rng.choice([1, 2, 3, 50]))]])
        return pb.Frame(put_columns=pb.PutColumns(queue_id=queue_id, arrow_ipc=arrow_batch(rng),
                                                  per_message=rng.random() < 0.7 if queue_ids else False,
                                                  queue_ids=queue_ids))
    if kind == "confirm":
        return pb.Frame(confirm=pb.ConfirmBatch(messages=[
            pb.ConfirmMessage(queue_id=queue_id, guid=rng.randbytes(rng.choice([16, 0, 3])),
                              sequence=rng.choice([0, 1, -1, 2**63 - 1, rng.randint(0, 500)]))
            for _ in range(rng.choice([1, 5]))]))
    if kind == "confirm_columns":
        ranges = rng.choice([1, 2, 50])
        # Of one queue, or each range of its own (some not open, some lists short or long).
        queue_ids = rng.choice([[], [], [rng.choice([queue_id, 0, 2**32 - 1, rng.randint(1, 9)])
                                         for _ in range(ranges + rng.choice([0, 0, 0, 1, -1]))]])
        return pb.Frame(confirm_columns=pb.ConfirmColumns(
            queue_id=queue_id, starts=[rng.choice([0, -1, 2**62, rng.randint(0, 500)]) for _ in range(ranges)],
            counts=[rng.choice([0, 1, 1000, 2**32 - 1]) for _ in range(ranges + rng.choice([0, 0, 1, -1]))],
            queue_ids=queue_ids))
    if kind == "configure_queue":
        return pb.Frame(configure_queue=pb.ConfigureQueue(request_id=rng.randint(1, 9), queue_id=queue_id,
                                                          options=options(rng)))
    if kind == "close_queue":
        return pb.Frame(close_queue=pb.CloseQueue(request_id=rng.randint(1, 9), queue_id=queue_id))
    if kind == "open_queue":
        return pb.Frame(open_queue=open_frame(rng, queue_id))
    if kind == "heartbeat":
        return pb.Frame(heartbeat=pb.Heartbeat(sent_time_us=rng.choice([0, -1, 2**63 - 1])))
    return pb.Frame(stop_request=pb.StopRequest(request_id=rng.randint(0, 9),
                                                timeout_ms=rng.choice([0, -1, 2**63 - 1, 100])))


def options(rng: random.Random) -> pb.QueueOptions:
    return pb.QueueOptions(max_unconfirmed_messages=rng.choice([0, 1, -1, 1000, 2**63 - 1, -(2**63)]),
                           max_unconfirmed_bytes=rng.choice([0, 1, -1, 2**63 - 1]),
                           consumer_priority=rng.choice([0, 1, -1, 2**31 - 1, -(2**31)]),
                           subscriptions=rng.sample(STRINGS, rng.choice([0, 1, 2])))


def open_frame(rng: random.Random, queue_id: int, uri: str | None = None) -> pb.OpenQueue:
    read = rng.random() < 0.5
    return pb.OpenQueue(request_id=rng.randint(1, 2**20), queue_id=queue_id, uri=uri or rng.choice(URIS),
                        read=read, write=not read or rng.random() < 0.5,
                        options=options(rng) if rng.random() < 0.5 else None,
                        columnar_push=rng.random() < 0.3)


def mutate(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(len(out)) if out else 0
        op = rng.choice(["flip", "cut", "repeat", "insert", "truncate"])
        if op == "flip" and out:
            out[at] ^= 1 << rng.randrange(8)
        elif op == "cut":
            del out[at:at + rng.randint(1, 16)]
        elif op == "repeat":
            out[at:at] = out[at:at + rng.randint(1, 64)] * rng.randint(1, 8)
        elif op == "insert":
            out[at:at] = rng.randbytes(rng.randint(1, 8))
        else:
            del out[at:]
    return bytes(out)


def script(rng: random.Random) -> list[bytes]:
    """What one stream sends (serialized frames)."""
    frames: list[bytes] = []
    queue_ids = [1]
    if rng.random() < 0.5:
        frames.append(pb.Frame(open_queue=open_frame(
            rng, 1, uri=rng.choice(["taproot://demo/fuzz", "taproot://fan/fuzz?id=app1", "taproot://bcast/fuzz"])
        )).SerializeToString())
    for _ in range(rng.randint(1, 8)):
        roll = rng.random()
        if roll < 0.4:
            frames.append(random_frame(rng).SerializeToString())
        elif roll < 0.84:
            frames.append(plausible_frame(rng, queue_ids).SerializeToString())
        elif roll < 0.96:
            source = random_frame(rng) if rng.random() < 0.5 else plausible_frame(rng, queue_ids)
            frames.append(mutate(rng, source.SerializeToString()))
        else:
            frames.append(rng.randbytes(rng.choice([1, 7, 64, 1000])))
    return frames
