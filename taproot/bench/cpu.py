"""CPU time of the cluster's processes, for per-message cost.

Reads `/proc` (Linux): the user + system time of each named process and of
every process below it (the pipeline's JVM is a child of its Python
process). Elsewhere it reports nothing rather than a wrong number.
"""

from __future__ import annotations

import os

from taproot.procstat import stat_fields

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _table() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU seconds so far) for every live process."""
    out: dict[int, tuple[int, float]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for entry in entries:
        if not entry.isdigit():
            continue
        fields = stat_fields(int(entry))
        if fields is None:
            continue  # gone meanwhile
        out[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICKS)
    return out


def tree_cpu_seconds(roots: dict[str, int]) -> dict[str, float]:
    """name -> CPU seconds of that process and its descendants."""
    table = _table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    totals: dict[str, float] = {}
    for name, root in roots.items():
        if root not in table:
            continue
        total, stack = 0.0, [root]
        while stack:
            pid = stack.pop()
            total += table[pid][1]
            stack.extend(children.get(pid, ()))
        totals[name] = total
    return totals


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: after[name] - before[name] for name in after if name in before}
