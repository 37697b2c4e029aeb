"""The C allocator (glibc's malloc) in a process that moves frames of a
megabyte or more: a server (node, proxy), or an application that posts or
consumes many messages a second (`taproot.tune_malloc`, which the bench's
load generator calls).

With glibc's defaults every such frame cost its process page faults. A
block of 128 KiB or more is mapped fresh from the kernel (`mmap`), and its
pages are faulted in and zeroed on first touch; freeing it unmaps them. The
threshold adapts upwards after the first free, but then the freed memory at
the top of the heap is returned to the kernel (`trim`, from 128 KiB) and
the next frame faults it back in. gRPC's receive buffers, protobuf's
arenas, and the `bytes` of a frame's payload column all come from malloc:
a relay that reads a 1 MiB PUT frame, rewrites its header and sends it on
spent about 2 ms of CPU a frame, most of it in the kernel, against 0.25 ms
with the settings below (`python -m taproot_ops.bench.relay_cost --rows
1000`: 4.45 against 0.50 us a message, `docs/benchmarks.md`, 2026-12-06).

So: blocks up to `MMAP_THRESHOLD` come from the heap, and up to
`TRIM_THRESHOLD` of free memory at the top of a heap is kept for the next
frame instead of being given back. The price is memory the process keeps
after a burst: up to `TRIM_THRESHOLD` free at the top of each malloc arena,
and the large blocks freed inside a heap, which glibc reuses but does not
give back (the proxy's resident set sat 50-70 MiB higher at full speed in
the bench, and stayed flat at 147-173 MiB over 5 minutes at 20k msg/s).
And at most `ARENA_MAX` malloc arenas, each of which keeps what was freed
in it (`ARENA_MAX`'s comment). Set through `mallopt(3)` when the process
has started (the node and proxy commands do it first, before any thread:
a thread keeps the arena it took); glibc only.
A process started with glibc's own `MALLOC_MMAP_THRESHOLD_` or
`MALLOC_TRIM_THRESHOLD_` in its environment keeps what it asked for, and
`TAPROOT_MALLOC_TUNING=off` leaves glibc's defaults (`taproot bench
--malloc default` sets it for every process it starts, to compare).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform
from dataclasses import dataclass

log = logging.getLogger(__name__)

# glibc's mallopt parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8

MMAP_THRESHOLD = 32 << 20    # glibc's largest allowed on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD = 64 << 20
# At most this many malloc arenas (glibc's default: eight a core). A
# thread takes an arena of its own on its first malloc while there are
# fewer than the limit, and each arena keeps what was freed in it (up to
# `TRIM_THRESHOLD` at its top, any amount inside). A primary runs a dozen
# threads, and the buffers of its GUID history's builds and lookups
# (`primary.express`, a few MiB each at 20k msg/s) stayed in one arena
# after another: over 4 minutes at 20k msg/s its resident set reached 749
# MiB with glibc's limit and 565 with two arenas, at the same CPU
# (`docs/benchmarks.md`, 2026-12-07, twenty-fourth session).
ARENA_MAX = max(2, os.cpu_count() or 2)
ENVIRONMENT = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
ARENA_ENVIRONMENT = "MALLOC_ARENA_MAX"   # glibc's own: kept when set
SWITCH = "TAPROOT_MALLOC_TUNING"   # off (or 0, false, no): glibc's defaults
_OFF = ("off", "0", "false", "no")
_ON = ("", "on", "1", "true", "yes")


@dataclass(frozen=True)
class MallocTuning:
    """What `tune` did: `applied`, or why not (`reason`); `arenas`, the
    limit it set on malloc's arenas (None: left to glibc or the environment)."""
    applied: bool
    reason: str = ""
    arenas: int | None = None

    def describe(self) -> str:
        if self.applied:
            return (f"malloc: blocks up to {MMAP_THRESHOLD >> 20} MiB from the heap, up to "
                    f"{TRIM_THRESHOLD >> 20} MiB of free heap kept"
                    + (f", at most {self.arenas} arenas" if self.arenas is not None else ""))
        return f"malloc left as it is: {self.reason}"


_done: MallocTuning | None = None


def tune() -> MallocTuning:
    """Set the thresholds above in this process (once; later calls return
    the first call's outcome). Never raises: a C library without
    `mallopt`, or an environment that set its own, leaves malloc alone."""
    global _done
    if _done is None:
        _done = _tune()
        log.debug("%s", _done.describe())
    return _done


def _switch() -> str:
    return os.environ.get(SWITCH, "").strip().lower()


def switched_off() -> bool:
    """`TAPROOT_MALLOC_TUNING` says off."""
    return _switch() in _OFF


def _tune() -> MallocTuning:
    switch = _switch()
    if switch in _OFF:
        return MallocTuning(False, f"{SWITCH}={os.environ[SWITCH]}")
    if switch not in _ON:
        # Not a reason to refuse to start: the tuning is a performance
        # setting, and its default is the safe side.
        log.warning("%s=%r is neither on nor off (%s); tuning malloc as by default", SWITCH,
                    os.environ[SWITCH], "/".join(_ON[1:] + _OFF))
    own = [name for name in ENVIRONMENT if name in os.environ]
    if own:
        return MallocTuning(False, f"the environment sets {', '.join(own)}")
    libc_name, _ = platform.libc_ver()
    if libc_name != "glibc":
        return MallocTuning(False, f"the C library is not glibc ({libc_name or 'unknown'})")
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError) as exc:
        return MallocTuning(False, f"mallopt is not available: {exc}")
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # mallopt returns 1 on success, 0 on error. The mmap threshold first:
    # setting it also ends glibc's dynamic adjustment of both thresholds.
    if mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) != 1:
        return MallocTuning(False, f"mallopt refused an mmap threshold of {MMAP_THRESHOLD}")
    if mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) != 1:
        return MallocTuning(False, f"mallopt refused a trim threshold of {TRIM_THRESHOLD}")
    if ARENA_ENVIRONMENT in os.environ or mallopt(M_ARENA_MAX, ARENA_MAX) != 1:
        return MallocTuning(True)
    return MallocTuning(True, arenas=ARENA_MAX)
