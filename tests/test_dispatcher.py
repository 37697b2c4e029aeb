from primary.dispatcher import ConsumerOptions, QueueDispatcher, StoredMessage


def msgs(n, start=0, size=10):
    return [StoredMessage(guid=bytes([i]) * 16, seq=i, payload=b"x" * size, properties=[], put_time_us=0)
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
    confirmed, more = d.confirm("a", pushes[0][1].guid)
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
    assert d.confirm("a", b"\xff" * 16) == (None, [])
    assert d.confirm("nobody", b"\x00" * 16) == (None, [])
