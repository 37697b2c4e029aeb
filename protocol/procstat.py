"""`/proc/<pid>/stat` on Linux: one parser for the node's liveness check and
the benchmark's CPU accounting."""

from __future__ import annotations


def stat_fields(pid: int) -> list[str] | None:
    """The fields after "pid (comm) ": [0] state, [1] parent pid, [11] utime
    and [12] stime in clock ticks. None if there is no such process (or no
    /proc). The command name may hold spaces and parentheses, so the split is
    at its last ")"."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode(errors="replace")
    except OSError:
        return None
    end = stat.rfind(")")
    return stat[end + 2:].split() if end >= 0 else None
