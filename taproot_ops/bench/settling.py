"""Runs back to back that do not pay for the last run's clean-up.

On ext4 without a journal, the kernel does not hand out an inode freed in
the last half minute or so: a create scans past every recently freed inode
of the group (`recently_deleted` under `find_inode_bit`, `perf record` of
the node). After a bench run's temp dir (thousands of Delta files) was
deleted, a create in the next run cost 0.4-1.1 ms instead of 23-43 us
(measured on this machine's root file system for about 30-45 s after 4,000
deletes), and the node's file reservations took about 57 ms of kernel CPU a
second at a paced 10k msg/s against 3 ms once settled (`/proc`). A run
started right after another one therefore measured the last one's
clean-up too. So a bench that deletes its files says when (`tidy`), and one
that starts on such a file system soon after waits out the rest of
`SETTLE_S` and says so (`settle`). A journaled ext4 reuses inodes at
once (a loop-mounted one on the same disk: 25-33 us a create right after
4,000 deletes), so there, and on any file system but ext4, it never waits.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

SETTLE_S = 45.0   # creates were back to 23-43 us 45 s after the deletes (30 s: still 1.1 ms)
TIDY_MIN_FILES = 1000   # the measured case deleted 4,000; a 25 s paced run leaves more than that
MARK = Path(tempfile.gettempdir()) / "taproot-bench-tidied"   # its mtime: the last tidy's end


def slow_creates_after_deletes(path: str, sys_root: str = "/sys", proc_root: str = "/proc") -> bool:
    """Whether `path` is on ext4 without a journal: an ext4 device in
    `/proc/fs/ext4` with no journal of its own in `/proc/fs/jbd2`."""
    try:
        st = os.stat(path)
        uevent = Path(sys_root, "dev", "block", f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}", "uevent").read_text()
    except OSError:
        return False
    fields = dict(line.split("=", 1) for line in uevent.splitlines() if "=" in line)
    device = fields.get("DEVNAME")
    if not device or not os.path.isdir(os.path.join(proc_root, "fs", "ext4", device)):
        return False
    try:
        journals = os.listdir(os.path.join(proc_root, "fs", "jbd2"))
    except OSError:
        journals = []
    return not any(j.startswith(device + "-") for j in journals)


def tidy(work: Path) -> None:
    """Delete a run's temp dir and, if it held `TIDY_MIN_FILES` or more,
    note when (`settle` reads it): a short run's few hundred files, or a
    run whose tables were in a `--data-dir` of the user's, leave nothing to
    wait for."""
    files = sum(len(names) for _, _, names in os.walk(work))
    shutil.rmtree(work, ignore_errors=True)
    if files >= TIDY_MIN_FILES:
        try:
            MARK.touch()
        except OSError:
            pass


def settle(path: str, now: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
           say: Callable[[str], None] = lambda text: print(text, flush=True)) -> float:
    """Before a run whose files go under `path`: on a file system where
    creates are slow after deletes, wait until `SETTLE_S` has passed since
    the last `tidy`. Returns the seconds waited."""
    try:
        since = now() - MARK.stat().st_mtime
    except OSError:
        return 0.0
    wait = SETTLE_S - since
    if wait <= 0 or not slow_creates_after_deletes(path):
        return 0.0
    say(f"waiting {wait:.0f} s: the last bench run deleted its files {max(0.0, since):.0f} s ago, and on this "
        f"file system (ext4 without a journal) a file's creation takes 0.4-1.1 ms instead of 23-43 us for "
        f"about {SETTLE_S:.0f} s after many deletes (taproot_ops/bench/settling.py)")
    sleep(wait)
    return wait
