"""Mirrored PUTs (RAIS's mirroring, `../shared/seeds/002_*`): one producer,
two or more independent paths to a cluster (two proxies, a proxy and a node,
two hosts), and every PUT sent on each path with the same GUID.

    with MirroredSession([["proxy-a:30115"], ["proxy-b:30115"]]) as session:
        queue = session.open_queue("taproot://demo/orders", write=True)
        queue.post(b"...").result()      # the faster path's ACK

The primary commits whichever copy comes first; the later one is a duplicate
within the domain's dedup window (the GUID history): ACKed, stored, never
pushed. So a message is delivered once, and a PUT's future resolves with the
first path's ACK. A path that fails costs the producer nothing: it is not
waited for, its errors are not seen unless every path fails the PUT, and
PUTs go on over the others. Each path is a `Session` of its own (its own
connection, batches, retransmission buffer and reconnection, to the hosts of
its list in turn), so a path that comes back resends what it held: more
duplicates, still delivered once.

What is not mirrored: consuming (a message is pushed once, to one consumer;
a consumer that wants two paths opens a `Session` with both hosts, which fails
over). Order: each path keeps its PUTs in order, so when every PUT goes on
every path the first copies commit in PUT order. A PUT that went on some
paths only (one had no room, was down, or had not opened the queue yet) may
commit after a later PUT that went on a faster path. `open_queue` waits up to
`join_grace_s` for every connected path to open the queue, so that a
producer's first PUTs go on all of them.

Costs: every PUT is sent, committed and stored once per path (N times the PUT
log's bytes), and the producer's CPU per PUT is about N times a `Session`'s.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for_futures
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Mapping, Sequence, cast

from protocol import ResultCode, parse_queue_uri
from protocol.limits import GUID_LENGTH
from protocol.properties import PropertyValue
from taproot import errors
from taproot.futures import PutFuture
from taproot.guid import GuidGenerator
from taproot.session import Queue, Session

log = logging.getLogger(__name__)


@dataclass
class MirrorStats:
    """Per path, in messages: `first`, the PUTs whose ACK it gave first (the
    PUT's answer); `skipped`, the PUTs not sent on it (the path was down for
    good, had no room while connected, or had not opened the queue yet);
    `failed`, the PUTs it answered with a failure. `lost`: PUTs every path failed."""
    first: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    lost: int = 0


class _Fan:
    """One mirrored PUT (or post_columns frame) sent on several paths: its
    future gets the first path's success, or, once every path that took it
    has failed, a failure naming each path's."""

    __slots__ = ("future", "count", "stats", "lock", "taken", "failures", "sealed", "answered", "on_answer", "guid")

    def __init__(self, future: "PutFuture | Future[Any]", guid: bytes, count: int, stats: MirrorStats,
                 lock: threading.Lock, on_answer: Callable[[], None]):
        self.future = future
        self.guid = guid
        self.count = count          # messages (a frame's rows)
        self.stats = stats
        self.lock = lock            # the session's, which guards `stats` too
        self.taken = 0              # paths that took it
        self.failures: list[tuple[int, BaseException]] = []
        self.sealed = False         # every path has been offered it
        self.answered = False
        self.on_answer = on_answer

    def callback(self, path: int) -> Callable[[Any], None]:
        """The done-callback of the PUT on `path`."""
        return lambda leg_future: self._leg_done(path, leg_future)

    def _leg_done(self, path: int, leg_future: Any) -> None:
        exc = leg_future.exception()
        with self.lock:
            if exc is None:
                if self.answered:
                    return
                self.answered = True
                self.stats.first[path] += self.count
            else:
                self.stats.failed[path] += self.count
                self.failures.append((path, exc))
                if self.answered or not self._all_failed():
                    return
                self.answered = True
                self.stats.lost += self.count
        self._answer(leg_future.result() if exc is None else None, failed=exc is not None)

    def _all_failed(self) -> bool:
        return self.sealed and len(self.failures) == self.taken

    def seal(self) -> None:
        """Every path was offered the PUT: if each that took it failed already
        (or none took it), the PUT fails now."""
        with self.lock:
            self.sealed = True
            if self.answered or not self._all_failed():
                return
            self.answered = True
            self.stats.lost += self.count
        self._answer(None, failed=True)

    def _answer(self, result: Any, failed: bool) -> None:
        try:
            if failed:
                self.future.set_exception(self._failure())
            else:
                self.future.set_result(result)
        finally:
            self.on_answer()

    def _failure(self) -> errors.TaprootError:
        if not self.failures:
            return errors.AckError(ResultCode.UNKNOWN, "no path could take the PUT", self.guid)
        first = self.failures[0][1]
        code = getattr(first, "code", ResultCode.UNKNOWN)
        text = "; ".join(f"path {path + 1}: {exc}" for path, exc in self.failures)
        return errors.AckError(code if isinstance(code, ResultCode) else ResultCode.UNKNOWN,
                               f"every path failed: {text}", self.guid)


class MirroredSession:
    """A producer session over two or more paths; see the module's docstring.

    `paths`: one host list per path (each path's `Session` fails over within
    its list). Every other keyword is a `Session` option, given to each path.
    At least one path must connect within `connect_timeout_s` at `start`; a
    path that does not is dialled again every `mend_interval_s`, and joins
    (its queues opened) when it answers."""

    def __init__(self, paths: Sequence[Sequence[str]], *, mend_interval_s: float = 1.0, join_grace_s: float = 2.0,
                 **options: Any):
        if isinstance(paths, str) or len(paths) < 2:
            raise ValueError("a mirrored session needs two or more paths, each a list of host:port")
        if any(isinstance(p, str) or not p for p in paths):
            raise ValueError("each path is a non-empty list of host:port")
        self.paths = [list(p) for p in paths]
        self.legs = [Session(p, **options) for p in self.paths]
        self.stats = MirrorStats([0] * len(paths), [0] * len(paths), [0] * len(paths))
        self.mend_interval_s = mend_interval_s
        self.join_grace_s = join_grace_s
        self._guids = GuidGenerator()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._outstanding = 0               # PUTs (and frames) not answered yet
        self._started = [False] * len(paths)
        self._queues: list[MirroredQueue] = []
        self._stopping = threading.Event()
        self._mender: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(max_workers=len(paths), thread_name_prefix="taproot-mirror")

    def __enter__(self) -> "MirroredSession":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the paths -------------------------------------------------------------------
    def start(self) -> None:
        """Start every path at once; raises ConnectionError if none connects."""
        starts = {self._pool.submit(leg.start): i for i, leg in enumerate(self.legs)}
        problems = []
        for future, i in starts.items():
            exc = future.exception()
            if exc is None:
                self._started[i] = True
            else:
                problems.append(f"path {i + 1} {self.paths[i]}: {exc}")
        if not any(self._started):
            raise errors.ConnectionError("no path reachable: " + "; ".join(problems))
        for problem in problems:
            log.warning("mirrored session: %s; dialled again every %.1f s", problem, self.mend_interval_s)
        self._mender = threading.Thread(target=self._mend, name="taproot-mirror-mend", daemon=True)
        self._mender.start()

    def _mend(self) -> None:
        """Start the paths that did not connect, and open on each started
        path the queues it lacks (its open failed or it started late)."""
        while not self._stopping.wait(self.mend_interval_s):
            for i, leg in enumerate(self.legs):
                if self._stopping.is_set():
                    return
                if not self._started[i]:
                    try:
                        leg.start()
                    except errors.TaprootError:
                        continue
                    self._started[i] = True
                    log.info("mirrored session: path %d %s joined", i + 1, self.paths[i])
                for q in list(self._queues):
                    if i not in q._legs and not q._closed:
                        q._open_on(i)

    def _live(self, i: int) -> bool:
        return self._started[i] and not self.legs[i]._core.state.final

    def open_queue(self, uri: str, *, write: bool = True, read: bool = False,
                   timeout_s: float | None = None) -> "MirroredQueue":
        """Open `uri` for writing on every path; returns once every path has
        answered, or `join_grace_s` after the first opened it (the others join
        as they answer). Raises the paths' error if none can open it (a bad
        URI, an unknown domain)."""
        if read or not write:
            raise errors.InvalidArgumentError(
                ResultCode.INVALID_ARGUMENT, "a mirrored session only posts: consume with a Session, whose "
                "host list fails over (a message is pushed once, to one consumer)")
        parsed = parse_queue_uri(uri)
        if isinstance(parsed, str):
            raise errors.InvalidArgumentError(ResultCode.INVALID_ARGUMENT, parsed)
        q = MirroredQueue(self, uri, timeout_s)
        opens = {self._pool.submit(q._open_on, i): i for i in range(len(self.legs)) if self._live(i)}
        pending = set(opens)
        while pending and not q._legs:
            _, pending = wait_for_futures(pending, return_when=FIRST_COMPLETED)
        if pending and q._legs:
            # The others a moment longer: a PUT that goes on one path only
            # may commit after a later PUT that went on both (PUT order).
            wait_for_futures(pending, timeout=self.join_grace_s)
        if not q._legs:
            failures = [f.result() for f in opens]
            first = next((e for e in failures if isinstance(e, errors.RequestError)), None) or next(
                (e for e in failures if e is not None), None)
            raise first or errors.ConnectionError("no path is connected")
        with self._lock:
            self._queues.append(q)
        return q

    def flush(self) -> None:
        for i, leg in enumerate(self.legs):
            if self._live(i):
                leg._flush()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Wait up to `timeout_s` for every PUT's answer, then stop each path
        (a path's PUTs that another path answered are not waited for)."""
        self.flush()
        with self._idle:
            self._idle.wait_for(lambda: self._outstanding == 0, timeout_s)
        self._stopping.set()
        if self._mender is not None:
            self._mender.join(timeout_s)
        stops = [self._pool.submit(leg.stop, 1.0) for i, leg in enumerate(self.legs) if self._started[i]]
        wait_for_futures(stops)
        self._pool.shutdown(wait=False)

    # -- what a MirroredQueue calls ----------------------------------------------------
    def _fan(self, future: "PutFuture | Future[Any]", guid: bytes, count: int) -> _Fan:
        with self._lock:
            self._outstanding += 1
        return _Fan(future, guid, count, self.stats, self._lock, self._answered)

    def _answered(self) -> None:
        with self._idle:
            self._outstanding -= 1
            if self._outstanding == 0:
                self._idle.notify_all()

    def _skip(self, path: int, count: int) -> None:
        with self._lock:
            self.stats.skipped[path] += count


class MirroredQueue:
    """A queue open for writing on every path of a `MirroredSession`."""

    def __init__(self, session: MirroredSession, uri: str, timeout_s: float | None):
        self._session = session
        self.uri = uri
        self._timeout_s = timeout_s
        self._legs: dict[int, Queue] = {}     # path -> its open queue
        self._closed = False
        self._opening: set[int] = set()
        self._lock = threading.Lock()

    def __enter__(self) -> "MirroredQueue":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _open_on(self, path: int) -> BaseException | None:
        with self._lock:
            if path in self._legs or path in self._opening:
                return None
            self._opening.add(path)
        try:
            q = self._session.legs[path].open_queue(self.uri, write=True, timeout_s=self._timeout_s)
        except errors.TaprootError as exc:
            return exc
        finally:
            with self._lock:
                self._opening.discard(path)
        with self._lock:
            if not self._closed:
                self._legs = {**self._legs, path: q}
                return None
        q.close()
        return None

    def _paths(self) -> list[tuple[int, Queue]]:
        if self._closed:
            raise errors.PostError(f"{self.uri} is closed")
        legs = self._legs
        return [(i, q) for i, q in sorted(legs.items()) if self._session._live(i)]

    def post(self, payload: bytes, properties: Mapping[str, PropertyValue] | None = None,
             on_ack: Callable[[PutFuture], None] | None = None, *, compression: str | None = None) -> PutFuture:
        """Send one PUT on every path, with one GUID; the future resolves with
        the first path's ACK (or fails if every path fails it). Waits for room
        only when no path has any."""
        paths = self._paths()
        if not paths:
            raise errors.PostError(f"{self.uri}: no path is up")
        wire_payload, wire_properties, codec = paths[0][1]._wire_put(payload, properties, compression)
        session = self._session
        guid = session._guids.next()
        fan = session._fan(PutFuture(guid, on_ack), guid, 1)

        def offer(path: int, q: Queue, wait: bool) -> Any:
            return q._session._put(q, wire_payload, wire_properties, fan.callback(path), codec, guid, wait=wait)
        self._fan_out(fan, paths, offer)
        return cast(PutFuture, fan.future)

    def post_columns(self, table: Any, compression: str | None = None) -> "Future[list[bytes]]":
        """`Queue.post_columns` on every path, with the same GUIDs; resolves
        with the first path's answer (or fails if every path fails it)."""
        paths = self._paths()
        if not paths:
            raise errors.PostError(f"{self.uri}: no path is up")
        guids, data = paths[0][1]._wire_columns(table)
        fan = self._session._fan(Future(), guids[:GUID_LENGTH], len(guids) // GUID_LENGTH)

        def offer(path: int, q: Queue, wait: bool) -> Any:
            future = q._session._post_columns(q, guids, data, wait=wait)
            if future is not None:
                future.add_done_callback(fan.callback(path))
            return future
        self._fan_out(fan, paths, offer)
        return cast("Future[list[bytes]]", fan.future)

    def _fan_out(self, fan: _Fan, paths: list[tuple[int, Queue]],
                 offer: Callable[[int, Queue, bool], Any]) -> None:
        """Offer the PUT to every path without waiting; if none had room
        (each connected and full), wait for the first one's."""
        full = [(i, q) for i, q in paths if not self._offer(fan, i, partial(offer, i, q, False))]
        if fan.taken == 0 and full:
            i, q = full.pop(0)
            self._offer(fan, i, partial(offer, i, q, True))
        for i, _ in full:
            self._session._skip(i, fan.count)
        fan.seal()

    def _offer(self, fan: _Fan, path: int, send: Callable[[], Any]) -> bool:
        """Offer the PUT to one path: True if it took it or it is out for
        good (skipped), False if it had no room (the caller decides)."""
        try:
            taken = send()
        except errors.TaprootError as exc:   # the path is stopped or lost for good
            log.debug("mirrored session: path %d skipped a PUT: %s", path + 1, exc)
            self._session._skip(path, fan.count)
            return True
        if taken is None:
            return False
        fan.taken += 1
        return True

    def flush(self) -> None:
        self._session.flush()

    def close(self, timeout_s: float | None = None) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            legs = list(self._legs.values())
        for q in legs:
            try:
                q.close(timeout_s)
            except errors.TaprootError as exc:
                log.debug("mirrored session: closing %s on a path: %s", self.uri, exc)
