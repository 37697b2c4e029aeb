"""A dedup query that stops with an error is started again from its checkpoint.

Why: a streaming query stops for good at its first error, and some errors are
passing ones. The one that showed it: on a local file system a directory
listing that runs while files are added may return a later commit and miss
the one before it (`readdir` gives no promise about entries added during the
listing, and ext4 returns them in hash order, not name order). The Delta
source then sees a gap in the PUT log's versions and stops the query
(DELTA_MISSING_FILES_UNEXPECTED_VERSION), although every commit is there. A
JVM paused in the middle of such a listing (SIGSTOP, a long GC pause, a
starved core) makes it likely. Before this, the pipeline then stopped its
other queries and exited: the authority was gone until someone restarted it.

Starting the query again from its checkpoint is what a restart of the whole
pipeline does, without losing the other partitions' queries: Spark replays
the last planned batch, and the batch's write is idempotent
(`pipelines.dedup`: the delivery log's txn app id and batch id).

The wait before each restart doubles from `first_s` up to `max_s`, and
starts again at `first_s` once a restarted query has run `healthy_s`
without stopping. An error that does not pass (a checkpoint that cannot be
read, files truly gone) keeps the query stopped: it is tried every `max_s`
and every failure is logged with its cause, and
`taproot_pipeline_query_active` shows 0 meanwhile.

A query that Spark refuses to start `start_failures_max` times in a row
(its session or JVM gone, or the table unreadable for that long: a start
reads the PUT log's snapshot) is not expected back in this process: `gave_up`
says so, and the pipeline then exits 1, as it did at any query's stop
before, for whatever runs it to start it afresh."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger(__name__)

RESTART_FIRST_S = 1.0
RESTART_MAX_S = 60.0
HEALTHY_S = 60.0
START_FAILURES_MAX = 5
STOP_FINISH_S = 15.0         # a stop waits this long for a batch in flight to end (the roles' stop allows 30 s)
STOP_POLL_S = 0.05


def first_line(error: object) -> str:
    """The first line of an error's text (a JVM exception's is the cause;
    the stack trace is in Spark's own log)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


class SupervisedQuery:
    """One streaming query, started by `start`, started again after it stops
    with an error (the module's docstring). `check` is called by the
    pipeline's loop; `query` is None while a restart waits."""

    def __init__(self, name: str, start: Callable[[], "StreamingQuery"], *, first_s: float = RESTART_FIRST_S,
                 max_s: float = RESTART_MAX_S, healthy_s: float = HEALTHY_S,
                 start_failures_max: int = START_FAILURES_MAX, clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self._start = start
        self.first_s, self.max_s, self.healthy_s = first_s, max_s, healthy_s
        self._clock = clock
        self.restarts = 0            # starts after the first one
        self.failures = 0            # in a row: stops and failed starts since the query last ran healthy_s
        self.start_failures = 0      # in a row: starts Spark refused
        self.start_failures_max = start_failures_max
        self.last_error: str | None = None
        self._started_at = clock()
        self._restart_at: float | None = None
        self.query: StreamingQuery | None = start()

    @property
    def active(self) -> bool:
        return self.query is not None and bool(self.query.isActive)

    def check(self) -> None:
        """Notice a stopped query, and start it again when its wait is over."""
        now = self._clock()
        if self.query is not None:
            if self.query.isActive:
                if self.failures and now - self._started_at >= self.healthy_s:
                    log.info("query %s has run %.0f s since its restart: the next failure waits %.0f s again",
                             self.name, now - self._started_at, self.first_s)
                    self.failures = 0
                return
            error = self.query.exception()
            self.query = None
            self._failed(now, "stopped" if error is None else f"stopped: {first_line(error)}")
            return
        assert self._restart_at is not None
        if now < self._restart_at:
            return
        try:
            self.query = self._start()
        except Exception as exc:   # Spark refused to start it (its session, the checkpoint): try again later
            self.start_failures += 1
            self._failed(now, f"could not be started again: {first_line(exc)}")
            return
        self.start_failures = 0
        self.restarts += 1
        self._started_at = now
        self._restart_at = None
        log.warning("query %s started again from its checkpoint (restart %d, failure %d in a row)",
                    self.name, self.restarts, self.failures)

    def _failed(self, now: float, what: str) -> None:
        self.failures += 1
        wait = min(self.max_s, self.first_s * 2 ** (self.failures - 1))
        self._restart_at = now + wait
        self.last_error = what
        log.error("query %s %s; starting it again from its checkpoint in %.0f s", self.name, what, wait)

    @property
    def gave_up(self) -> bool:
        """Spark refused to start the query `start_failures_max` times in a row."""
        return self.start_failures >= self.start_failures_max

    def stop(self, deadline: float | None = None, sleep: Callable[[float], None] = time.sleep) -> None:
        """Stop the query, between two batches when the one in flight ends
        before `deadline` (this supervisor's clock; None: at once). Spark's
        stop interrupts a batch: its job is aborted with an
        InterruptedException in the log, and Spark's reading of the Python
        traceback that follows overflowed the stream thread's stack once
        (a 5-minute bench run's stop). Nothing is lost either way: the batch
        is planned in the checkpoint and replayed at the next start, and its
        write is idempotent."""
        query = self.query
        if query is None or not query.isActive:
            return
        if deadline is not None and self._clock() < deadline and _in_batch(query):
            began = self._clock()
            log.info("query %s: waiting up to %.0f s for its batch in flight before it stops", self.name,
                     deadline - began)
            while self._clock() < deadline and query.isActive and _in_batch(query):
                sleep(STOP_POLL_S)
            log.info("query %s: %s after %.1f s", self.name,
                     "batch ended" if not (query.isActive and _in_batch(query)) else "still in its batch",
                     self._clock() - began)
        if query.isActive:
            query.stop()


def _in_batch(query: "StreamingQuery") -> bool:
    """Whether a trigger of `query` is running (Spark's `isTriggerActive`);
    False when that cannot be read (the session going away)."""
    try:
        return bool(query.status.get("isTriggerActive", False))
    except Exception:
        return False
