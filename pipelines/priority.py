"""The pipeline's CPU priority on a shared machine (`[pipeline] cpu_nice`).

Imports: nothing of Taproot's (the start-up path reads it before Spark loads).
"""

from __future__ import annotations

import os
import time
from typing import Callable

AUTOGROUP = "/proc/self/autogroup"


def autogroup_nice(autogroup: str = AUTOGROUP) -> int | None:
    """The nice of this process's autogroup (`/autogroup-123 nice 5`), or None
    where there is none to read: a kernel without autogroups (no file), a
    process still in the kernel's default autogroup (the file reads empty:
    no session above it since init called setsid, as under some CI runners
    and containers; a `setsid` child gets an autogroup of its own), or a
    sandbox whose file is unparsable."""
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
    if leads_autogroup(autogroup):   # else no autogroup of its own to set: the nice is enough
        if (autogroup_nice(autogroup) or 0) < nice:
            set_autogroup_nice(nice, autogroup)
        group_nice = autogroup_nice(autogroup)
        if group_nice is not None:
            done.append(f"session's autogroup nice {group_nice}")
    return "CPU priority: " + ", ".join(done)


def leads_autogroup(autogroup: str = AUTOGROUP) -> bool:
    """True when this process leads its session and the session has an
    autogroup whose nice can be read: the one case where `yield_cpu` sets it,
    and so the one case a `LagGovernor` can give the CPU share back."""
    return os.getsid(0) == os.getpid() and autogroup_nice(autogroup) is not None


def set_autogroup_nice(nice: int, autogroup: str = AUTOGROUP) -> str | None:
    """Set this session's autogroup nice; None when done, else why not. An
    unprivileged process may lower it back to 0 (unlike its own nice), but
    without CAP_SYS_ADMIN the kernel takes one change every 100 ms from all
    processes together (EAGAIN)."""
    try:
        with open(autogroup, "w") as f:
            f.write(str(nice))
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


class LagGovernor:
    """Gives a yielding pipeline its CPU share back while it falls behind
    (`[pipeline] cpu_full_share_lag_s`).

    At `cpu_nice` the pipeline gets what the node and the proxy leave; on a
    machine they saturate, that may be too little for the authority to keep
    up. When the authority lag reaches `lag_s`, the session's autogroup goes
    to nice 0 (an equal share with each other session); once the lag is back
    under half of it, and not sooner than `dwell_s` after the change, it
    returns to `nice`. The process's own nice stays (it cannot be lowered
    without privileges): within the autogroup it only ranks the pipeline's
    own threads against each other.

    Only for a process that leads its session (`leads_autogroup`). Never
    raises: a write the kernel refuses is tried again at the next `observe`."""

    def __init__(self, nice: int, lag_s: float, *, autogroup: str = AUTOGROUP, dwell_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic):
        self.nice, self.lag_s, self.dwell_s = nice, lag_s, dwell_s
        self.autogroup, self.clock = autogroup, clock
        self.full_share = False        # the autogroup at nice 0 now
        self.changes = 0               # times it went to a full share
        self._changed_at = float("-inf")
        self._refused: str | None = None   # why the last change was refused, until one is made

    def observe(self, lag_s: float) -> str | None:
        """Take the current authority lag; returns a line for the log when the
        share changed (or a change was refused), else None."""
        now = self.clock()
        if now - self._changed_at < self.dwell_s:
            return None
        if not self.full_share and lag_s >= self.lag_s:
            target = 0
            why = f"authority lag {lag_s:.1f} s reached {self.lag_s:g} s: the pipeline takes a full CPU share"
        elif self.full_share and lag_s <= self.lag_s / 2:
            target, why = self.nice, f"authority lag {lag_s:.1f} s: the pipeline yields the CPU again"
        else:
            return None
        refused = set_autogroup_nice(target, self.autogroup)
        if refused is not None:     # said once, then retried quietly at each observation
            said, self._refused = self._refused != refused, refused
            return f"{why}, but its autogroup nice stays ({refused})" if said else None
        self._refused = None
        self._changed_at = now
        self.full_share = target == 0
        self.changes += self.full_share
        return f"{why} (autogroup nice {target})"


def lag_governor(nice: int, lag_s: float, autogroup: str = AUTOGROUP) -> LagGovernor | None:
    """The governor for these settings, or None where it has nothing to do:
    no yielding (`nice` 0), no bound (`lag_s` 0), or an autogroup this
    process does not lead."""
    if nice <= 0 or lag_s <= 0 or not leads_autogroup(autogroup):
        return None
    return LagGovernor(nice, lag_s, autogroup=autogroup)
