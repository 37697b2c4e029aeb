"""Kernel names for a server's threads.

Python before 3.14 leaves every thread it starts with the process's kernel
name (`python`), so `top -H`, `ps -L`, `perf` and `/proc/PID/task/*/comm`
cannot tell a node's PUT commit thread from its compactor or its gRPC loop,
and a per-thread look at a busy node starts with guesswork. `install` makes
every thread started afterwards give the kernel its Python name
(`commit-puts-0`, `compact-puts-0`, `checkpoint-puts`, `grpc-loop`, ...),
cut to the kernel's 15 bytes, as Python 3.14 does by itself. The node and
proxy commands call it first, with the allocator's tuning, before they start
a thread. Threads already running keep their names, and so does the main
thread (renaming it would rename the process for `ps` and `pkill`).

Linux only (`prctl(PR_SET_NAME)`); elsewhere `install` does nothing and
says so. A name the kernel refuses leaves the thread as it was.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
import threading
from typing import Any, Callable

PR_SET_NAME = 15     # linux/prctl.h
NAME_BYTES = 15      # TASK_COMM_LEN less its terminating NUL

_prctl: Callable[..., int] | None = None


def kernel_name(name: str) -> bytes:
    """`name` as the kernel keeps it: UTF-8, at most `NAME_BYTES` bytes, not
    cut inside a character."""
    raw = name.encode("utf-8", "replace")[:NAME_BYTES]
    return raw.decode("utf-8", "ignore").encode("utf-8")


def _libc_prctl() -> Callable[..., int] | None:
    global _prctl
    if _prctl is None and sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
            _prctl = libc.prctl
        except (OSError, AttributeError):
            return None
    return _prctl


def name_current_thread(name: str) -> bool:
    """Give the calling thread the kernel name `name` (cut to fit). True if
    the kernel took it."""
    prctl = _libc_prctl()
    if prctl is None:
        return False
    return prctl(PR_SET_NAME, ctypes.c_char_p(kernel_name(name)), 0, 0, 0) == 0


def install() -> bool:
    """From now on every `threading.Thread` names itself to the kernel when
    it starts. Safe to call twice. False where the kernel's thread names
    cannot be set (not Linux)."""
    if _libc_prctl() is None:
        return False
    run = threading.Thread.run
    if getattr(run, "_taproot_names", False):
        return True

    def named_run(self: threading.Thread, *args: Any, **kwargs: Any) -> None:
        name_current_thread(self.name)
        run(self, *args, **kwargs)

    named_run._taproot_names = True  # type: ignore[attr-defined]
    threading.Thread.run = named_run  # type: ignore[method-assign]
    return True
