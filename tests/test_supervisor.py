"""`pipelines.supervisor.SupervisedQuery`: a dedup query that stops with an
error is started again, after a wait that doubles up to a cap and starts over
once the query has run long enough. The real thing (a Delta stream stopped by
a gap in its source's listing, started again by the running pipeline) is in
`tests/test_faults.py::test_a_dedup_query_stopped_by_a_gap_in_the_put_log_is_started_again`."""

import logging

import pytest

from pipelines.supervisor import SupervisedQuery

pytestmark = pytest.mark.unit


class FakeQuery:
    """What the supervisor reads of a pyspark StreamingQuery."""

    def __init__(self) -> None:
        self.isActive = True
        self.error: Exception | None = None
        self.stopped = False

    def exception(self):
        return self.error

    def stop(self) -> None:
        self.stopped, self.isActive = True, False

    def fail(self, text: str) -> None:
        self.isActive, self.error = False, RuntimeError(text)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Starter:
    """Starts FakeQuery objects, or raises while `refuse` says so."""

    def __init__(self) -> None:
        self.started: list[FakeQuery] = []
        self.refuse = 0

    def __call__(self) -> FakeQuery:
        if self.refuse:
            self.refuse -= 1
            raise RuntimeError("[STREAM_FAILED] the session is stopping\n\tat org.apache...")
        self.started.append(FakeQuery())
        return self.started[-1]


def supervised(clock: Clock, starter: Starter) -> SupervisedQuery:
    return SupervisedQuery("taproot-dedup-000", starter, first_s=1, max_s=8, healthy_s=60, clock=clock)


def test_a_query_that_stops_with_an_error_is_started_again_after_a_wait_that_doubles_up_to_the_cap(caplog):
    clock, starter = Clock(), Starter()
    sup = supervised(clock, starter)
    assert len(starter.started) == 1 and sup.active
    restarts_at = []
    with caplog.at_level(logging.WARNING, logger="pipelines.supervisor"):
        for _ in range(6):
            starter.started[-1].fail("[DELTA_MISSING_FILES_UNEXPECTED_VERSION] Delta stream cannot resume\n\tat x")
            failed_at = clock.now
            sup.check()                       # noticed: stopped, a restart planned
            assert sup.query is None and not sup.active
            count = len(starter.started)
            while len(starter.started) == count:
                clock.now += 0.25
                sup.check()
            restarts_at.append(clock.now - failed_at)
            clock.now += 5                    # runs a while, under healthy_s
            sup.check()
    assert restarts_at == [1, 2, 4, 8, 8, 8]
    assert sup.restarts == 6 and sup.failures == 6 and sup.active
    assert sup.last_error == "stopped: [DELTA_MISSING_FILES_UNEXPECTED_VERSION] Delta stream cannot resume"
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 6 and all("starting it again from its checkpoint" in e for e in errors)
    assert not any("\tat x" in e for e in errors)


def test_the_wait_starts_over_once_a_restarted_query_has_run_healthy_s():
    clock, starter = Clock(), Starter()
    sup = supervised(clock, starter)
    for _ in range(3):
        starter.started[-1].fail("boom")
        sup.check()
        clock.now += 8
        sup.check()
    assert sup.failures == 3 and sup.restarts == 3
    clock.now += 59
    sup.check()
    assert sup.failures == 3                  # not yet 60 s since its start
    clock.now += 1
    sup.check()
    assert sup.failures == 0
    starter.started[-1].fail("boom")
    sup.check()
    clock.now += 0.99
    sup.check()
    assert sup.query is None
    clock.now += 0.01
    sup.check()
    assert sup.active and sup.restarts == 4


def test_a_start_that_raises_counts_as_a_failure_and_is_tried_again():
    clock, starter = Clock(), Starter()
    sup = supervised(clock, starter)
    starter.started[-1].fail("boom")
    sup.check()
    starter.refuse = 2
    clock.now += 1
    sup.check()                               # refused: waits 2 s
    assert sup.query is None and sup.failures == 2
    assert sup.last_error == "could not be started again: [STREAM_FAILED] the session is stopping"
    clock.now += 2
    sup.check()                               # refused: waits 4 s
    clock.now += 3.9
    sup.check()
    assert sup.query is None and len(starter.started) == 1
    clock.now += 0.1
    sup.check()
    assert sup.active and len(starter.started) == 2 and sup.restarts == 1


def test_a_query_that_stops_without_an_error_is_started_again_too_and_stop_stops_the_running_one():
    clock, starter = Clock(), Starter()
    sup = supervised(clock, starter)
    starter.started[-1].isActive = False      # stopped by someone else, no exception
    sup.check()
    assert sup.last_error == "stopped"
    clock.now += 1
    sup.check()
    running = starter.started[-1]
    sup.stop()
    assert running.stopped and not sup.active
    sup.stop()                                # a second stop does nothing


def test_after_start_failures_max_refused_starts_in_a_row_it_gives_up():
    clock, starter = Clock(), Starter()
    sup = SupervisedQuery("taproot-dedup-000", starter, first_s=1, max_s=8, healthy_s=60, start_failures_max=3,
                          clock=clock)
    starter.started[-1].fail("boom")
    sup.check()
    starter.refuse = 2
    for _ in range(2):
        clock.now += 8
        sup.check()
    assert sup.start_failures == 2 and not sup.gave_up
    clock.now += 8
    sup.check()                               # started: the count in a row starts over
    assert sup.active and sup.start_failures == 0
    starter.started[-1].fail("boom")
    sup.check()
    starter.refuse = 3
    for _ in range(3):
        assert not sup.gave_up
        clock.now += 8
        sup.check()
    assert sup.gave_up and sup.query is None


class BatchingQuery(FakeQuery):
    """A FakeQuery whose trigger is active for its first `busy` status reads."""

    def __init__(self, busy: int) -> None:
        super().__init__()
        self.busy = busy
        self.reads = 0

    @property
    def status(self) -> dict:
        self.reads += 1
        return {"message": "Processing new data", "isDataAvailable": True, "isTriggerActive": self.reads <= self.busy}


def test_a_stop_waits_for_the_batch_in_flight_and_no_longer_than_its_deadline():
    clock = Clock()

    def sleep(s: float) -> None:
        clock.now += s

    for busy, stops_at in [(0, 100.0), (10, 100.5), (10**6, 115.0)]:
        query = BatchingQuery(busy)
        sup = SupervisedQuery("taproot-dedup-000", lambda query=query: query, clock=clock)
        clock.now = 100.0
        sup.stop(deadline=115.0, sleep=sleep)
        assert query.stopped and clock.now == pytest.approx(stops_at, abs=0.051)   # to a poll
    query = BatchingQuery(10**6)
    sup = SupervisedQuery("taproot-dedup-000", lambda: query, clock=clock)
    sup.stop(sleep=sleep)                      # no deadline: at once
    assert query.stopped and query.reads == 0


def test_a_stop_does_not_wait_on_a_status_that_cannot_be_read():
    class Gone(FakeQuery):
        @property
        def status(self) -> dict:
            raise RuntimeError("py4j: the gateway is gone")

    query, clock = Gone(), Clock()
    SupervisedQuery("taproot-dedup-000", lambda: query, clock=clock).stop(deadline=clock.now + 15, sleep=None)
    assert query.stopped
