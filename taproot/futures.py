"""PutFuture: the future of one PUT, at a fraction of a
`concurrent.futures.Future`'s cost.

A producer makes one per message. A `concurrent.futures.Future` builds a
Condition (a lock and a waiter list) per instance and takes it for every
call; in `taproot bench --scenario priority-1q` that was about a sixth of a
producer's time. This one has no lock of its own: one lock for all of them,
held for a few instructions, and a `threading.Event` made only when somebody
blocks on `result()` or `exception()` before the ACK came.

It has the methods an application uses: `result`, `exception`, `done`,
`add_done_callback`, `cancel` (always False: a posted PUT cannot be taken
back), `cancelled`, `running`. It is not a `concurrent.futures.Future`:
`concurrent.futures.wait` and `as_completed` do not take it; wait on each
one's `result()` or use `on_ack`.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from typing import Any, Callable, Iterable

from taproot.guid import guid_hex

log = logging.getLogger(__name__)

_LOCK = threading.Lock()   # every PutFuture's state changes under it; held briefly


class PutFuture:
    """The future of one PUT; `guid` is known as soon as `post` returns.
    Resolves to the `Ack`, or raises the `AckError` (or the session's error)."""

    __slots__ = ("guid", "_done", "_result", "_exception", "_callbacks", "_event")

    def __init__(self, guid: bytes, on_done: Callable[["PutFuture"], object] | None = None):
        """`on_done`: a first done-callback, set without the lock (no other
        thread can see a future being made)."""
        self.guid = guid
        self._done = False
        self._result: Any = None
        self._exception: BaseException | None = None
        self._callbacks: list[Callable[["PutFuture"], object]] | None = None if on_done is None else [on_done]
        self._event: threading.Event | None = None

    @property
    def guid_hex(self) -> str:
        """The GUID as Taproot writes it everywhere (uppercase hex, as the
        tables' `guid_hex` column and the CLI)."""
        return guid_hex(self.guid)

    def __repr__(self) -> str:
        state = "pending" if not self._done else "failed" if self._exception is not None else "acked"
        return f"<PutFuture {self.guid_hex} {state}>"

    # -- what an application calls -------------------------------------------------
    def done(self) -> bool:
        return self._done

    def running(self) -> bool:
        return not self._done

    def cancelled(self) -> bool:
        return False

    def cancel(self) -> bool:
        """A posted PUT cannot be taken back: always False."""
        return False

    def result(self, timeout: float | None = None) -> Any:
        """The Ack; raises the PUT's error, or TimeoutError after `timeout` s."""
        if not self._wait(timeout):
            raise concurrent.futures.TimeoutError(f"no ACK for {self.guid_hex} within {timeout} s")
        if self._exception is not None:
            raise self._exception
        return self._result

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The PUT's error, or None if it was ACKed; TimeoutError after `timeout` s."""
        if not self._wait(timeout):
            raise concurrent.futures.TimeoutError(f"no ACK for {self.guid_hex} within {timeout} s")
        return self._exception

    def add_done_callback(self, fn: Callable[["PutFuture"], object]) -> None:
        """Call `fn(future)` once the PUT is answered (at once if it is)."""
        with _LOCK:
            if not self._done:
                if self._callbacks is None:
                    self._callbacks = [fn]
                else:
                    self._callbacks.append(fn)
                return
        _call(fn, self)

    # -- what the session calls ------------------------------------------------------
    def set_result(self, result: Any) -> None:
        self._finish(result, None)

    def set_exception(self, exception: BaseException) -> None:
        self._finish(None, exception)

    def _finish(self, result: Any, exception: BaseException | None) -> None:
        with _LOCK:
            if self._done:
                raise concurrent.futures.InvalidStateError(f"{self!r} was already answered")
            self._result, self._exception, self._done = result, exception, True
            callbacks, self._callbacks = self._callbacks, None
            event = self._event
        if event is not None:
            event.set()
        for fn in callbacks or ():
            _call(fn, self)

    def _wait(self, timeout: float | None) -> bool:
        if self._done:
            return True
        with _LOCK:
            if self._done:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)


def settle(answered: Iterable[tuple[Any, Any]]) -> None:
    """Answer each `(future, result)` pair in order: the result, or the
    exception when it is one. What one ACK frame answers, a thousand PUTs:
    their PutFutures change state under one hold of the lock, then their
    events are set and their callbacks run, in the frame's order. Other
    futures (a `post_columns` frame's) are answered in their turn. A
    PutFuture answered already keeps its answer, and InvalidStateError is
    raised, as `set_result` raises it, once the others are settled."""
    callbacks: list[tuple[list[Callable[[PutFuture], object]] | None, threading.Event | None, Any]] = []
    twice: list[PutFuture] = []
    with _LOCK:
        for future, result in answered:
            if type(future) is not PutFuture:
                callbacks.append((None, None, (future, result)))
            elif future._done:
                twice.append(future)
            else:
                if isinstance(result, BaseException):
                    future._exception = result
                else:
                    future._result = result
                future._done = True
                fns, future._callbacks = future._callbacks, None
                if fns is not None or future._event is not None:
                    callbacks.append((fns, future._event, future))
    for fns, event, future in callbacks:
        if fns is None and event is None:   # another kind of future: answered now, in its turn
            other, result = future
            if isinstance(result, BaseException):
                other.set_exception(result)
            else:
                other.set_result(result)
            continue
        if event is not None:
            event.set()
        for fn in fns or ():
            try:
                fn(future)
            except Exception:
                log.exception("exception calling callback for %r", future)
    if twice:
        raise concurrent.futures.InvalidStateError(f"{twice[0]!r} was already answered")


def _call(fn: Callable[[PutFuture], object], future: PutFuture) -> None:
    try:
        fn(future)
    except Exception:
        log.exception("exception calling callback for %r", future)
