"""16-byte message GUIDs, made in the SDK.

Layout (big-endian): bytes 0-7 a nanosecond timestamp made strictly increasing
per generator; bytes 8-15 a random 64-bit generator id. Unique across producers
with overwhelming probability, sortable by creation time within a producer,
and cheap (no syscall per GUID beyond reading the clock).
"""

from __future__ import annotations

import os
import struct
import threading
import time
from typing import Callable

GUID_LENGTH = 16
_PACK = struct.Struct(">Q8s")


class GuidGenerator:
    def __init__(self, clock_ns: Callable[[], int] = time.time_ns, node_id: bytes | None = None):
        self._clock_ns = clock_ns
        self._node_id = node_id if node_id is not None else os.urandom(8)
        assert len(self._node_id) == 8, "node id must be 8 bytes"
        self._last = 0
        self._lock = threading.Lock()

    def next(self) -> bytes:
        with self._lock:
            now = self._clock_ns()
            self._last = now if now > self._last else self._last + 1
            return _PACK.pack(self._last & 0xFFFF_FFFF_FFFF_FFFF, self._node_id)


def guid_hex(guid: bytes) -> str:
    return guid.hex().upper()
