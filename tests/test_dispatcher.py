import functools

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from primary.dispatcher import (
    ConfirmedRows,
    ConsumerOptions,
    FrameRun,
    MessageRun,
    QueueDispatcher,
    StoredMessage,
    confirm_ranges,
    spilled_messages,
    take_fresh,
)
from primary.ledger import DENSE_QUEUE_IDS, Ledger, take_fresh_held
from protocol.columns import PROPERTY_MAP, push_table


def guid_of(i: int) -> bytes:
    """Message i's GUID: its byte 16 times under 256 (what the tests below
    name), its number in 16 bytes from there (a long schedule adds more)."""
    return bytes([i]) * 16 if i < 256 else i.to_bytes(16, "big")


def msgs(n, start=0, size=10):
    return [StoredMessage(guid=guid_of(i), seq=i, payload=b"x" * size, properties=[], put_time_us=0)
            for i in range(start, start + n)]


def test_round_robin_between_equal_priority_consumers():
    d = QueueDispatcher()
    d.add_consumer("a", ConsumerOptions())
    d.add_consumer("b", ConsumerOptions())
    pushes = d.add_messages(msgs(4))
    assert [k for k, _ in pushes] == ["a", "b", "a", "b"]
    assert [m.seq for _, m in pushes] == [0, 1, 2, 3]


def test_only_highest_priority_consumers_receive():
    d = QueueDispatcher()
    d.add_consumer("low", ConsumerOptions(priority=1))
    d.add_consumer("hi1", ConsumerOptions(priority=2))
    d.add_consumer("hi2", ConsumerOptions(priority=2))
    pushes = d.add_messages(msgs(4))
    assert [k for k, _ in pushes] == ["hi1", "hi2", "hi1", "hi2"]


def test_consumer_at_capacity_gets_nothing_new_until_it_confirms():
    d = QueueDispatcher()
    d.add_consumer("a", ConsumerOptions(max_unconfirmed_messages=2))
    pushes = d.add_messages(msgs(5))
    assert [m.seq for _, m in pushes] == [0, 1]
    assert d.pending_count == 3
    confirmed, more = d.confirm("a", pushes[0][1].seq)
    assert confirmed.seq == 0
    assert [m.seq for _, m in more] == [2]


def test_zero_limits_pause_the_consumer():
    d = QueueDispatcher()
    d.add_consumer("a", ConsumerOptions(0, 0))
    assert d.add_messages(msgs(3)) == []
    pushes = d.configure_consumer("a", ConsumerOptions(10, 1000))
    assert len(pushes) == 3


def test_byte_limit_applies_but_an_oversized_message_still_reaches_an_idle_consumer():
    d = QueueDispatcher()
    d.add_consumer("a", ConsumerOptions(max_unconfirmed_messages=100, max_unconfirmed_bytes=15))
    pushes = d.add_messages(msgs(3, size=10))
    assert len(pushes) == 2  # 10 bytes < 15 -> second message allowed, then at capacity
    d2 = QueueDispatcher()
    d2.add_consumer("a", ConsumerOptions(max_unconfirmed_messages=100, max_unconfirmed_bytes=5))
    assert len(d2.add_messages(msgs(2, size=10))) == 1


def test_departed_consumer_messages_are_redelivered_in_order_with_count():
    d = QueueDispatcher()
    d.add_consumer("a", ConsumerOptions())
    first = d.add_messages(msgs(3))
    assert all(m.delivery_count == 1 for _, m in first)
    d.add_consumer("b", ConsumerOptions(max_unconfirmed_messages=0, max_unconfirmed_bytes=0))
    assert d.remove_consumer("a") == []  # b is paused: nothing to send yet
    pushes = d.configure_consumer("b", ConsumerOptions())
    assert [m.seq for _, m in pushes] == [0, 1, 2]
    assert all(k == "b" and m.delivery_count == 2 for k, m in pushes)


def test_duplicate_guid_is_not_queued_twice_and_unknown_confirm_is_ignored():
    d = QueueDispatcher()
    d.add_messages(msgs(2))
    d.add_messages(msgs(2))
    assert d.pending_count == 2
    d.add_consumer("a", ConsumerOptions())
    assert d.confirm("a", 999) == (None, [])
    assert d.confirm("nobody", 0) == (None, [])


def test_a_confirm_naming_another_guid_for_the_seq_confirms_nothing():
    d = QueueDispatcher()
    d.add_consumer("a", ConsumerOptions())
    pushed = d.add_messages(msgs(3))
    assert d.confirm("a", 1, b"\xee" * 16) == (None, [])   # seq 1 holds GUID 01..01: not this one
    assert d.unconfirmed_of("a") == [0, 1, 2]
    done, _ = d.confirm_many("a", [2, 1], [pushed[2][1].guid, b""])    # an empty GUID: by seq alone
    assert done.seqs == [2, 1] and d.unconfirmed_of("a") == [0]


# -- subscriptions, TTL, poison pills, broadcast --------------------------------
from protocol.expression import compile_expression  # noqa: E402
from protocol.properties import to_wire  # noqa: E402


def tagged(n, region_of, start=0):
    return [StoredMessage(guid=guid_of(i), seq=i, payload=b"x", properties=to_wire({"region": region_of(i)}),
                          put_time_us=0) for i in range(start, start + n)]


def test_unmatched_messages_wait_for_a_matching_consumer_and_later_ones_pass_them():
    d = QueueDispatcher()
    d.add_consumer("eu", ConsumerOptions(subscriptions=(compile_expression("region = 'EU'"),)))
    pushes = d.add_messages(tagged(6, lambda i: "EU" if i % 2 else "US"))
    assert [(k, m.seq) for k, m in pushes] == [("eu", 1), ("eu", 3), ("eu", 5)]
    assert d.pending_count == 3
    pushes = d.add_consumer("any", ConsumerOptions())
    assert [(k, m.seq) for k, m in pushes] == [("any", 0), ("any", 2), ("any", 4)]


def test_subscriptions_pick_the_highest_priority_among_matching_consumers_only():
    d = QueueDispatcher()
    d.add_consumer("us-hi", ConsumerOptions(priority=5, subscriptions=(compile_expression("region = 'US'"),)))
    d.add_consumer("all-lo", ConsumerOptions(priority=1))
    pushes = d.add_messages(tagged(4, lambda i: "US" if i < 2 else "EU"))
    assert [(k, m.seq) for k, m in pushes] == [("us-hi", 0), ("us-hi", 1), ("all-lo", 2), ("all-lo", 3)]


def test_no_spillover_when_the_matching_top_consumer_is_full():
    d = QueueDispatcher()
    d.add_consumer("hi", ConsumerOptions(max_unconfirmed_messages=1, priority=2,
                                         subscriptions=(compile_expression("region = 'EU'"),)))
    d.add_consumer("lo", ConsumerOptions(priority=1))
    pushes = d.add_messages(tagged(3, lambda i: "EU"))
    assert [(k, m.seq) for k, m in pushes] == [("hi", 0)]
    assert d.pending_count == 2


def test_message_out_of_attempts_is_dropped_when_its_consumer_goes():
    d = QueueDispatcher(max_delivery_attempts=2)
    for attempt in (1, 2):
        d.add_consumer(attempt, ConsumerOptions())
        pushes = d.add_messages(msgs(1)) if attempt == 1 else []
        assert d.unconfirmed_count == 1
        more = d.remove_consumer(attempt)
        assert more == []
        if attempt == 1:
            assert d.take_dropped() == [] and d.pending_count == 1
            assert pushes[0][1].delivery_count == 1
    (message, reason, _), = d.take_dropped()
    assert (message.seq, message.delivery_count, reason) == (0, 2, "max_delivery_attempts")
    assert d.pending_count == 0
    assert d.add_consumer(3, ConsumerOptions()) == []


def test_expired_messages_are_dropped_not_pushed():
    now = [1_000]
    d = QueueDispatcher(clock=lambda: now[0])
    batch = msgs(3)
    batch[0].expires_us, batch[1].expires_us = 1_500, 5_000
    d.add_messages(batch)
    now[0] = 2_000
    d.expire()
    assert [(m.seq, r) for m, r, _ in d.take_dropped()] == [(0, "ttl_expired")]
    now[0] = 6_000
    pushes = d.add_consumer("a", ConsumerOptions())
    assert [m.seq for _, m in pushes] == [2]
    assert [(m.seq, r) for m, r, _ in d.take_dropped()] == [(1, "ttl_expired")]


def test_broadcast_reaches_every_top_priority_matching_consumer_and_keeps_nothing():
    d = QueueDispatcher()
    d.add_consumer("a", ConsumerOptions(priority=1))
    d.add_consumer("b", ConsumerOptions(priority=1))
    d.add_consumer("low", ConsumerOptions(priority=0))
    d.add_consumer("paused", ConsumerOptions(0, 0, priority=1))
    message = msgs(1)[0]
    assert sorted(k for k, _ in d.broadcast(message)) == ["a", "b"]
    assert d.pending_count == 0 and d.unconfirmed_count == 0


# -- confirm_many against per-GUID confirms (the oracle) -------------------------------
@st.composite
def confirm_schedules(draw):
    """Consumers with random windows (count and bytes), random message sizes,
    and a schedule of arrivals and CONFIRM frames; a frame names messages its
    consumer holds when it is sent (picked by index), twice sometimes, and
    GUIDs nobody holds."""
    consumers = draw(st.lists(st.tuples(st.integers(1, 6), st.sampled_from([1 << 30, 25, 60])),
                              min_size=1, max_size=3))
    steps = draw(st.lists(st.one_of(
        st.tuples(st.just("add"), st.integers(1, 8), st.sampled_from([1, 10, 40])),
        st.tuples(st.just("confirm"), st.integers(0, 2), st.lists(st.integers(0, 10), max_size=8),
                  st.integers(0, 2))),
        max_size=25))
    return consumers, steps


def confirm_one_by_one(d: QueueDispatcher, key, seq: int):
    """The one-by-one confirm confirm_many replaced, kept here as the oracle:
    pop the message, give the room back, dispatch."""
    consumer = d._consumers.get(key)
    message = consumer.unconfirmed.pop(seq, None) if consumer is not None else None
    if message is None:
        return None, []
    consumer.unconfirmed_bytes -= message.size
    d._known.discard(message.guid)
    return message, d._dispatch()


@settings(deadline=None)
@given(confirm_schedules())
def test_confirm_many_frees_the_window_as_per_guid_confirms_would(schedule):
    """One dispatch per CONFIRM frame (confirm_many) against one per GUID:
    with one consumer, the same messages confirmed, pushed in the same order
    and left pending; with several (round robin may place a message
    elsewhere), every window respected, pushes in PUT order, and no message
    lost or held twice."""
    consumers, steps = schedule
    dispatchers = {"oracle": QueueDispatcher(), "batched": QueueDispatcher()}
    pushed: dict[str, list[int]] = {name: [] for name in dispatchers}
    confirmed: dict[str, list[int]] = {name: [] for name in dispatchers}
    added = 0
    for i, (window, window_bytes) in enumerate(consumers):
        for d in dispatchers.values():
            d.add_consumer(i, ConsumerOptions(window, window_bytes))
    for step in steps:
        if step[0] == "add":
            _, count, size = step
            for name, d in dispatchers.items():
                pushed[name] += [m.seq for _, m in d.add_messages(msgs(count, start=added, size=size))]
            added += count
            continue
        _, who, picks, unknown = step
        key = who % len(consumers)
        for name, d in dispatchers.items():
            held = d.unconfirmed_of(key)
            seqs = [held[i % len(held)] for i in picks if held] + [10_000 + j for j in range(unknown)]
            if name == "oracle":
                for seq in seqs:
                    stored, more = confirm_one_by_one(d, key, seq)
                    confirmed[name] += [stored.seq] if stored else []
                    pushed[name] += [m.seq for _, m in more]
            else:
                stored_all, more = d.confirm_many(key, seqs)
                confirmed[name] += stored_all.seqs
                pushed[name] += [m.seq for _, m in more]
        if len(consumers) == 1:
            assert confirmed["batched"] == confirmed["oracle"]
            assert pushed["batched"] == pushed["oracle"]
            assert dispatchers["batched"].pending_count == dispatchers["oracle"].pending_count
    for name, d in dispatchers.items():
        assert pushed[name] == sorted(pushed[name]) == list(range(len(pushed[name])))  # PUT order, once each
        assert len(set(confirmed[name])) == len(confirmed[name]) and set(confirmed[name]) <= set(pushed[name])
        assert d.unconfirmed_count + len(confirmed[name]) == len(pushed[name])
        assert d.pending_count + len(pushed[name]) == added
        for k, (window, window_bytes) in enumerate(consumers):
            held = d._consumers[k]
            assert len(held.unconfirmed) <= window
            if len(held.unconfirmed) > 1:   # one message over the byte window may go to an idle consumer
                assert held.unconfirmed_bytes - max(m.size for m in held.unconfirmed.values()) < window_bytes


# -- runs (columnar frames) against the per-message path (the oracle) -----------------------
def run_of(messages: list[StoredMessage]) -> MessageRun:
    """The MessageRun the express lane would make of these messages."""
    table = pa.table({
        "guid": pa.array([m.guid for m in messages], pa.binary()),
        "seq": pa.array([m.seq for m in messages], pa.int64()),
        "payload": pa.array([m.payload for m in messages], pa.binary()),
        "properties": pa.nulls(len(messages), PROPERTY_MAP),
        "property_types": pa.nulls(len(messages), PROPERTY_MAP),
        "put_time_us": pa.array([m.put_time_us for m in messages], pa.int64()),
        "compression": pa.array([m.compression for m in messages], pa.int8()),
    })
    return MessageRun(table, [m.guid for m in messages], [m.seq for m in messages], [m.size for m in messages])


def expanded(pushes) -> list[tuple[object, int, int]]:
    """(consumer, seq, delivery count) per message pushed, runs row by row."""
    out = []
    for key, item in pushes:
        if isinstance(item, MessageRun):
            out += [(key, seq, item.delivery_count) for seq in item.seqs]
        else:
            out.append((key, item.seq, item.delivery_count))
    return out


@st.composite
def run_schedules(draw):
    """Consumers with random windows; frames of random sizes arriving; CONFIRM
    frames naming held messages (and unknown GUIDs); consumers leaving (their
    messages redelivered) and coming back; sometimes a delivery-attempt limit."""
    consumers = draw(st.lists(st.tuples(st.integers(1, 12), st.sampled_from([1 << 30, 25, 60, 300])),
                              min_size=1, max_size=3))
    attempts = draw(st.sampled_from([0, 0, 2]))
    steps = draw(st.lists(st.one_of(
        st.tuples(st.just("add"), st.integers(1, 30), st.sampled_from([1, 10, 40])),
        st.tuples(st.just("confirm"), st.integers(0, 2), st.lists(st.integers(0, 30), max_size=15),
                  st.integers(0, 2)),
        st.tuples(st.just("leave"), st.integers(0, 2))),
        max_size=30))
    return consumers, attempts, steps


@settings(deadline=None)
@given(run_schedules())
def test_runs_dispatch_as_messages_do(schedule):
    """A frame added as one MessageRun against the same frame as
    StoredMessages: the same messages pushed to the same consumers in the
    same order with the same delivery counts, the same confirmed, dropped and
    left pending (a run goes whole only to a sole taker; with several it is
    dispatched row by row, as round robin alternates per message); every
    window respected, and no message lost or held twice. The oracle picks
    a consumer per message even when there is one (`sole_consumer_path`
    off)."""
    consumers, attempts, steps = schedule
    dispatchers = {name: QueueDispatcher(max_delivery_attempts=attempts) for name in ("oracle", "runs")}
    dispatchers["oracle"].sole_consumer_path = False   # every message through `_pick`
    pushed: dict[str, list[tuple[object, int, int]]] = {name: [] for name in dispatchers}
    confirmed: dict[str, list[int]] = {name: [] for name in dispatchers}
    dropped: dict[str, list[int]] = {name: [] for name in dispatchers}
    added = 0
    for name, d in dispatchers.items():
        for i, (window, window_bytes) in enumerate(consumers):
            pushed[name] += expanded(d.add_consumer(i, ConsumerOptions(window, window_bytes)))
    for step in steps:
        for name, d in dispatchers.items():
            if step[0] == "add":
                batch = msgs(step[1], start=added, size=step[2])
                pushed[name] += expanded(d.add_messages(batch if name == "oracle" else [run_of(batch)]))
            elif step[0] == "confirm":
                key = step[1] % len(consumers)
                held = d.unconfirmed_of(key)
                seqs = [held[i % len(held)] for i in step[2] if held] + [10_000 + j for j in range(step[3])]
                done, more = d.confirm_many(key, seqs)
                confirmed[name] += done.seqs
                pushed[name] += expanded(more)
            else:
                key = step[1] % len(consumers)
                pushed[name] += expanded(d.remove_consumer(key))
                pushed[name] += expanded(d.add_consumer(key, ConsumerOptions(*consumers[key])))
            dropped[name] += [m.seq for m, _, _ in d.take_dropped()]
        if step[0] == "add":
            added += step[1]
        assert pushed["runs"] == pushed["oracle"]
        assert confirmed["runs"] == confirmed["oracle"] and dropped["runs"] == dropped["oracle"]
        assert dispatchers["runs"].pending_count == dispatchers["oracle"].pending_count
    for name, d in dispatchers.items():
        firsts = [seq for _, seq, count in pushed[name] if count == 1]
        assert firsts == sorted(firsts) and len(set(firsts)) == len(firsts)   # first deliveries in PUT order, once
        for k in range(len(consumers)):
            mine = [seq for key, seq, count in pushed[name] if key == k and count == 1]
            assert mine == sorted(mine)
        assert len(set(confirmed[name])) == len(confirmed[name])
        assert d.unconfirmed_count + len(confirmed[name]) + len(set(dropped[name])) + d.pending_count == added
        for k, (window, window_bytes) in enumerate(consumers):
            held = d._consumers[k]
            assert len(held.unconfirmed) <= window
            sizes = [h[0].sizes[h[1]] if isinstance(h, tuple) else h.size for h in held.unconfirmed.values()]
            assert held.unconfirmed_bytes == sum(sizes)
            if len(sizes) > 1:   # one message over the byte window may go to an idle consumer
                assert held.unconfirmed_bytes - max(sizes) < window_bytes


def test_a_run_splits_at_the_window_and_the_rest_waits():
    d = QueueDispatcher()
    d.add_consumer("a", ConsumerOptions(max_unconfirmed_messages=3))
    pushes = d.add_messages([run_of(msgs(10))])
    assert len(pushes) == 1 and pushes[0][1].seqs == [0, 1, 2] and d.pending_count == 7
    done, more = d.confirm_many("a", [1])
    assert done == ([bytes([1]) * 16], [1]) and [m.seqs for _, m in more] == [[3]]
    again = d.remove_consumer("a")
    assert again == [] and d.pending_count == 9
    assert [(m.seqs, m.delivery_count) for m in d._pending] == [([0, 2], 1), ([3], 1), ([4, 5, 6, 7, 8, 9], 0)]


# -- many queues' new messages in one pass (`take_fresh`) against add_messages per queue ---------
@st.composite
def fresh_schedules(draw, roomy=False):
    """Queues, each with one to two consumers (random windows, a subscription
    sometimes, or none at all); frames of messages spread over the queues
    (some GUIDs seen before, some expired), sometimes two frames in one pass;
    CONFIRM frames of a queue or a few; consumers leaving and coming back.
    `roomy`: windows mostly wide, so that queues stay plain (a ledger's)."""
    windows = [2, 8, 30, 1 << 30] if roomy else [0, 1, 2, 3, 5, 8]
    window_bytes = [1 << 30, 1 << 30, 300] if roomy else [1 << 30, 25, 300]
    consumer = st.tuples(st.sampled_from(windows), st.sampled_from(window_bytes),
                         st.sampled_from([False, False, True, *([False] * 3 * roomy)]))
    queues = draw(st.lists(st.one_of(st.lists(consumer, min_size=1, max_size=1), st.lists(consumer, max_size=2))
                           if roomy else st.lists(consumer, max_size=2), min_size=1, max_size=4))
    expiries = [0, 0, 0, 0, 500, 5000] if roomy else [0, 0, 500, 5000]
    steps = draw(st.lists(st.one_of(
        st.tuples(st.just("frames"), st.lists(st.lists(st.tuples(
            st.integers(0, 3), st.sampled_from([1, 10, 40]), st.sampled_from(expiries),
            st.integers(0, 6)), min_size=1, max_size=12), min_size=1, max_size=3)),
        st.tuples(st.just("confirm"), st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1),
                                                         st.lists(st.integers(0, 20), max_size=6)),
                                               min_size=1, max_size=3)),
        st.tuples(st.just("leave"), st.integers(0, 3), st.integers(0, 1)),
        st.tuples(st.just("own"))),
        max_size=25))
    return queues, steps


def _per_row(pushes):
    """Pushes as (consumer, seq, delivery count) a message: a run's rows are
    held as a frame's and come back as one run when a consumer leaves."""
    return [(k, seq, m.delivery_count) for k, m in pushes
            for seq in (m.seqs if isinstance(m, MessageRun) else [m.seq])]


def _frame_runs(messages):
    """A frame's rows as `_Fresh` makes them: one MessageRun delivered once
    per expiry, every one sharing the frame's columns; the run of each row."""
    maps = [m.property_maps for m in messages]
    first = FrameRun(push_table([m.guid for m in messages], [m.seq for m in messages], [m.payload for m in messages],
                                [v for v, _ in maps], [t for _, t in maps], [0] * len(messages), [1] * len(messages),
                                [0] * len(messages)),
                     [m.guid for m in messages], [m.seq for m in messages], [m.size for m in messages], 1, 0, made_us=1)
    by_expiry = {}
    return [by_expiry.setdefault(m.expires_us, first.sharing(m.expires_us)) for m in messages]


class _Evens:
    text = "n % 2 = 0"

    def matches(self, properties):
        return properties.get("n", 0) % 2 == 0


@pytest.mark.parametrize("held", [False, True], ids=["dispatchers", "ledger"])
@settings(deadline=None, max_examples=2 * settings().max_examples)   # twice the tier's (conftest)
@given(data=st.data())
def test_fresh_messages_of_many_queues_dispatch_as_add_messages_does(held, data):
    """`take_fresh` with what it spills handed to `add_messages`, as the
    partition does, against `add_messages` queue by queue with each queue's
    messages of the pass (the oracle, each message through `_pick`): per queue the same pushes (consumer, seq,
    delivery count) in the same order, the same confirmed, dropped and
    pending, the same held bytes. `held`: the fresh side's dispatchers
    with a `Ledger`, as a partition's are: rows of plain dispatchers held
    there (`take_fresh_held`), their CONFIRMs confirmed there
    (`Ledger.confirm_slots`), their rows back in their dispatchers when anything
    else happens to them. (Their GUIDs are new: the partition's GUID
    history sees to that.)"""
    queues, steps = data.draw(fresh_schedules(roomy=held))
    now = 1000
    sides = {name: [QueueDispatcher(clock=lambda: now) for _ in queues] for name in ("oracle", "fresh")}
    for d in sides["oracle"]:
        d.sole_consumer_path = False
    ledger = Ledger()
    if held:
        for q, d in enumerate(sides["fresh"]):
            d.attach(ledger, q)
    pushed = {name: [[] for _ in queues] for name in sides}
    confirmed = {name: [[] for _ in queues] for name in sides}
    dropped = {name: [[] for _ in queues] for name in sides}

    def options(window, window_bytes, evens):
        return ConsumerOptions(window, window_bytes, subscriptions=[_Evens()] if evens else ())

    for name, ds in sides.items():
        for q, consumers in enumerate(queues):
            for c, spec in enumerate(consumers):
                pushed[name][q] += _per_row(ds[q].add_consumer((q, c), options(*spec)))
    seq = 0
    for step in steps:
        if step[0] == "frames":
            frames = []
            for frame in step[1]:
                rows = []
                for queue, size, expires, n in sorted(frame, key=lambda row: row[0] % len(queues)):
                    guid = (seq if n or held else max(seq - 1, 0)).to_bytes(16, "big")   # n == 0: the GUID before
                    rows.append((queue % len(queues), guid, seq, size, expires, n))
                    seq += 1
                frames.append(rows)
            for name, ds in sides.items():
                made = [[(q, StoredMessage(guid, s, b"x" * size, to_wire({"n": n}), expires_us=expires))
                         for q, guid, s, size, expires, n in rows] for rows in frames]
                if name == "oracle":   # each queue's messages of the pass in one call, as a commit's targets
                    every = [row for rows in made for row in rows]
                    for q in sorted({q for q, _ in every}):
                        pushed[name][q] += [(k, m.seq, m.delivery_count)
                                            for k, m in ds[q].add_messages([m for p, m in every if p == q])]
                    continue
                spilled: set[QueueDispatcher] = set()
                rest: dict[int, list[StoredMessage]] = {}
                for rows in made:   # each frame as the partition holds it: a run a TTL, sharing the columns
                    runs = _frame_runs([m for _, m in rows])
                    positions = list(range(len(rows)))
                    take = functools.partial(take_fresh_held, ledger) if held else take_fresh
                    taken, keys, left = take([ds[q] for q, _ in rows], runs, positions, now, spilled)
                    for n, key in zip(taken, keys):
                        q, m = rows[n]
                        assert key[0] == q
                        pushed[name][q].append((key, m.seq, runs[n].delivery_count))
                    for n, message in zip(left, spilled_messages(runs, positions, left)):
                        want = rows[n][1]
                        assert (message.guid, message.seq, message.delivery_count) == (want.guid, want.seq, 0)
                        rest.setdefault(rows[n][0], []).append(message)
                for q, messages in sorted(rest.items()):
                    pushed[name][q] += _per_row(ds[q].add_messages(messages))
        elif step[0] == "own":   # rows held as a frame's get copies of their own: nothing else changes
            def frame_rows():
                return sum(1 for d in sides["fresh"] for c in d._consumers.values() for h in c.unconfirmed.values()
                           if isinstance(h, tuple) and isinstance(h[0], FrameRun))
            in_ledger = int(ledger.count.sum())
            ledger.release(ledger.stale(2))   # (as `Partition.own_frames` does first)
            assert not ledger.count.any()
            before = frame_rows()
            assert sum(d.own_frames(2) for d in sides["fresh"]) == before >= in_ledger and frame_rows() == 0
        elif step[0] == "confirm":   # a frame of a queue's consumer or a few's: seqs each holds (picked by index)
            frame = []   # (queue, consumer, seqs), picked from what it holds before the frame
            for q, who, picks in step[1]:
                q %= len(queues)
                if queues[q]:
                    c = who % len(queues[q])
                    holds = sides["oracle"][q].unconfirmed_of((q, c))
                    frame.append((q, c, [holds[i % len(holds)] for i in picks if holds]))
            for name, ds in sides.items():
                ledger_seqs: list[tuple[int, int]] = []   # (slot, seq): the ranges of consumers whose rows it holds
                for q, c, seqs in frame:
                    d = ds[q]
                    if name == "fresh" and (q, c) in ledger.keys:   # (as `Partition.confirm_ranges` splits them)
                        assert ledger.keys[(q, c)] == d._slot
                        ledger_seqs += [(d._slot, seq) for seq in seqs]
                        continue
                    done, more = d.confirm_many((q, c), seqs)
                    confirmed[name][q] += done.seqs
                    pushed[name][q] += _per_row(more)
                if ledger_seqs:
                    done = ConfirmedRows([], [])
                    slots = np.asarray([slot for slot, _ in ledger_seqs], np.int64)
                    hit, per = ledger.confirm_slots(slots, np.asarray([seq for _, seq in ledger_seqs], np.int64),
                                                    np.ones(len(ledger_seqs), np.int64), done)
                    owners, counts = [ledger.owners()[s] for s in hit.tolist()], per.tolist()
                    assert owners == sorted(set(owners)) and sum(counts) == len(done.seqs) == len(done.guids)
                    at = 0
                    for q, n in zip(owners, counts):   # grouped by queue, each once, in seq order
                        assert done.seqs[at:at + n] == sorted({seq for slot, seq in ledger_seqs
                                                               if slot == ds[q]._slot})
                        assert done.guids[at:at + n] == [seq.to_bytes(16, "big") for seq in done.seqs[at:at + n]]
                        confirmed[name][q] += done.seqs[at:at + n]
                        at += n
            if held:   # (the ledger confirms a frame's seqs of a queue in seq order)
                for q in range(len(queues)):
                    for name in sides:
                        confirmed[name][q].sort()
        else:
            q = step[1] % len(queues)
            if not queues[q]:
                continue
            c = step[2] % len(queues[q])
            for name, ds in sides.items():
                d = ds[q]
                more = d.remove_consumer((q, c)) + d.add_consumer((q, c), options(*queues[q][c]))
                pushed[name][q] += _per_row(more)
        for name, ds in sides.items():
            for q, d in enumerate(ds):
                dropped[name][q] += [m.seq for m, _, _ in d.take_dropped()]
        assert pushed["fresh"] == pushed["oracle"]
        assert confirmed["fresh"] == confirmed["oracle"] and dropped["fresh"] == dropped["oracle"]
        for a, b in zip(sides["fresh"], sides["oracle"]):
            assert a.pending_count == b.pending_count
            assert [(i["unconfirmed_messages"], i["unconfirmed_bytes"]) for i in a.consumers_info()] == \
                [(i["unconfirmed_messages"], i["unconfirmed_bytes"]) for i in b.consumers_info()]


# -- a CONFIRM frame's ranges of many queues in one pass (`confirm_ranges`) against confirm_many per queue ------
@st.composite
def range_schedules(draw):
    """Queues with one or two consumers (random windows); messages arriving
    one by one, as a frame's rows, or as a run (gaps in its seqs, sometimes);
    CONFIRM frames of seq ranges over the queues, a
    queue's ranges apart or together, some of seqs not held (or held by the
    other consumer)."""
    queues = draw(st.lists(st.lists(st.tuples(st.integers(1, 6), st.sampled_from([1 << 30, 25])),
                                    min_size=1, max_size=2), min_size=1, max_size=4))
    steps = draw(st.lists(st.one_of(
        st.tuples(st.just("add"), st.integers(0, 3), st.integers(1, 6),
                  st.sampled_from(["messages", "frame", "run", "gaps"])),
        st.tuples(st.just("confirm"), st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1), st.integers(0, 8),
                                                         st.integers(1, 3)), min_size=1, max_size=8))),
        max_size=25))
    return queues, steps


@settings(deadline=None)
@given(range_schedules())
def test_confirm_ranges_of_many_queues_confirm_as_confirm_many_per_queue(schedule):
    """`confirm_ranges` then one `dispatch` of each freed queue, against what
    the node did before it: each queue's seqs of the frame gathered in the
    frame's order and confirmed by one `confirm_many` (the oracle). A frame
    confirms each queue's messages of one of its consumers, as a link's
    queue id is one consumer (two queue ids of one queue on one link are
    dispatched once after both, where the oracle dispatched twice). The
    oracle takes messages one by one where the other side takes a run
    (held as spans, `primary.held`), and a frame's rows as they come. Per
    queue the same seqs confirmed (and GUIDs), the same pushes in the same
    order, the same held and pending."""
    queues, steps = schedule
    sides = {name: [QueueDispatcher() for _ in queues] for name in ("oracle", "ranges")}
    pushed = {name: [[] for _ in queues] for name in sides}
    confirmed = {name: [[] for _ in queues] for name in sides}
    for ds in sides.values():
        for q, consumers in enumerate(queues):
            for c, (window, window_bytes) in enumerate(consumers):
                ds[q].add_consumer((q, c), ConsumerOptions(window, window_bytes))
    seq = 0
    for step in steps:
        if step[0] == "add":
            _, queue, count, how = step
            q = queue % len(queues)
            seqs = range(seq, seq + count) if how != "gaps" else range(seq, seq + 3 * count, 3)
            for name, ds in sides.items():
                made = [StoredMessage(s.to_bytes(16, "big"), s, b"x" * (5 + s % 7), [], 0) for s in seqs]
                items = ([_frame_runs(made)[0]] if how == "frame" else
                         [run_of(made)] if how != "messages" and name == "ranges" else made)
                pushed[name][q] += [(k, n) for k, n, _ in _per_row(ds[q].add_messages(items))]
            seq = seqs[-1] + 1
            continue
        frame = []   # (queue, consumer key, start, count), starts picked from what the consumer holds
        confirming: dict[int, tuple[int, int]] = {}   # a queue's consumer in this frame (a queue id of a link)
        for queue, who, pick, count in step[1]:
            q = queue % len(queues)
            key = confirming.setdefault(q, (q, who % len(queues[q])))
            held = sides["oracle"][q].unconfirmed_of(key)
            frame.append((q, key, held[pick % len(held)] if held else seq + pick, count))
        for name, ds in sides.items():
            if name == "oracle":
                by_key: dict[tuple[int, int], list[int]] = {}   # (a queue of a link: one consumer, the node's key)
                for _, key, start, count in frame:
                    by_key.setdefault(key, []).extend(range(start, start + count))
                for key, seqs in by_key.items():
                    q = key[0]
                    done, more = ds[q].confirm_many(key, seqs)
                    confirmed[name][q] += list(zip(done.seqs, done.guids))
                    pushed[name][q] += [(k, n) for k, n, _ in _per_row(more)]
                continue
            rows = ConfirmedRows([], [])
            entries: list[tuple[int, tuple[int, int], list[int], list[int]]] = []   # a queue's consecutive ranges
            for q, key, start, count in frame:
                if entries and entries[-1][0] == q:
                    entries[-1][2].append(start)
                    entries[-1][3].append(count)
                else:
                    entries.append((q, key, [start], [count]))
            counts, freed = confirm_ranges([ds[q] for q, _, _, _ in entries], [key for _, key, _, _ in entries],
                                           [s for _, _, s, _ in entries], [n for _, _, _, n in entries], rows)
            assert len(counts) == len(entries) and sum(counts) == len(rows.seqs) == len(rows.guids)
            at = 0
            for (q, _, _, _), n in zip(entries, counts):
                confirmed[name][q] += list(zip(rows.seqs[at:at + n], rows.guids[at:at + n]))
                at += n
            assert len(set(freed)) == len(freed)
            for d in freed:
                q = ds.index(d)
                pushed[name][q] += [(k, n) for k, n, _ in _per_row(d.dispatch())]
        assert confirmed["ranges"] == confirmed["oracle"]
        assert pushed["ranges"] == pushed["oracle"]
        for a, b in zip(sides["ranges"], sides["oracle"]):
            assert a.pending_count == b.pending_count and a.confirmed == b.confirmed
            assert [(i["unconfirmed_messages"], i["unconfirmed_bytes"]) for i in a.consumers_info()] == \
                [(i["unconfirmed_messages"], i["unconfirmed_bytes"]) for i in b.consumers_info()]


# -- a PUSH frame's seq ranges of many rows, found with numpy -------------------------------------------
@settings(deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(1, 3), st.booleans()), max_size=70), min_size=1, max_size=4))
def test_a_push_frame_names_the_seq_ranges_of_many_rows_as_a_row_at_a_time(calls):
    """`_SpanFrame.add_rows` (numpy from SPAN_NUMPY_MIN rows) names the same
    ranges as `_extend` a row at a time: consecutive seqs of one queue make
    one range, across calls too. Each row: its queue, and whether its seq
    follows the last one."""
    from primary.partition import _SpanFrame

    frame, reference = _SpanFrame(), _SpanFrame()
    seq = 100
    for rows in calls:
        if not rows:
            continue
        queue_ids, seqs = [], []
        for queue_id, follows in rows:
            seq += 1 if follows else 3
            queue_ids.append(queue_id)
            seqs.append(seq)
        table = push_table([s.to_bytes(16, "big") for s in seqs], seqs, [b"x"] * len(seqs), [None] * len(seqs),
                           [None] * len(seqs), [0] * len(seqs), [1] * len(seqs), [0] * len(seqs))
        frame.add_rows(table, queue_ids)
        for queue_id, s in zip(queue_ids, seqs):
            reference._extend(queue_id, s, 1)
    assert (frame.queue_ids, frame.starts, frame.counts) == (reference.queue_ids, reference.starts, reference.counts)
    assert frame.rows == sum(len(rows) for rows in calls)


@settings(deadline=None)
@given(st.lists(st.tuples(st.integers(1, 2), st.lists(st.booleans(), min_size=1, max_size=12),
                          st.integers(0, 11), st.integers(1, 12)), min_size=1, max_size=6))
def test_a_push_frame_names_a_runs_seq_ranges_as_a_row_at_a_time(calls):
    """`_SpanFrame.add_run` (one range at once for consecutive seqs) names
    the same ranges as `_extend` a row at a time, for runs with gaps in
    their seqs or none, pushed whole or in part. Each call: the queue, each
    row's seq following the last or not, and the part pushed."""
    from primary.partition import _SpanFrame

    frame, reference = _SpanFrame(), _SpanFrame()
    seq = 100
    for queue_id, follows, start, count in calls:
        seqs = []
        for f in follows:
            seq += 1 if f else 3
            seqs.append(seq)
        start = min(start, len(seqs) - 1)
        count = min(count, len(seqs) - start)
        run = MessageRun(run_of(msgs(len(seqs))).table, [guid_of(s) for s in seqs], seqs, [1] * len(seqs))
        frame.add_run(queue_id, run, start, count)
        for s in seqs[start:start + count]:
            reference._extend(queue_id, s, 1)
    assert (frame.queue_ids, frame.starts, frame.counts) == (reference.queue_ids, reference.starts, reference.counts)


def test_rows_of_a_frame_held_too_long_get_copies_of_their_own():
    """`own_frames`: a row of a frame spanning queues still held after the
    frame's other rows were confirmed becomes a StoredMessage of its own,
    in its place, with its content and delivery state; it is confirmed and
    delivered again as before. A frame made since the cut-off is left."""
    made = [StoredMessage(i.to_bytes(16, "big"), 10 + i, b"p%d" % i, to_wire({"n": i}), put_time_us=0)
            for i in range(4)]
    runs = _frame_runs(made)                   # made_us=1
    a, b = QueueDispatcher(), QueueDispatcher()
    a.add_consumer("a", ConsumerOptions())
    b.add_consumer("b", ConsumerOptions())
    taken, _, _ = take_fresh([a, a, b, b], runs, [0, 1, 2, 3], 0, set())
    assert taken == [0, 1, 2, 3]
    assert a.confirm_many("a", [10, 11])[0].seqs == [10, 11]
    assert b.own_frames(1) == 0 and a.own_frames(2) == 0   # not older than the cut-off; nothing held
    assert b.own_frames(2) == 2 and b.own_frames(2) == 0
    held = b._consumers["b"].unconfirmed
    assert list(held) == [12, 13] and all(isinstance(m, StoredMessage) for m in held.values())
    assert [(m.guid, m.payload, m.delivery_count, m.typed_properties, m.size) for m in held.values()] == [
        (made[i].guid, made[i].payload, 1, {"n": i}, len(made[i].payload)) for i in (2, 3)]
    assert b._consumers["b"].unconfirmed_bytes == sum(len(made[i].payload) for i in (2, 3))
    pushes = b.remove_consumer("b") + b.add_consumer("b2", ConsumerOptions())
    assert [(k, m.seq, m.delivery_count) for k, m in pushes] == [("b2", 12, 2), ("b2", 13, 2)]
    assert b.confirm_many("b2", [12, 13])[0].seqs == [12, 13] and b.unconfirmed_count == 0


def test_rows_held_in_a_ledger_are_counted_where_they_are_and_stay_there():
    """Metrics and the admin API read a dispatcher's held rows without
    taking them out of its ledger: only what changes its consumers does."""
    ledger = Ledger()
    ds = [QueueDispatcher() for _ in range(3)]
    for q, d in enumerate(ds):
        d.attach(ledger, q)
        d.add_consumer((q, 0), ConsumerOptions(10, 1 << 30))
    messages = [StoredMessage(s.to_bytes(16, "big"), s, b"x" * 7, [], 0) for s in range(6)]
    taken, keys, left = take_fresh_held(ledger, [ds[s % 3] for s in range(6)], _frame_runs(messages), list(range(6)),
                                        0, set())
    assert taken == list(range(6)) and keys == [(s % 3, 0) for s in range(6)] and left == []
    assert ledger.count[:3].tolist() == [2, 2, 2]
    for q, d in enumerate(ds):
        assert d.unconfirmed_count == 2 and d.pushed == 2 and d.unconfirmed_of((q, 0)) == [q, q + 3]
        assert [(i["unconfirmed_messages"], i["unconfirmed_bytes"]) for i in d.consumers_info()] == [(2, 14)]
    assert ledger.count[:3].tolist() == [2, 2, 2]   # (still there)
    done = ConfirmedRows([], [])
    hit, per = ledger.confirm_slots(np.array([0, 1]), np.array([0, 1]), np.array([4, 1]), done)
    assert [ledger.owners()[s] for s in hit.tolist()] == [0, 1] and per.tolist() == [2, 1]
    assert done.seqs == [0, 3, 1] and ds[0].confirmed == 2 and ds[0].unconfirmed_count == 0
    # A second consumer: the first one's rows come back into the dispatcher, in push order.
    ds[1].add_consumer((1, 1), ConsumerOptions(10, 1 << 30))
    assert ledger.count[1] == 0 and (1, 0) not in ledger.keys and ds[1].unconfirmed_of((1, 0)) == [4]
    assert ds[1].remove_consumer((1, 1)) == [] and (1, 0) not in ledger.keys   # (holds a row of its own)
    confirmed, _ = ds[1].confirm_many((1, 0), [4])
    assert confirmed.seqs == [4] and ledger.keys[(1, 0)] == ds[1]._slot   # plain again


@pytest.mark.unit
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 2),
                          st.one_of(st.none(), st.integers(0, 150), st.just(DENSE_QUEUE_IDS + 3))), max_size=60))
def test_a_ledgers_index_by_link_finds_what_its_keys_hold_and_nothing_else(changes):
    """`Ledger.slots_of` (a CONFIRM frame's queue ids looked up at once)
    agrees with `keys` after any run of slots made plain with a consumer
    (link, queue id) or not plain; an id too large for the index is looked
    up in `keys` alone (None here)."""
    ledger = Ledger()
    for _ in range(6):
        ledger.register(QueueDispatcher())
    # Every id a change names, its neighbours, the ends of the generated
    # range and the powers of two an index may grow to: the other ids
    # behave as these do (never set), and each lookup after each change costs.
    named = {q for _, _, q in changes if q is not None}
    probes = sorted({*(p for q in named for p in (q - 1, q, q + 1) if p >= 0), 0, 1, 63, 64, 127, 128, 150, 151,
                     DENSE_QUEUE_IDS + 3})
    for slot, link, queue_id in changes:
        ledger.set_plain(slot, None if queue_id is None else (link, queue_id), 10, 1 << 20)
        for link_ in range(3):
            for queue_id_ in probes:
                want = ledger.keys.get((link_, queue_id_))
                got = ledger.slots_of(link_, np.array([queue_id_], np.int64))
                if want is None or queue_id_ >= DENSE_QUEUE_IDS:
                    assert got is None, (link_, queue_id_)
                else:
                    assert got is not None and got.tolist() == [want], (link_, queue_id_)
            held = [(q, s) for (l_, q), s in ledger.keys.items() if l_ == link_ and q < DENSE_QUEUE_IDS]
            if held:
                found = ledger.slots_of(link_, np.array([q for q, _ in held], np.int64))
                assert found is not None and found.tolist() == [s for _, s in held]
            assert (link_ in ledger._by_link) == bool(held)   # a link that holds nothing leaves no array
