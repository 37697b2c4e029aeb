"""Queue and domain quotas: messages accepted and not yet done.

A message counts against its queue's and its domain's limits from the moment
its PUT is accepted until it is done: confirmed by every app it goes to,
auto-confirmed by every app's subscription, dead-lettered, or expired. A PUT
that would go past a limit is refused with LIMIT_MESSAGES or LIMIT_BYTES (the
producer's future reports it) and accepted again once confirms make room.

Bytes are payload bytes as stored (after SDK compression). A retransmitted PUT
(same GUID) counts once: the pipeline delivers it once. GUIDs that finished
within the dedup history window are remembered, so a late retransmission the
pipeline will drop as a duplicate is not counted either.

Watermark alarms: when a queue or domain crosses `watermark_percent` of a
limit, a warning names it; another when it falls back below.

Only domains with a limit are tracked (tracking costs a dictionary entry per
outstanding message). Thread safe: one lock per domain.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

from conf import DomainConfig
from protocol import ResultCode

log = logging.getLogger(__name__)


@dataclass
class _Level:
    """A message/byte count against limits, with alarm state."""
    name: str
    messages: int = 0
    bytes: int = 0
    alarmed: set[str] = field(default_factory=set)

    def check_alarm(self, kind: str, value: int, limit: int, percent: int) -> None:
        if not limit:
            return
        high = value * 100 >= limit * percent
        if high and kind not in self.alarmed:
            self.alarmed.add(kind)
            log.warning("ALARM %s: %d %s of a limit of %d (watermark %d%%)", self.name, value, kind, limit, percent)
        elif not high and kind in self.alarmed:
            self.alarmed.discard(kind)
            log.warning("ALARM cleared %s: %d %s of a limit of %d", self.name, value, kind, limit)


class DomainQuota:
    """The limits of one domain and of each of its queues."""

    def __init__(self, domain: DomainConfig, clock: Callable[[], float] = time.monotonic):
        self.domain = domain
        self._clock = clock
        self._lock = threading.Lock()
        self._total = _Level(f"domain {domain.name}")
        self._queues: dict[str, _Level] = {}
        # guid -> [queue, size, apps still to finish (None until delivered)]
        self._outstanding: dict[bytes, list[Any]] = {}
        self._recently_done: OrderedDict[bytes, float] = OrderedDict()

    # -- inspection ----------------------------------------------------------
    def usage(self, queue: str | None = None) -> tuple[int, int]:
        with self._lock:
            level = self._total if queue is None else self._queues.get(queue, _Level(""))
            return level.messages, level.bytes

    # -- events ----------------------------------------------------------------
    def admit(self, queue: str, guid: bytes, size: int) -> tuple[ResultCode, str] | None:
        """Count a PUT, or return why it is refused."""
        d = self.domain
        with self._lock:
            if guid in self._outstanding or guid in self._recently_done:
                return None  # a retransmission: the pipeline delivers it once
            level = self._queues.get(queue)
            if level is None:
                level = self._queues[queue] = _Level(f"queue taproot://{d.name}/{queue}")
            for lvl, max_messages, max_bytes, what in (
                    (level, d.queue_max_messages, d.queue_max_bytes, "queue"),
                    (self._total, d.domain_max_messages, d.domain_max_bytes, "domain")):
                if max_messages and lvl.messages + 1 > max_messages:
                    return ResultCode.LIMIT_MESSAGES, (f"{what} is full: {lvl.messages} messages "
                                                       f"of {max_messages} ({what}_max_messages)")
                if max_bytes and lvl.bytes + size > max_bytes:
                    return ResultCode.LIMIT_BYTES, (f"{what} is full: {lvl.bytes} + {size} bytes "
                                                    f"would exceed {max_bytes} ({what}_max_bytes)")
            self._outstanding[guid] = [queue, size, None]
            self._change(level, 1, size)
        return None

    def unadmit(self, guid: bytes) -> None:
        """The PUT was not persisted after all (its commit failed)."""
        with self._lock:
            entry = self._outstanding.pop(guid, None)
            if entry is not None:
                self._change(self._queues[entry[0]], -1, -entry[1])

    def delivered(self, queue: str, guid: bytes, size: int, apps: set[str]) -> None:
        """It was routed to `apps` (those still to confirm), by the express
        lane or from the delivery log. Also used on recovery, where the PUT
        was admitted by an earlier process."""
        with self._lock:
            entry = self._outstanding.get(guid)
            if entry is None:
                if guid in self._recently_done or not apps:
                    return
                level = self._queues.get(queue)
                if level is None:
                    level = self._queues[queue] = _Level(f"queue taproot://{self.domain.name}/{queue}")
                entry = self._outstanding[guid] = [queue, size, None]
                self._change(level, 1, size)
            # The express lane and then the pipeline (for apps it kept that
            # the express lane did not) may each deliver to some apps.
            entry[2] = set(apps) if entry[2] is None else entry[2] | set(apps)
            if not entry[2]:
                self._finish(guid)

    def app_done(self, guid: bytes, app: str) -> None:
        """Confirmed, dead-lettered or expired for `app`."""
        with self._lock:
            entry = self._outstanding.get(guid)
            if entry is None or entry[2] is None:
                return
            entry[2].discard(app)
            if not entry[2]:
                self._finish(guid)

    # -- internals -------------------------------------------------------------
    def _finish(self, guid: bytes) -> None:
        queue, size, _ = self._outstanding.pop(guid)
        self._change(self._queues[queue], -1, -size)
        now = self._clock()
        self._recently_done[guid] = now
        horizon = now - self.domain.dedup_history_window_ms / 1000
        while self._recently_done:
            oldest, when = next(iter(self._recently_done.items()))
            if when >= horizon:
                break
            del self._recently_done[oldest]

    def _change(self, level: _Level, messages: int, nbytes: int) -> None:
        d = self.domain
        for lvl, max_messages, max_bytes in ((level, d.queue_max_messages, d.queue_max_bytes),
                                             (self._total, d.domain_max_messages, d.domain_max_bytes)):
            lvl.messages += messages
            lvl.bytes += nbytes
            lvl.check_alarm("messages", lvl.messages, max_messages, d.watermark_percent)
            lvl.check_alarm("bytes", lvl.bytes, max_bytes, d.watermark_percent)
