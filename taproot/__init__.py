"""Taproot's Python SDK: producers and consumers with BlazingMQ's semantics.

PUT -> ACK (durable in Delta), PUSH -> CONFIRM, 16-byte GUIDs made here,
at-least-once delivery. See `taproot.session` for the API.

`session.py` is the public API and its thread and gRPC shell; `core.py` is
the session's logic, sans I/O (connection state, retransmission buffer,
batches, requests); `mirror.py` posts each PUT over two or more paths
(`MirroredSession`, RAIS's mirroring). `import taproot` loads neither gRPC nor the session
until a name from it is used.

Imports: protocol.
Never: pyspark, delta, deltalake, pandas.
Pure: batching, core, errors, events.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from protocol import ResultCode
from taproot.batching import BatchPolicy
from taproot.errors import (
    AckError,
    ConnectionError,
    InvalidArgumentError,
    NotAuthorizedError,
    PostError,
    RefusedError,
    RequestError,
    TaprootError,
    TimeoutError,
    UnauthenticatedError,
)

if TYPE_CHECKING:
    from protocol.gc_tuning import GcWatch
    from protocol.malloc_tuning import MallocTuning
    from protocol.tls import ClientTls
    from taproot.mirror import MirroredQueue, MirroredSession
    from taproot.session import Ack, Message, Queue, Session

__all__ = [
    "Session", "Queue", "Message", "Ack", "MirroredSession", "MirroredQueue", "BatchPolicy", "ResultCode",
    "TaprootError", "ConnectionError", "RequestError", "InvalidArgumentError", "RefusedError",
    "TimeoutError", "UnauthenticatedError", "NotAuthorizedError", "PostError", "AckError", "ClientTls", "tune_gc",
    "tune_malloc",
]
_LAZY = {"Session": "taproot.session", "Queue": "taproot.session", "Message": "taproot.session",
         "Ack": "taproot.session", "MirroredSession": "taproot.mirror", "MirroredQueue": "taproot.mirror",
         "ClientTls": "protocol.tls"}


def tune_gc() -> "GcWatch":
    """Tune Python's garbage collector for a process that posts or consumes
    many messages a second (what Taproot's node and proxy do for
    themselves): one full collection, `gc.freeze()` of everything alive
    (modules, sessions, the application's start-up state: never scanned
    again), and collection thresholds that let a message's objects die
    young instead of being rescanned by full collections. Call it once,
    after start-up (the sessions open). It changes the whole interpreter's
    collector, which is why the SDK never does it unasked; reference cycles
    are still collected, later.

    With the interpreter's defaults, a producer posting 30k msg/s one
    `post()` at a time spent about half its CPU in collections, full ones of
    about 100 ms each with every thread stopped (`docs/benchmarks.md`,
    2026-12-04, thirteenth session). Returns a `GcWatch` counting
    collections from now on (`describe()`)."""
    from protocol import gc_tuning

    return gc_tuning.settle_for_serving()


def tune_malloc() -> "MallocTuning":
    """Tune the C allocator (glibc's malloc) for a process that posts or
    consumes frames of a megabyte or more (what Taproot's node and proxy do
    for themselves): such blocks come from the heap instead of fresh pages
    mapped from the kernel, and up to 64 MiB of freed heap is kept for the
    next frame instead of being given back, and the process keeps to one
    malloc arena a core (threads started before the call keep theirs, so
    call it first). With glibc's defaults each
    frame's memory was faulted in and zeroed again: a relay spent about
    2 ms of CPU, most of it the kernel's, per 1 MiB frame, against 0.25 ms tuned
    (`docs/benchmarks.md`, 2026-12-06). It changes the whole process's
    allocator, which is why the SDK never does it unasked; the price is
    memory kept after a burst. glibc only (elsewhere, and where the
    environment sets glibc's `MALLOC_MMAP_THRESHOLD_` or
    `MALLOC_TRIM_THRESHOLD_`, or `TAPROOT_MALLOC_TUNING=off`, it leaves
    malloc alone). Returns what it did (`applied`, `describe()`)."""
    from protocol import malloc_tuning

    return malloc_tuning.tune()


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'taproot' has no attribute {name!r}")
