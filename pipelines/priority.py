"""The pipeline's CPU priority on a shared machine (`[pipeline] cpu_nice`).

Imports: nothing of Taproot's (the start-up path reads it before Spark loads).
"""

from __future__ import annotations

import os

AUTOGROUP = "/proc/self/autogroup"


def autogroup_nice(autogroup: str = AUTOGROUP) -> int | None:
    """The nice of this process's autogroup (`/autogroup-123 nice 5`), or None
    where there is none to read: a kernel without autogroups, or a sandbox
    (gVisor, some containers) whose file is missing, empty or unparsable."""
    try:
        with open(autogroup) as f:
            return int(f.read().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def yield_cpu(nice: int, autogroup: str = AUTOGROUP) -> str:
    """Lower this process's CPU priority to `nice` (`[pipeline] cpu_nice`)
    before Spark starts: the JVM it launches inherits it. Returns what was
    done, for the log. Never raises: a priority that cannot be lowered
    leaves the pipeline running as it was.

    With Linux autogroups, the scheduler first shares the CPU between
    sessions and only then between a session's processes by their nice, so
    the nice alone would not rank the pipeline below a node started in a
    session of its own. The autogroup's nice is set too, but only when this
    process leads its session (the embedded launcher starts every role so):
    otherwise the autogroup is the user's shell's, and lowering it would
    slow everything the user runs there. Under spark-submit the driver's
    JVM started this process, not the other way round: it keeps its own
    priority (give spark-submit a `nice` of its own)."""
    if nice <= 0:
        return "CPU priority unchanged (cpu_nice = 0)"
    done = []
    try:
        current = os.nice(0)
        if current < nice:
            os.nice(nice - current)
        done.append(f"nice {os.nice(0)}")
    except OSError as exc:
        done.append(f"nice unchanged ({exc.strerror})")
    if os.getsid(0) == os.getpid():
        group_nice = autogroup_nice(autogroup)
        if group_nice is not None:   # else no autogroups to set: the nice is enough
            if group_nice < nice:
                try:
                    with open(autogroup, "w") as f:
                        f.write(str(nice))
                except OSError:
                    pass
            group_nice = autogroup_nice(autogroup)
            if group_nice is not None:
                done.append(f"session's autogroup nice {group_nice}")
    return "CPU priority: " + ", ".join(done)
