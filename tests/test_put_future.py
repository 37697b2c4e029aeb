"""PutFuture: the methods of a concurrent.futures.Future an application
uses, without a Condition per PUT."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import pytest

from taproot.futures import PutFuture

GUID = b"\x01" * 16


def test_result_and_callbacks_before_and_after_the_ack():
    future = PutFuture(GUID)
    seen: list[object] = []
    future.add_done_callback(lambda f: seen.append(("early", f.result())))
    assert not future.done() and future.running() and not future.cancelled() and not future.cancel()
    future.set_result("ack")
    future.add_done_callback(lambda f: seen.append(("late", f.result())))   # called at once
    assert seen == [("early", "ack"), ("late", "ack")]
    assert future.done() and future.result() == "ack" and future.exception() is None


def test_a_callback_given_at_creation_runs_once_with_the_answer_before_later_ones():
    seen: list[object] = []
    future = PutFuture(GUID, lambda f: seen.append(("first", f.result())))
    future.add_done_callback(lambda f: seen.append(("second", f.result())))
    future.set_result("ack")
    assert seen == [("first", "ack"), ("second", "ack")]


def test_an_error_is_raised_by_result_and_returned_by_exception():
    future = PutFuture(GUID)
    error = RuntimeError("refused")
    future.set_exception(error)
    with pytest.raises(RuntimeError, match="refused"):
        future.result(timeout=0)
    assert future.exception(timeout=0) is error


def test_a_wait_times_out_with_the_standard_timeout_error_then_succeeds():
    future = PutFuture(GUID)
    started = time.monotonic()
    with pytest.raises(concurrent.futures.TimeoutError):
        future.result(timeout=0.05)
    with pytest.raises(concurrent.futures.TimeoutError):
        future.exception(timeout=0.05)
    assert time.monotonic() - started >= 0.1
    threading.Timer(0.05, future.set_result, args=("ack",)).start()
    assert future.result(timeout=5) == "ack"


def test_many_waiters_on_other_threads_are_all_woken():
    future = PutFuture(GUID)
    results: list[object] = []
    waiters = [threading.Thread(target=lambda: results.append(future.result(timeout=5))) for _ in range(8)]
    for t in waiters:
        t.start()
    time.sleep(0.05)
    future.set_result("ack")
    for t in waiters:
        t.join(5)
    assert results == ["ack"] * 8


def test_a_second_answer_is_refused_and_a_failing_callback_does_not_stop_the_others(caplog):
    future = PutFuture(GUID)
    seen: list[str] = []
    future.add_done_callback(lambda f: 1 / 0)
    future.add_done_callback(lambda f: seen.append("second"))
    future.set_result("ack")
    assert seen == ["second"] and "exception calling callback" in caplog.text
    with pytest.raises(concurrent.futures.InvalidStateError):
        future.set_result("again")
    with pytest.raises(concurrent.futures.InvalidStateError):
        future.set_exception(RuntimeError())
    assert future.result() == "ack"


def test_an_ack_shows_its_guid_as_taproot_writes_it():
    from taproot.core import Ack
    from taproot.guid import guid_hex

    ack = Ack(bytes(range(16)), "taproot://demo/orders")
    assert ack.guid_hex == guid_hex(ack.guid) == "000102030405060708090A0B0C0D0E0F"
    assert repr(ack) == "Ack(guid=000102030405060708090A0B0C0D0E0F, queue_uri='taproot://demo/orders')"


def test_an_ack_frame_settles_its_futures_in_order_whatever_kind_and_a_second_answer_is_refused_after(caplog):
    """`settle` answers what one ACK frame answers: PutFutures under one
    hold of the lock, callbacks and waiters after, in the frame's order;
    another kind of future (a `post_columns` frame's) in its turn; a failing
    callback stops nobody; a PutFuture answered already raises
    InvalidStateError once the others are answered."""
    from taproot.futures import settle

    seen: list[object] = []
    plain = [PutFuture(bytes([i]) * 16, lambda f: seen.append(("cb", f.guid[0], f._result))) for i in range(3)]
    waited = PutFuture(b"\x09" * 16)
    woke: list[object] = []
    woken = threading.Thread(target=lambda: woke.append(waited.result(timeout=5)))
    woken.start()
    columns: concurrent.futures.Future[object] = concurrent.futures.Future()
    columns.add_done_callback(lambda f: seen.append(("columns", f.result())))
    failing = PutFuture(b"\x07" * 16, lambda f: 1 / 0)
    error = RuntimeError("refused")
    settle([(plain[0], "a0"), (columns, ["g"]), (failing, "a7"), (plain[1], error), (waited, "a9"), (plain[2], "a2")])
    woken.join(5)
    assert seen == [("cb", 0, "a0"), ("columns", ["g"]), ("cb", 1, None), ("cb", 2, "a2")]
    assert woke == ["a9"] and "exception calling callback" in caplog.text
    assert plain[1].exception() is error and failing.result() == "a7"
    again = PutFuture(b"\x05" * 16)
    with pytest.raises(concurrent.futures.InvalidStateError):
        settle([(plain[0], "twice"), (again, "once")])
    assert plain[0].result() == "a0" and again.result() == "once"
