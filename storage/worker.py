"""A daemon thread that does one piece of upkeep each time it is woken.

The primary's table upkeep (compaction and log trimming, checkpoints) runs
this way: the commit thread wakes it and never waits for it. Wakes that come
while it works fold into one more round. `work` catches what it can recover
from; what escapes it is logged and the thread waits for the next wake.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

log = logging.getLogger(__name__)


class WakeThread:
    def __init__(self, name: str, work: Callable[[], None]):
        self.name = name
        self._work = work
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        if not self._thread.is_alive() and not self._stopped.is_set():
            self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def pause(self, seconds: float) -> bool:
        """From `work`: wait `seconds`, or less when `stop` is called; False
        when stopping (the work should return)."""
        return not self._stopped.wait(seconds)

    def stop(self, timeout_s: float = 30) -> None:
        self._stopped.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stopped.is_set():
                return
            try:
                self._work()
            except Exception:
                log.exception("%s: upkeep failed; the next wake tries again", self.name)
