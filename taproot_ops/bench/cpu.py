"""CPU time and memory of the cluster's processes: per-message cost, and
whether a process's memory stays flat over a long run.

Reads `/proc` (Linux): the user + system time, and the resident memory, of
each named process and of every process below it (the pipeline's JVM is a
child of its Python process). Elsewhere it reports nothing rather than a
wrong number.
"""

from __future__ import annotations

import os

from protocol.procstat import stat_fields

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


def _trees(roots: dict[str, int], table: dict[int, tuple[int, float]]) -> dict[str, list[int]]:
    """name -> the pids of that process and its descendants."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    trees: dict[str, list[int]] = {}
    for name, root in roots.items():
        if root not in table:
            continue
        pids, stack = [], [root]
        while stack:
            pid = stack.pop()
            pids.append(pid)
            stack.extend(children.get(pid, ()))
        trees[name] = pids
    return trees


def tree_cpu_seconds(roots: dict[str, int]) -> dict[str, float]:
    """name -> CPU seconds of that process and its descendants."""
    table = _table()
    return {name: sum(table[pid][1] for pid in pids) for name, pids in _trees(roots, table).items()}


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def tree_rss_mb(roots: dict[str, int]) -> dict[str, float]:
    """name -> resident memory (MiB) of that process and its descendants."""
    out: dict[str, float] = {}
    for name, pids in _trees(roots, _table()).items():
        total = 0
        for pid in pids:
            try:
                with open(f"/proc/{pid}/statm", "rb") as fh:
                    total += int(fh.read().split()[1]) * _PAGE
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
        out[name] = total / (1 << 20)
    return out


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: after[name] - before[name] for name in after if name in before}
