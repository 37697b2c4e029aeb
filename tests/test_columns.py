"""Columnar PUTs: the broker's vectorised checks and the relay's forwarding."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from fuzzing import mutate
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import ResultCode, columns, frames, pb
from protocol.properties import to_wire, wire_to_maps
from replicas.relay import UPSTREAM, Relay


def batch(n=5, **override) -> pa.Table:
    rows = []
    for i in range(n):
        values, types = wire_to_maps(to_wire({"region": "EU", "n": i, "big": 2**40, "f": True, "raw": b"\x00"}))
        rows.append(dict(guid=bytes([i]) * 16, payload=b"x", properties=values, property_types=types,
                         compression=None))
    for key, value in override.items():
        rows[2][key] = value
    return pa.Table.from_pylist(rows, schema=columns.SCHEMA)


@pytest.mark.parametrize("kind, fields", [
    ("push_columns", dict(queue_id=3, count=2, seq_starts=[5, 9], seq_counts=[1, 1], range_queue_ids=[3, 4],
                          arrow_ipc=b"\x01" * 5_000)),
    ("put_columns", dict(queue_id=2, arrow_ipc=b"\x02" * 300, per_message=True, guids=b"g" * 32)),
    ("put_columns", dict(queue_ids=[1, 2], arrow_ipc=b"")),
    ("heartbeat", {}),
])
def test_frames_built_in_place_or_wrapped_are_the_frames_the_constructor_builds(kind, fields):
    body = getattr(pb, {"push_columns": "PushColumns", "put_columns": "PutColumns", "heartbeat": "Heartbeat"}[kind])
    expected = pb.Frame(**{kind: body(**fields)})
    built = frames.frame_of(kind, **fields)
    assert built == expected and built.WhichOneof("body") == kind
    assert built.SerializeToString() == expected.SerializeToString()
    held = body(**fields)
    copy = frames.wrapped(kind, held)
    assert copy == expected
    if kind != "heartbeat":   # the frame has a copy of its own: the held body may change
        held.queue_id = 99
        assert copy == expected


def test_a_valid_batch_round_trips_and_passes():
    table = columns.decode(columns.encode(batch()))
    assert isinstance(table, pa.Table) and columns.check(table, 100) is None
    assert columns.guids_of(table) == b"".join(bytes([i]) * 16 for i in range(5))


@settings(deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=40), st.booleans(), st.sampled_from([0, 1, 2]),
                          st.integers(0, 2**53)), max_size=40))
def test_single_puts_encode_as_the_rows_built_one_by_one(rows):
    """`encode_put_rows` (what a `post()` batch becomes): each PUT's fields
    as its row, a put time of 0 as null, no properties as empty maps; and
    the frame's header parts, the GUIDs joined and the payloads' bytes."""
    from taproot.core import Put
    compressions = {0: None, **{code: name for code, name in columns.COMPRESSION_NAMES.items() if code}}
    codes = sorted(compressions)
    puts = [Put(i.to_bytes(16, "big"), payload, to_wire({"n": i, "s": "x"}) if props else [], put_us,
                codes[code % len(codes)]) for i, (payload, props, code, put_us) in enumerate(rows)]
    body, guids, nbytes = columns.encode_put_rows(puts)
    table = columns.decode(body)
    assert isinstance(table, pa.Table)
    maps = [wire_to_maps(p.properties) if p.properties else ([], []) for p in puts]
    assert table.to_pylist() == [
        dict(guid=p.guid, payload=p.payload, properties=v, property_types=t,
             compression=compressions[p.compression], put_time_us=p.put_time_us or None)
        for p, (v, t) in zip(puts, maps)]
    assert guids == b"".join(p.guid for p in puts) and nbytes == sum(len(p.payload) for p in puts)
    if puts:
        assert columns.check(table, 100) is None


@pytest.mark.parametrize("override, reason", [
    (dict(guid=b"short"), "16 bytes"),
    (dict(payload=b"y" * 101), "max_payload_bytes"),
    (dict(compression="lz4"), "compression"),
    (dict(properties=[("_x", "1")], property_types=[("_x", "string")]), "starting with a letter"),
    (dict(properties=[("a", "1"), ("a", "2")], property_types=[("a", "int32"), ("a", "int32")]), "twice"),
    (dict(properties=[("a", "x")], property_types=[("a", "int32")]), "invalid int32"),
    (dict(properties=[("a", "3000000000")], property_types=[("a", "int32")]), "out of range"),
    (dict(properties=[("a", "yes")], property_types=[("a", "bool")]), "invalid bool"),
    (dict(properties=[("a", "1")], property_types=[("a", "float")]), "a type among"),
    (dict(properties=[("a", "1")], property_types=[("b", "int32")]), "same properties"),
])
def test_one_bad_message_refuses_the_batch_with_the_reason(override, reason):
    assert reason in (columns.check(batch(**override), 100) or "")


def test_undecodable_frames_say_why():
    assert "not an Arrow IPC stream" in columns.decode(b"garbage")
    assert "lacks column" in columns.decode(columns.encode(batch()).replace(b"payload", b"paylaod"))


@settings(deadline=None)
@given(st.integers(0, 2**64), st.sampled_from(["put", "push"]))
def test_any_mutation_of_a_columnar_frame_decodes_or_says_why(seed, kind):
    """Fuzz: bytes from a peer never raise out of decode or check (a bit
    flip once made Arrow raise ArrowNotImplementedError, which the node
    answered as an internal error)."""
    valid = columns.encode(batch()) if kind == "put" else columns.encode_push_table(columns.push_table(
        [b"g" * 16] * 3, [1, 2, 3], [b"p"] * 3, [None] * 3, [None] * 3, [0] * 3, [1] * 3, [0] * 3))
    data = mutate(random.Random(seed), valid)
    if kind == "push":
        assert isinstance(columns.decode_push(data), (pa.Table, str))
        return
    table = columns.decode(data)
    if isinstance(table, pa.Table) and table.num_rows:
        reason = columns.check(table, 100)
        assert reason is None or isinstance(reason, str)


def test_every_flipped_bit_of_a_columnar_frame_decodes_or_says_why():
    """Exhaustive over single bit flips: before, some raised
    UnicodeDecodeError (a field name) out of decode."""
    data = bytearray(columns.encode(batch()))
    reasons = set()
    for at in range(len(data)):
        for bit in range(8):
            data[at] ^= 1 << bit
            result = columns.decode(bytes(data))
            data[at] ^= 1 << bit
            if isinstance(result, str):
                reasons.add(result.split(":")[0])
            else:
                assert isinstance(result, pa.Table)
    assert "arrow_ipc is not an Arrow IPC stream" in reasons


def test_relay_forwards_columns_up_routes_their_ack_back_and_resends_them_after_failover():
    relay = Relay()
    (_, up), = relay.from_downstream("A", pb.Frame(open_queue=pb.OpenQueue(
        request_id=1, queue_id=3, uri="taproot://d/q", write=True)))
    qid = up.open_queue.queue_id
    relay.from_upstream(pb.Frame(open_queue_response=pb.OpenQueueResponse(request_id=up.open_queue.request_id,
                                                                          queue_id=qid, status=pb.Status())))
    data = columns.encode(batch())
    guids = columns.guids_of(batch())
    (dest, frame), = relay.from_downstream("A", pb.Frame(put_columns=pb.PutColumns(queue_id=3, arrow_ipc=data)))
    assert dest == UPSTREAM and frame.put_columns.queue_id == qid and relay.unacked_count == 5
    (dest, frame), = relay.from_upstream(pb.Frame(ack_columns=pb.AckColumns(queue_id=qid, guids=guids)))
    assert dest == "A" and frame.ack_columns.queue_id == 3 and relay.unacked_count == 0

    relay.from_downstream("A", pb.Frame(put_columns=pb.PutColumns(queue_id=3, arrow_ipc=data)))
    assert relay.upstream_lost() == []
    (_, reopen), = relay.upstream_restored()
    (dest, frame), = relay.from_upstream(pb.Frame(open_queue_response=pb.OpenQueueResponse(
        request_id=reopen.open_queue.request_id, queue_id=qid, status=pb.Status())))
    assert dest == UPSTREAM and frame.put_columns.arrow_ipc == data
    (dest, frame), = relay.from_downstream("A", pb.Frame(put_columns=pb.PutColumns(queue_id=9, arrow_ipc=data)))
    # A queue that is not open: every GUID still gets an answer, never silence.
    assert (frame.ack_columns.code, frame.ack_columns.guids) == (ResultCode.INVALID_ARGUMENT, guids)


def test_warm_up_pays_pyarrows_first_call_import_once_on_a_thread_of_its_own():
    """A process's first `pa.array` imports pandas (apache/arrow#34994). A
    session starts that import on a thread before it dials, so no frame
    waits on it; a second call starts no second thread."""
    import subprocess
    import sys

    script = """
import sys, threading
from taproot import session
assert "pandas" not in sys.modules, "already imported before the warm-up"
session._warm_up_arrow_in_background()
session._warm_up_arrow_in_background()
warmers = [t for t in threading.enumerate() if t.name == "taproot-arrow-warm-up"]
for t in warmers:
    t.join(30)
print(len(session._arrow_warm_up), "pandas" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "True"]
