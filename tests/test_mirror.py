"""MirroredSession's own logic (RAIS mirroring), against paths faked at the
Session's seams: the first path's ACK answers a PUT, a path that fails costs
nothing unless every path fails, a full path is skipped rather than waited
for, and stop waits for the PUTs' answers, not for a dead path's. The paths
through a real cluster are in test_end_to_end.py and test_faults.py."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future
from types import SimpleNamespace

import pyarrow as pa
import pytest

from protocol import ResultCode
from taproot import errors
from taproot.core import Ack, ConnectionState
from taproot.futures import PutFuture
from taproot.mirror import MirroredSession

URI = "taproot://demo/mirrored"


class FakeQueue:
    def __init__(self, leg: "FakeLeg"):
        self._session = leg
        self.closed = False

    def _wire_put(self, payload, properties, compression):
        if not isinstance(payload, bytes):
            raise errors.PostError("payload must be bytes")
        return payload, [], 0

    def _wire_columns(self, table):
        return os.urandom(16 * table.num_rows), b"arrow"

    def close(self, timeout_s=None):
        self.closed = True


class FakeLeg:
    """One path. `mode`: "ok" (held until `answer`), "refuse" (fails at
    once), "full" (no room while connected), "dead" (stopped for good)."""

    def __init__(self, mode: str = "ok"):
        self.mode = mode
        self._core = SimpleNamespace(state=ConnectionState.CONNECTED)
        self.held: list[tuple[bytes, object]] = []     # (guid, future) sent here
        self.waited = 0
        self.stopped = False
        self.lock = threading.Lock()

    def start(self):
        if self.mode == "unreachable":
            raise errors.ConnectionError("no host reachable")

    def stop(self, timeout_s=30.0):
        self.stopped = True

    def _flush(self):
        pass

    open_delay_s = 0.0

    def open_queue(self, uri, *, write, timeout_s=None):
        time.sleep(self.open_delay_s)
        return FakeQueue(self)

    def _take(self, guid, future, wait):
        if self.mode == "dead":
            raise errors.ConnectionError("session is stopped")
        if self.mode == "full" and not wait:
            return None
        if wait:
            self.waited += 1
        with self.lock:
            self.held.append((guid, future))
        if self.mode == "refuse":
            future.set_exception(errors.AckError(ResultCode.LIMIT_MESSAGES, "buffer full", guid))
        return future

    def _put(self, q, payload, properties, on_ack, compression, guid, wait):
        if self.mode == "full" and not wait:
            return None
        return self._take(guid, PutFuture(guid, on_ack), wait)

    def _post_columns(self, q, guids, data, wait=True):
        return self._take(guids, Future(), wait)

    def answer(self, code: ResultCode = ResultCode.SUCCESS):
        with self.lock:
            held, self.held = self.held, []
        for guid, future in held:
            if future.done():
                continue
            if code is ResultCode.SUCCESS:
                future.set_result(Ack(guid, URI) if isinstance(future, PutFuture)
                                  else [guid[i:i + 16] for i in range(0, len(guid), 16)])
            else:
                future.set_exception(errors.AckError(code, "refused", guid[:16]))


def mirrored(*modes: str, **options) -> tuple[MirroredSession, list[FakeLeg]]:
    session = MirroredSession([[f"127.0.0.1:{9000 + i}"] for i in range(len(modes))], mend_interval_s=3600,
                              **options)
    legs = [FakeLeg(m) for m in modes]
    session.legs = legs  # type: ignore[assignment]
    session.start()
    return session, legs


def test_the_first_path_to_ack_answers_and_the_later_ack_is_ignored():
    session, (a, b) = mirrored("ok", "ok")
    q = session.open_queue(URI, write=True)
    seen = []
    future = q.post(b"x", on_ack=seen.append)
    assert [g for g, _ in a.held] == [future.guid] == [g for g, _ in b.held]   # one GUID on both paths
    assert not future.done()
    b.answer()
    assert future.result(0).guid == future.guid and seen == [future]
    a.answer()   # the slower path's ACK: no second answer
    assert seen == [future]
    assert session.stats.first == [0, 1] and session.stats.lost == 0
    session.stop(timeout_s=1)


def test_a_failing_path_costs_nothing_while_another_acks():
    session, (a, b) = mirrored("refuse", "ok")
    q = session.open_queue(URI, write=True)
    future = q.post(b"x")
    assert not future.done()          # the refusal alone does not answer it
    b.answer()
    assert future.exception(0) is None
    assert session.stats.failed == [1, 0] and session.stats.first == [0, 1]
    session.stop(timeout_s=1)


def test_every_path_failing_fails_the_put_with_each_reason():
    session, (a, b) = mirrored("ok", "ok")
    q = session.open_queue(URI, write=True)
    future = q.post(b"x")
    a.answer(ResultCode.STORAGE_FAILURE)
    assert not future.done()
    b.answer(ResultCode.LIMIT_BYTES)
    exc = future.exception(0)
    assert isinstance(exc, errors.AckError) and exc.code is ResultCode.STORAGE_FAILURE and exc.guid == future.guid
    assert "path 1" in str(exc) and "path 2" in str(exc)
    assert session.stats.lost == 1
    session.stop(timeout_s=1)


def test_a_stopped_path_is_skipped_and_the_put_goes_on_the_other():
    session, (a, b) = mirrored("dead", "ok")
    q = session.open_queue(URI, write=True)
    future = q.post(b"x")
    assert a.held == [] and len(b.held) == 1
    b.answer()
    assert future.exception(0) is None
    assert session.stats.skipped == [1, 0]
    session.stop(timeout_s=1)


def test_no_path_taking_it_fails_the_put_at_once():
    session, (a, b) = mirrored("ok", "ok")
    q = session.open_queue(URI, write=True)
    a.mode = b.mode = "dead"
    exc = q.post(b"x").exception(0)
    assert isinstance(exc, errors.AckError) and "no path could take" in str(exc)
    session.stop(timeout_s=1)


def test_a_full_path_is_skipped_not_waited_for():
    session, (a, b) = mirrored("full", "ok")
    q = session.open_queue(URI, write=True)
    future = q.post(b"x")
    assert a.held == [] and a.waited == 0 and len(b.held) == 1
    assert session.stats.skipped == [1, 0]
    b.answer()
    assert future.result(0)
    session.stop(timeout_s=1)


def test_every_path_full_waits_for_the_first_ones_room():
    session, (a, b) = mirrored("full", "full")
    q = session.open_queue(URI, write=True)
    future = q.post(b"x")
    assert a.waited == 1 and b.held == [] and session.stats.skipped == [0, 1]
    a.answer()
    assert future.result(0)
    session.stop(timeout_s=1)


def test_post_columns_carries_the_same_guids_and_counts_rows():
    session, (a, b) = mirrored("ok", "refuse")
    q = session.open_queue(URI, write=True)
    future = q.post_columns(pa.table({"payload": pa.array([b"a", b"b", b"c"], pa.binary())}))
    assert a.held[0][0] == b.held[0][0] and len(a.held[0][0]) == 48
    a.answer()
    assert len(future.result(0)) == 3
    assert session.stats.first == [3, 0] and session.stats.failed == [0, 3]
    session.stop(timeout_s=1)


def test_bad_input_is_refused_before_any_path_sees_it():
    session, (a, b) = mirrored("ok", "ok")
    with pytest.raises(errors.InvalidArgumentError):
        session.open_queue("http://not-a-queue", write=True)
    with pytest.raises(errors.InvalidArgumentError):
        session.open_queue(URI, read=True)
    q = session.open_queue(URI, write=True)
    with pytest.raises(errors.PostError):
        q.post("not bytes")  # type: ignore[arg-type]
    assert a.held == b.held == []
    assert session._outstanding == 0
    session.stop(timeout_s=1)
    with pytest.raises(ValueError):
        MirroredSession([["127.0.0.1:1"]])
    with pytest.raises(ValueError):
        MirroredSession([["127.0.0.1:1"], []])


def test_start_needs_one_path_and_stop_waits_for_answers_not_for_a_dead_path():
    session, (a, b) = mirrored("unreachable", "ok")
    assert session._started == [False, True]
    q = session.open_queue(URI, write=True)
    future = q.post(b"x")
    threading.Timer(0.2, b.answer).start()
    session.stop(timeout_s=5)
    assert future.done() and future.exception() is None
    assert b.stopped and not a.stopped
    with pytest.raises(errors.ConnectionError, match="no path reachable"):
        mirrored("unreachable", "unreachable")


def test_open_waits_a_moment_for_every_path_so_the_first_puts_go_on_all():
    """A PUT sent on one path only may be overtaken by a later one sent on
    both (the fault suite saw PUSH order break that way at the start)."""
    session, (a, b) = mirrored("ok", "ok")
    b.open_delay_s = 0.3
    q = session.open_queue(URI, write=True)
    assert sorted(q._legs) == [0, 1]
    session.stop(timeout_s=1)
    session, (a, b) = mirrored("ok", "ok", join_grace_s=0.05)
    b.open_delay_s = 0.5
    q = session.open_queue(URI, write=True)
    assert sorted(q._legs) == [0]                         # not waited for past the grace
    time.sleep(0.6)
    assert sorted(q._legs) == [0, 1]                      # and joins when it answers
    session.stop(timeout_s=1)
