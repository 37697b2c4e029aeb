"""The retransmission buffer's deferral with entries of several queues (PUT
frames spanning queues), against a model of what its owners (the SDK core
and every relay) rely on: per queue, PUT order on every stream; an entry goes
only when all its queues are open; nothing deferred is stranded once they all
are."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.retransmit import RetransmissionBuffer

GROUPS = (1, 2, 3, 4)

op = st.one_of(
    st.tuples(st.just("put"), st.lists(st.sampled_from(GROUPS), min_size=1, max_size=3, unique=True)),
    st.tuples(st.just("open"), st.sampled_from(GROUPS)),
    st.tuples(st.just("ack"), st.integers(0, 50)),
    st.tuples(st.just("reconnect"), st.just(0)),
    st.tuples(st.just("forget"), st.sampled_from(GROUPS)),
)


class Owner:
    """What the SDK core and a relay do with the buffer."""

    def __init__(self) -> None:
        self.buffer: RetransmissionBuffer[int, tuple[int, ...]] = RetransmissionBuffer()
        self.open: set[int] = set()
        self.gone: set[int] = set()
        self.next_key = 0
        self.sent: list[int] = []           # this stream's sends, in order
        self.groups: dict[int, tuple[int, ...]] = {}
        self.live = set(GROUPS)

    def is_open(self, group: object) -> bool:
        return group in self.open

    def send(self, key: int) -> None:
        assert key not in self.sent, f"entry {key} sent twice on one stream"
        assert all(g in self.open for g in self.groups[key]), f"entry {key} sent before all its queues opened"
        self.sent.append(key)

    def put(self, groups: list[int]) -> None:
        groups = [g for g in groups if g in self.live]
        if not groups:
            return
        key, self.next_key = self.next_key, self.next_key + 1
        self.groups[key] = tuple(groups)
        self.buffer.hold(key, tuple(groups), 1, 1, now_ms=0)
        if all(g in self.open and not self.buffer.blocked(g) for g in groups):
            self.send(key)
        elif len(groups) == 1:
            self.buffer.defer(groups[0], key)
        else:
            self.buffer.defer_many(groups, key)

    def open_group(self, group: int) -> None:
        if group not in self.live or group in self.open:
            return
        self.open.add(group)
        for held in self.buffer.take_deferred(group, self.is_open):
            self.send(next(k for k, h in self.buffer.items() if h is held))

    def ack(self, n: int) -> None:
        if self.sent:
            self.buffer.release(self.sent[n % len(self.sent)])

    def reconnect(self) -> None:
        self.open = set()
        self.sent = []
        self.buffer.defer_all(lambda key, held: list(held.item) if len(held.item) > 1 else held.item[0])

    def forget(self, group: int) -> None:
        """The queue is gone: nothing more of it is sent, and its owner
        answers every entry that names it."""
        if group not in self.live:
            return
        self.live.discard(group)
        self.open.discard(group)
        self.buffer.forget_deferred(group)
        for key, held in self.buffer.items():
            if group in held.item:
                self.buffer.release(key)


@settings(max_examples=2 * settings().max_examples, deadline=None)   # twice the tier's (conftest)
@given(st.lists(op, max_size=60))
def test_each_queue_keeps_put_order_and_nothing_deferred_is_stranded(ops):
    owner = Owner()
    for kind, arg in ops:
        {"put": owner.put, "open": owner.open_group, "ack": owner.ack, "reconnect": lambda _: owner.reconnect(),
         "forget": owner.forget}[kind](arg)  # type: ignore[operator]
        for group in GROUPS:   # per queue, this stream's sends are in PUT order
            mine = [k for k in owner.sent if group in owner.groups[k]]
            assert mine == sorted(mine), (group, mine)
    for group in GROUPS:       # every queue opens: whatever is held and unsent goes
        owner.open_group(group)
    unsent = [k for k, _ in owner.buffer.items() if k not in owner.sent]
    assert unsent == [], f"stranded: {unsent}"
